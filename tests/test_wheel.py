"""The wheel: what a user installs holds the runtime package and its metadata, and
nothing of the tests, benchmarks or the tools that generate committed files. The sdist:
the project's source, everything its tests read included. The backend builds both
without a deprecation warning."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import weightstore

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[str]:
    """The project's tracked files (a clone's, or the tree less what builds leave)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if p.is_file() and not {".venv", ".git", "build", "__pycache__"}
                  & set(p.relative_to(ROOT).parts)]
    return [name for name in listed if name and (ROOT / name).is_file()]


def _sources(dest: Path) -> Path:
    """A copy of the tracked files."""
    for name in _tracked():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _build(kind: str, src: Path, out: Path) -> Path:
    """Build a ``wheel`` or an ``sdist`` of ``src`` into ``out`` with the project's backend,
    which must warn of nothing deprecated (setuptools gives a deadline, then stops
    building what it deprecated)."""
    code = f"import sys, setuptools.build_meta as b; print(b.build_{kind}(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in (done.stdout + done.stderr).splitlines()
              if "deprecat" in line.lower()]
    assert not warned, warned
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sources(tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module")
def wheel(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("wheel", sources, tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_only_the_runtime_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    info = f"weightstore-{weightstore.__version__}.dist-info/"
    assert all(n.startswith(("weightstore/", info)) for n in names), names
    assert "weightstore/py.typed" in names and "weightstore/cli.py" in names
    assert "weightstore/_proto/descriptor.py" in names  # the committed descriptor ships
    for generator in ("samples.py", "generate.py", "generate_proto.py", "conftest.py"):
        assert not [n for n in names if n.endswith("/" + generator)], generator
    assert f"{info}licenses/LICENSE" in names or f"{info}LICENSE" in names


def test_the_wheel_metadata_names_the_project(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(
            z.read(f"weightstore-{weightstore.__version__}.dist-info/METADATA"))
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(urls)
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    # the licence as PEP 639 has it: an SPDX expression and the file, no classifier
    assert (meta["License-Expression"], meta.get_all("License-File")) == ("Apache-2.0",
                                                                          ["LICENSE"])
    assert meta["License"] is None
    assert not any(c.startswith("License :: ") for c in classifiers)
    assert any(c.startswith("Programming Language :: Python :: 3.10") for c in classifiers)
    assert set(meta.get_all("Provides-Extra")) >= {"runtime", "test", "dev", "docs"}
    requires = meta.get_all("Requires-Dist")
    dev_only = [r for r in requires if r.startswith(("ruff", "grpcio-tools"))]
    assert dev_only and all('extra == "dev"' in r for r in dev_only)
    assert not [r for r in requires if r.startswith("pytest") and "extra" not in r]


def test_the_sdist_holds_the_whole_source(tmp_path: Path) -> None:
    """Every tracked file (tests' conftest, helpers and data, examples, recipes, docs,
    schemas, benchmarks, tools), so that the suite runs from the unpacked sdist; and
    nothing a test run or a benchmark leaves in a tree."""
    sources = _sources(tmp_path / "src")
    for junk in ("tests/__pycache__/conftest.cpython-311.pyc", "bench/out/figures.json"):
        (sources / junk).parent.mkdir(parents=True, exist_ok=True)
        (sources / junk).write_bytes(b"{}")
    sdist = _build("sdist", sources, tmp_path)
    top = f"weightstore-{weightstore.__version__}/"
    with tarfile.open(sdist) as tar:
        names = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    missing = set(_tracked()) - {".gitignore"} - names
    assert not missing, sorted(missing)
    assert not [n for n in names if "__pycache__" in n or n.startswith("bench/out/")]
    for needed in ("tests/conftest.py", "tests/helpers.py", "tests/data/format1-store/meta.json",
                   "examples/tiny_bert/model.onnx", "recipes/tiny-bert.yaml",
                   "docs/reference/formats/index.md", "mkdocs.yml", "LICENSE", "PKG-INFO"):
        assert needed in names, needed
