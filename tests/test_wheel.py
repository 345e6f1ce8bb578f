"""The wheel: what a user installs holds the runtime package and its metadata, and
nothing of the tests, benchmarks or the tools that generate committed files."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import weightstore

ROOT = Path(__file__).resolve().parents[1]


def _sources(dest: Path) -> Path:
    """The project's tracked files (a clone's, or the tree less what builds leave)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if p.is_file() and not {".venv", ".git", "build", "__pycache__"}
                  & set(p.relative_to(ROOT).parts)]
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = _sources(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    code = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


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
    assert any(c.startswith("License :: ") for c in classifiers)
    assert any(c.startswith("Programming Language :: Python :: 3.10") for c in classifiers)
    assert set(meta.get_all("Provides-Extra")) >= {"runtime", "test", "dev"}
    requires = meta.get_all("Requires-Dist")
    dev_only = [r for r in requires if r.startswith(("ruff", "grpcio-tools"))]
    assert dev_only and all('extra == "dev"' in r for r in dev_only)
    assert not [r for r in requires if r.startswith("pytest") and "extra" not in r]
