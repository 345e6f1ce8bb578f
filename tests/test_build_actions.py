"""Action records: a missing package whose build the store already holds is materialized
from the store, byte-identical to a real build, and anything doubtful falls back to one."""

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
from weightstore.caches import build_actions, build_stamp
from weightstore.packaging import write as packaging
from weightstore.store import WeightStore
from weightstore.store.location import user_cache_dir

from .samples import make_encoder
from .test_build import tree, write_recipe

LAYOUTS = """
  - {name: separate, external_weight: separate, size_threshold: 1024}
  - {name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}
"""
HEAVY = ("numpy", "onnx", "pydantic", "yaml", "google.protobuf")


@pytest.fixture
def project(tmp_path: Path, encoder_model: onnx.ModelProto) -> Path:
    """A recipe built once (its packages kept as ``expected/``), then its output removed."""
    onnx.save(encoder_model, tmp_path / "encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": tmp_path / "encoder.onnx"}, LAYOUTS)
    assert [p.status for p in build(recipe).packages] == ["built", "built"]
    shutil.copytree(tmp_path / "out", tmp_path / "expected")
    shutil.rmtree(tmp_path / "out")
    return recipe


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The layouts the package writer converts (the real writer runs)."""
    seen: list[str] = []
    real = packaging.write_package

    def counting(recipe, layout, *args, **kwargs):
        seen.append(layout.name)
        return real(recipe, layout, *args, **kwargs)

    monkeypatch.setattr(packaging, "write_package", counting)
    return seen


def _records(store: Path) -> list[Path]:
    return sorted((store / build_actions.FOLDER).glob("*.json"))


def _store(recipe: Path) -> Path:
    return Path(os.environ["WEIGHTSTORE_DIR"])  # the recipe names no store


def test_warm_build_materializes_the_cold_build(project: Path,
                                               conversions: list[str]) -> None:
    result = build(project)
    assert [(p.layout, p.status) for p in result.packages] == [("separate", "built"),
                                                               ("combined", "built")]
    assert conversions == []
    assert tree(project.parent / "out") == tree(project.parent / "expected")
    assert result.store_report["written_objects"] == 0
    assert result.store_report["reused_objects"] > 0
    assert not [p for p in (project.parent / "out/pkg/1.0.0").iterdir()
                if p.name.startswith(".")]  # no temp folder left
    roots = WeightStore(_store(project)).roots()
    assert sorted(r.layout for r in roots if r.live) == ["combined", "separate"]
    assert [p.status for p in build(project).packages] == ["up-to-date", "up-to-date"]


def test_warm_build_imports_neither_onnx_numpy_nor_pydantic(project: Path) -> None:
    code = ("import sys, io, contextlib, json\n"
            "from weightstore.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    assert main(['build', {str(project)!r}, '--json']) == 0\n"
            "print(json.dumps([p['status'] for p in json.loads(out.getvalue())['packages']]))\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, check=True, env=os.environ.copy())
    statuses, loaded = done.stdout.strip().splitlines()[-2:]
    assert json.loads(statuses) == ["built", "built"]
    assert json.loads(loaded) == []
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert imported and not {m for m in imported if m.split(".")[0] in
                             ("onnx", "numpy", "pydantic", "yaml")}
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_without_a_stamp_the_record_still_spares_the_conversion(
        project: Path, conversions: list[str]) -> None:
    """A recipe moved to another checkout has no stamp: it is parsed, and the missing
    folder still comes from the store."""
    shutil.rmtree(user_cache_dir() / build_stamp.FOLDER)
    assert [p.status for p in build(project).packages] == ["built", "built"]
    assert conversions == []
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_split_layouts_with_devices_are_materialized_byte_for_byte(
        tmp_path: Path, conversions: list[str]) -> None:
    from .test_split import _write

    recipe = _write(tmp_path, make_encoder())
    build(recipe, BuildOptions(jobs=2))
    expected = tree(tmp_path / "out")
    assert any("/devices/" in name for name in expected)
    conversions.clear()
    shutil.rmtree(tmp_path / "out")
    assert {p.status for p in build(recipe, BuildOptions(jobs=2)).packages} == {"built"}
    assert conversions == []
    assert tree(tmp_path / "out") == expected


@pytest.mark.parametrize("damage", ["edited", "swapped", "garbage", "truncated",
                                    "foreign-mac", "no-mac"])
def test_a_doubtful_record_falls_back_to_a_real_build(project: Path, conversions: list[str],
                                                      damage: str) -> None:
    records = _records(_store(project))
    assert len(records) == 2
    first, second = records
    text = first.read_text()
    doc = json.loads(text)
    if damage == "edited":  # every piece given the next one's key, MAC kept
        pieces = [p for f in doc["files"] for p in f["pieces"]]
        keys = [p["key"] for p in pieces]
        for p, key in zip(pieces, keys[1:] + keys[:1], strict=True):
            p["key"] = key
        first.write_text(json.dumps(doc))
    elif damage == "swapped":
        other = second.read_text()
        second.write_text(text)
        first.write_text(other)
    elif damage == "garbage":
        first.write_bytes(b"\x00{]" * 10)
    elif damage == "truncated":
        first.write_text(text[: len(text) // 2])
    elif damage == "foreign-mac":
        doc["mac"] = "ab" * 32
        first.write_text(json.dumps(doc))
    else:
        del doc["mac"]
        first.write_text(json.dumps(doc))
    build(project)
    assert len(conversions) == (2 if damage == "swapped" else 1)
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_record_over_the_bound_falls_back_to_a_real_build(
        project: Path, conversions: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A sound record larger than ``RECORD_LIMIT`` is a miss, refused before it is read."""
    first, second = _records(_store(project))
    monkeypatch.setattr("weightstore.io.files.RECORD_LIMIT",
                        (first.stat().st_size + second.stat().st_size) // 2)
    build(project)
    assert len(conversions) == 1  # the larger record's layout, converted again
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_missing_store_object_falls_back_to_a_real_build(project: Path,
                                                           conversions: list[str]) -> None:
    store = WeightStore(_store(project))
    plan = store.plan_gc()  # the packages are gone: their roots are dead
    assert plan.garbage
    plan.execute(store)
    assert [p.status for p in build(project).packages] == ["built", "built"]
    assert conversions == ["separate", "combined"]
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_deleted_or_damaged_object_file_falls_back(project: Path,
                                                     conversions: list[str]) -> None:
    store = WeightStore(_store(project))
    summary = json.loads((project.parent / "expected/pkg/1.0.0/separate/summary.json")
                         .read_text())
    model = next(c["digest"] for c in summary["contents"] if c["path"] == "encoder.onnx")
    store.path_of(store.lookup(model)).unlink()  # the model file's object: gone
    combined = next(o for o in store.objects() if o.kind == "combined")
    path = store.path_of(combined)
    data = bytearray(path.read_bytes())
    data[combined.offset] ^= 0xFF  # a weight's bytes: damaged in place, same size
    path.write_bytes(bytes(data))
    build(project)
    assert sorted(conversions) == ["combined", "separate"]
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_changed_source_is_built_for_real(project: Path, conversions: list[str],
                                           tmp_path: Path) -> None:
    onnx.save(make_encoder(seed=5), project.parent / "encoder.onnx")
    build(project)
    assert conversions == ["separate", "combined"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(project.parent / "encoder.onnx", fresh / "encoder.onnx")
    build(write_recipe(fresh, {"encoder": fresh / "encoder.onnx"}, LAYOUTS),
          BuildOptions(store=str(fresh / "store")))
    assert tree(project.parent / "out") == tree(fresh / "out")


def test_force_still_converts(project: Path, conversions: list[str]) -> None:
    build(project, BuildOptions(force=True))
    assert conversions == ["separate", "combined"]
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_different_build_in_the_folder_is_still_refused(project: Path) -> None:
    from weightstore.errors import PackageError

    shutil.copytree(project.parent / "expected", project.parent / "out")
    onnx.save(make_encoder(seed=5), project.parent / "encoder.onnx")
    with pytest.raises(PackageError, match="different build"):
        build(project)


def test_no_record_without_a_private_key(tmp_path: Path,
                                         encoder_model: onnx.ModelProto) -> None:
    from weightstore.store.mac import key_path

    key_path().parent.mkdir(parents=True, exist_ok=True)
    key_path().write_bytes(b"x" * 32)
    key_path().chmod(0o644)  # readable by others: not a secret, nothing is trusted
    onnx.save(encoder_model, tmp_path / "encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": tmp_path / "encoder.onnx"}, LAYOUTS)
    build(recipe)
    assert _records(_store(recipe)) == []


def test_a_sha256_store_materializes_too(tmp_path: Path, encoder_model: onnx.ModelProto,
                                        conversions: list[str]) -> None:
    onnx.save(encoder_model, tmp_path / "encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": tmp_path / "encoder.onnx"}, LAYOUTS)
    recipe.write_text(recipe.read_text().replace("hash: blake3", "hash: sha256"))
    build(recipe)
    expected = tree(tmp_path / "out")
    conversions.clear()
    shutil.rmtree(tmp_path / "out")
    assert [p.status for p in build(recipe).packages] == ["built", "built"]
    assert conversions == []
    assert tree(tmp_path / "out") == expected
    summary = json.loads((tmp_path / "out/pkg/1.0.0/combined/summary.json").read_text())
    assert summary["hash"] == "sha256"


def test_a_read_only_store_materializes_without_writing(
        project: Path, conversions: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a read-only mount: the objects are all there, so nothing needs writing."""
    from .helpers import freeze_index, index_bytes

    store = _store(project)
    before = freeze_index(store, monkeypatch)
    assert [p.status for p in build(project).packages] == ["built", "built"]
    assert conversions == []
    assert tree(project.parent / "out") == tree(project.parent / "expected")
    assert index_bytes(store) == before


def _statuses(recipe: str) -> list[str]:
    return [p.status for p in build(recipe).packages]


def test_two_builds_materializing_one_folder_take_turns(project: Path) -> None:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_statuses, [str(project)] * 2)
    for layout in zip(*results, strict=True):  # each folder is published once
        assert sorted(layout) == ["built", "up-to-date"]
    assert tree(project.parent / "out") == tree(project.parent / "expected")
    assert not [p for p in (project.parent / "out/pkg/1.0.0").iterdir()
                if p.name.startswith(".")]


def test_the_action_key_names_the_store_format_in_force() -> None:
    from weightstore.store.index import FORMAT_VERSION

    assert build_actions.STORE_FORMAT_VERSION == FORMAT_VERSION
    assert build_actions.action_key("blake3:" + "0" * 64) != build_actions.action_key(
        "blake3:" + "1" * 64)


def test_assembly_never_writes_over_a_file(tmp_path: Path) -> None:
    from weightstore.errors import PackageError
    from weightstore.package.assembly import assemble, weight_file
    from weightstore.store import BytesPayload

    store = WeightStore(tmp_path / "store")
    payload = BytesPayload.of(b"x" * 100)
    store.put([payload], kind="separate")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"a model")
    piece = [(0, 100, payload.key)]
    with pytest.raises(PackageError, match="already in the folder"):
        assemble(store, folder, [weight_file("model.onnx", 100, piece)])
    with pytest.raises(PackageError, match="already in the folder"):
        assemble(store, folder, [weight_file("w", 100, piece), weight_file("w", 100, piece)])
    assert (folder / "model.onnx").read_bytes() == b"a model"
    assemble(store, folder, [weight_file("w", 128, piece)])
    assert (folder / "w").read_bytes() == b"x" * 100 + bytes(28)



def _damage_model_object(project: Path) -> WeightStore:
    """Flip a byte of the store object of the separate package's model file."""
    from .test_store import flip_byte

    store = WeightStore(_store(project))
    summary = json.loads((project.parent / "expected/pkg/1.0.0/separate/summary.json")
                         .read_text())
    model = store.lookup(next(c["digest"] for c in summary["contents"]
                              if c["path"] == "encoder.onnx"))
    flip_byte(store.path_of(model), model.offset)
    return store

def test_a_damaged_package_file_object_is_rewritten_by_the_next_conversion(
        project: Path, conversions: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The model file's object damaged in place: the build falls back to converting, and
    the record it writes rewrites the object, so the next build materializes again."""
    store = _damage_model_object(project)
    capsys.readouterr()
    build(project)
    assert "separate" in conversions
    assert "was damaged; rewritten from" in capsys.readouterr().err
    assert store.verify().ok
    shutil.rmtree(project.parent / "out")
    conversions.clear()
    build(project)
    assert conversions == []  # materialized again
    assert tree(project.parent / "out") == tree(project.parent / "expected")


def test_a_package_file_object_that_cannot_be_rewritten_leaves_the_build_alone(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording is best effort: a store that refuses the rewrite (read-only) costs the
    shortcut, never the build, which has already published its package."""
    _damage_model_object(project)

    def read_only(self, src, damaged=None):
        raise OSError(30, "Read-only file system", str(self.root))

    monkeypatch.setattr(WeightStore, "heal", read_only)
    assert [p.status for p in build(project).packages] == ["built", "built"]
    assert tree(project.parent / "out") == tree(project.parent / "expected")
