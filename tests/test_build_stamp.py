"""Build stamps: an unchanged recipe is found up to date without parsing it, and a stamp
never hides a change the full check would see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.caches import build_stamp
from weightstore.errors import PackageError
from weightstore.store.location import user_cache_dir

from .samples import make_encoder

RECIPE = """\
package: pkg
version: "1.0.0"
store: {{path: store, hash: blake3}}
models:
  - {{name: encoder, source: {source}}}
layouts:
  - {{name: combined, external_weight: combined}}
  - {{name: separate, external_weight: separate}}
output: out
"""

HEAVY = ("numpy", "onnx", "pydantic", "yaml", "google.protobuf")
# an up-to-date check writes nothing and hashes nothing it has a digest of: no thread pool,
# no temp files, no other command's parsers
IDLE = ("concurrent.futures", "tempfile", "weightstore.release.commands",
        "weightstore.resolve.commands", "weightstore.registry.commands")


def _recipe(folder: Path, source: str = "encoder.onnx") -> Path:
    path = folder / "recipe.yaml"
    path.write_text(RECIPE.format(source=source))
    return path


@pytest.fixture
def project(tmp_path: Path, encoder_model: onnx.ModelProto) -> Path:
    onnx.save(encoder_model, tmp_path / "encoder.onnx")
    recipe = _recipe(tmp_path)
    assert [p.status for p in build(recipe).packages] == ["built", "built"]
    return recipe


def _stamps() -> list[Path]:
    return sorted((user_cache_dir() / build_stamp.FOLDER).glob("*.json"))


def test_up_to_date_build_imports_no_heavy_module(project: Path) -> None:
    code = ("import sys, io, contextlib\n"
            "from weightstore.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    assert main(['build', {str(project)!r}, '--json']) == 0\n"
            "print(out.getvalue())\n"
            f"print(sorted(m for m in {HEAVY + IDLE!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=os.environ.copy())
    *report, loaded = done.stdout.strip().splitlines()
    assert [p["status"] for p in json.loads("\n".join(report))["packages"]] == [
        "up-to-date", "up-to-date"]
    assert loaded == "[]"


def test_stamp_gives_the_full_checks_answer(project: Path) -> None:
    assert len(_stamps()) == 1
    stamped = build(project)
    for stamp in _stamps():
        stamp.unlink()
    full = build(project)
    assert [(p.layout, p.path, p.status, p.summary) for p in stamped.packages] == [
        (p.layout, p.path, p.status, p.summary) for p in full.packages]
    assert stamped.store == full.store


def test_changed_source_is_not_up_to_date(project: Path) -> None:
    onnx.save(make_encoder(seed=5), project.parent / "encoder.onnx")
    with pytest.raises(PackageError, match="different build"):
        build(project)


def test_retargeted_symlink_is_not_up_to_date(tmp_path: Path,
                                              encoder_model: onnx.ModelProto) -> None:
    onnx.save(encoder_model, tmp_path / "a.onnx")
    onnx.save(make_encoder(seed=5), tmp_path / "b.onnx")
    (tmp_path / "link.onnx").symlink_to("a.onnx")
    recipe = _recipe(tmp_path, "link.onnx")
    build(recipe)
    (tmp_path / "link.onnx").unlink()
    (tmp_path / "link.onnx").symlink_to("b.onnx")
    with pytest.raises(PackageError, match="different build"):
        build(recipe)


def test_changed_external_data_is_not_up_to_date(tmp_path: Path,
                                                 encoder_model: onnx.ModelProto) -> None:
    onnx.save(encoder_model, tmp_path / "encoder.onnx", save_as_external_data=True,
              location="encoder.data", size_threshold=1024)
    recipe = _recipe(tmp_path)
    build(recipe)
    data = tmp_path / "encoder.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(PackageError, match="different build"):
        build(recipe)


def test_damaged_package_is_not_up_to_date(project: Path) -> None:
    weights = next((project.parent / "out/pkg/1.0.0/combined").glob("*_weight_combined"))
    with open(weights, "ab") as f:
        f.write(b"\0")
    with pytest.raises(PackageError, match="damaged package"):
        build(project)


def test_forged_stamp_is_not_trusted(project: Path) -> None:
    """A stamp edited to vouch for changed sources fails its MAC; the full check runs."""
    source = project.parent / "encoder.onnx"
    onnx.save(make_encoder(seed=5), source)
    (stamp,) = _stamps()
    doc = json.loads(stamp.read_text())
    from weightstore.io.digests import digest_file, make_key
    from weightstore.package.fingerprint import FINGERPRINT_ALGO

    doc["sources"][str(source)]["digest"] = make_key(
        FINGERPRINT_ALGO, digest_file(FINGERPRINT_ALGO, source))
    stamp.write_text(json.dumps(doc))
    with pytest.raises(PackageError, match="different build"):
        build(project)


def test_force_and_selection_bypass_or_key_the_stamp(project: Path) -> None:
    assert [p.status for p in build(project, BuildOptions(force=True)).packages] == [
        "built", "built"]
    only = build(project, BuildOptions(layouts=("separate",)))
    assert [(p.layout, p.status) for p in only.packages] == [("separate", "up-to-date")]
    assert len(_stamps()) == 2  # one per invocation: whole recipe, one layout


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "not-an-object"])
def test_damaged_stamp_is_ignored(project: Path, damage: str) -> None:
    (stamp,) = _stamps()
    text = stamp.read_text()
    stamp.write_text({"garbage": "\x00{]", "truncated": text[: len(text) // 2],
                      "empty": "", "not-an-object": "[1, 2]"}[damage])
    assert [p.status for p in build(project).packages] == ["up-to-date", "up-to-date"]
    assert len(_stamps()) == 1 and json.loads(_stamps()[0].read_text())["mac"]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stamp_of_another_selection_copied_over_is_not_trusted(project: Path) -> None:
    """Each invocation's stamp names its invocation under the MAC: the stamp of
    ``--layout separate`` moved under the whole recipe's name (a sound stamp, signed by
    this user) proves nothing, and the missing layout is built, not skipped."""
    out = project.parent / "out"
    clean = _tree(out)
    (whole,) = _stamps()
    build(project, BuildOptions(layouts=("separate",)))
    (selected,) = [s for s in _stamps() if s != whole]
    selected.replace(whole)
    shutil.rmtree(out / "pkg" / "1.0.0" / "combined")
    assert [(p.layout, p.status) for p in build(project).packages] == [
        ("combined", "built"), ("separate", "up-to-date")]
    assert _tree(out) == clean


def test_a_stamp_of_one_model_copied_over_ships_no_partial_package(
        tmp_path: Path, encoder_model: onnx.ModelProto) -> None:
    """A two-model recipe: the stamp of ``--model encoder`` (its package holds one model)
    copied over the whole recipe's stamp, the output removed: the next build writes both
    models, byte-identical to a clean build, instead of materializing the one-model
    package the swapped stamp names."""
    onnx.save(encoder_model, tmp_path / "encoder.onnx")
    onnx.save(encoder_model, tmp_path / "twin.onnx")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(source="encoder.onnx").replace(
        "layouts:", "  - {name: twin, source: twin.onnx}\nlayouts:"))
    out = tmp_path / "out"
    build(recipe)
    clean = _tree(out)
    (whole,) = _stamps()
    shutil.rmtree(out)
    build(recipe, BuildOptions(models=("encoder",)))
    (selected,) = [s for s in _stamps() if s != whole]
    build(recipe, BuildOptions(force=True))
    selected.replace(whole)
    shutil.rmtree(out)
    result = build(recipe)
    assert [[m["name"] for m in p.summary["models"]] for p in result.packages] == [
        ["encoder", "twin"]] * 2
    assert _tree(out) == clean
