"""Store damage met while loading and building: a symbolic link in place of a store object,
bytes that no longer match their key, an index row whose size is not its payload's. Each
is reported with the store file, the object's offset there, its key and the repair command
(or, where the build has the payload's source, the object is written again)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

import weightstore
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import IntegrityError, PackageError, ResolutionError
from weightstore.load import RecordingReader, WeightManager
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import StoredObject, WeightStore

from .samples import make_encoder, run_onnxruntime, sample_inputs

HINT = "run 'weightstore store verify --repair'"

RECIPE = """\
package: pk
version: "1"
store: {{path: {store}}}
models:
  - {{name: encoder, source: {src}}}
layouts:
  - {{name: {layout}, external_weight: {layout}}}
output: {out}
"""


@dataclass(frozen=True)
class Built:
    recipe: Path
    store: Path
    package: Path
    inputs: Path
    feed: dict[str, np.ndarray]
    expected: list[np.ndarray]
    ref: str

    def objects(self) -> dict[str, StoredObject]:
        return {o.key: o for o in WeightStore(self.store).objects()}

    def summary(self) -> dict:
        return json.loads((self.package / "summary.json").read_bytes())

    def model_key(self) -> str:
        return next(c["digest"] for c in self.summary()["contents"]
                    if c["path"] == "encoder.onnx")

    def payload(self) -> StoredObject:
        """The largest weight payload's object (neither the model file nor a summary)."""
        weights = {w["id"] for m in self.summary()["models"]
                   for w in m.get("external_weights", ())}
        return max((o for k, o in self.objects().items() if k in weights),
                   key=lambda o: o.size)

    def path(self, obj: StoredObject) -> Path:
        return self.store / obj.file


def _build(tmp_path: Path, layout: str) -> Built:
    src = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(), str(src))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(store=tmp_path / "store", src=src, out=tmp_path / "out",
                                    layout=layout))
    build(recipe, BuildOptions(jobs=2))
    package = tmp_path / "out" / "pk" / "1" / layout
    full = runnable_variant(package / "encoder.onnx", None)
    feed = sample_inputs(full)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **feed)
    return Built(recipe, tmp_path / "store", package, inputs, feed,
                 run_onnxruntime(full, feed), f"pk/1/{layout}")


def _load(resolved, reader=None):
    return weightstore.load(resolved, reader=reader, manager=WeightManager())


def _run_error(b: Built, capsys) -> str:
    """The one line ``weightstore run REF --store S`` fails with."""
    capsys.readouterr()
    assert main(["run", b.ref, "--store", str(b.store), "--inputs", str(b.inputs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: ") and err.count("\n") == 1, err
    return err


def _set_size(store: Path, key: str, delta: int) -> None:
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("UPDATE objects SET size = size + ? WHERE key = ?", (delta, key))
    conn.close()


def _damage_context(exc: IntegrityError, path: Path, obj: StoredObject) -> None:
    assert exc.context["path"] == str(path)
    assert exc.context["offset"] == obj.offset
    assert exc.context["key"] == obj.key
    assert exc.context["hint"] == HINT


# --- 1. a symbolic link in place of a store object --------------------------------------


def test_a_symlinked_weight_object_is_damage_to_a_run_from_the_store(tmp_path, capsys):
    b = _build(tmp_path, "separate")
    obj = b.payload()
    victim = b.path(obj)
    copy = tmp_path / "copy.bin"
    copy.write_bytes(victim.read_bytes())  # even with the very same bytes
    victim.unlink()
    victim.symlink_to(copy)
    err = _run_error(b, capsys)
    assert "symbolic link" in err and str(victim) in err and obj.key in err
    assert "offset=0" in err and HINT in err
    with weightstore.resolve(b.ref, store=b.store) as r, \
            pytest.raises(IntegrityError, match="symbolic link") as exc:
        _load(r)
    _damage_context(exc.value, victim, obj)
    # the repair drops the row; the build writes the object again from its source
    assert main(["store", "verify", "--repair", "--store", str(b.store)]) == 0
    assert main(["build", str(b.recipe), "--force"]) == 0
    assert not victim.is_symlink() and WeightStore(b.store).verify().ok
    capsys.readouterr()
    assert main(["run", b.ref, "--store", str(b.store), "--inputs", str(b.inputs)]) == 0


def test_a_symlinked_combined_file_is_damage_to_a_run_from_the_store(tmp_path, capsys):
    b = _build(tmp_path, "combined")
    obj = b.payload()
    victim = b.path(obj)
    copy = tmp_path / "copy.bin"
    copy.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(copy)
    err = _run_error(b, capsys)
    assert "symbolic link" in err and str(victim) in err and HINT in err
    with weightstore.resolve(b.ref, store=b.store) as r, \
            pytest.raises(IntegrityError, match="symbolic link") as exc:
        _load(r)
    read = b.objects()[exc.value.context["key"]]  # whichever read came first
    assert read.file == obj.file
    _damage_context(exc.value, victim, read)


def test_a_symlinked_file_in_a_package_is_no_package_file(tmp_path):
    """``weightstore verify`` has a package hold only regular files: a load takes such an
    entry's bytes from the store by digest, as for a file the package lacks, and without
    the store refuses it, naming the file."""
    b = _build(tmp_path, "separate")
    obj = b.payload()
    victim = b.package / obj.file  # the package's file of the same weight
    inside = b.package / "elsewhere.bin"
    inside.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(inside.name)  # a link that stays inside the package
    reader = RecordingReader()
    with weightstore.resolve(b.package, store=b.store) as r:
        outputs = _load(r, reader).run(None, b.feed)
    for got, want in zip(outputs, b.expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (b.path(obj), obj.offset, obj.size) in reader.reads
    assert all(p not in (victim, inside) for p, _, _ in reader.reads)
    with pytest.raises(ResolutionError, match="not a regular file") as exc:
        weightstore.resolve(b.package)
    assert exc.value.context["location"] == obj.file


def test_a_package_whose_model_file_is_a_link_is_refused(tmp_path):
    b = _build(tmp_path, "separate")
    model = b.package / "encoder.onnx"
    inside = b.package / "elsewhere.onnx"
    model.rename(inside)
    model.symlink_to(inside.name)
    with pytest.raises(PackageError, match="symbolic link") as exc:
        weightstore.resolve(b.package, store=b.store)
    assert exc.value.context["file"] == "encoder.onnx"
    assert exc.value.context["package"] == str(b.package)


def test_a_loose_model_may_still_be_a_link_and_link_its_weight_files(tmp_path,
                                                                      save_model):
    """Outside packages and the store nothing changes: a model linked from a download
    cache loads, its external data beside the link (a link within its folder too)."""
    cache = tmp_path / "cache"
    model = make_encoder()
    save_model(model, cache / "blob.onnx", save_as_external_data=True,
               location="blob.data", size_threshold=1024)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "real.data").write_bytes((cache / "blob.data").read_bytes())
    (folder / "blob.data").symlink_to("real.data")
    (folder / "model.onnx").symlink_to(cache / "blob.onnx")
    full = runnable_variant(cache / "blob.onnx", None)
    feed = sample_inputs(full)
    with weightstore.resolve(folder / "model.onnx") as r:
        outputs = _load(r).run(None, feed)
    for got, want in zip(outputs, run_onnxruntime(full, feed), strict=True):
        np.testing.assert_array_equal(got, want)


# --- 2. damaged bytes read through the store --------------------------------------------


def test_damaged_bytes_of_a_combined_object_name_the_store_file_and_offset(tmp_path,
                                                                           capsys):
    b = _build(tmp_path, "combined")
    obj = b.payload()
    victim = b.path(obj)
    data = bytearray(victim.read_bytes())
    data[obj.offset + obj.size // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    err = _run_error(b, capsys)
    assert "do not match their checksum" in err
    assert f"path={victim}" in err and f"offset={obj.offset}" in err
    assert obj.key in err and HINT in err
    with weightstore.resolve(b.ref, store=b.store) as r, \
            pytest.raises(IntegrityError, match="do not match their checksum") as exc:
        _load(r)
    _damage_context(exc.value, victim, obj)
    assert "location" not in exc.value.context  # the package file is nowhere involved


def test_a_damaged_model_object_names_its_store_file_offset_and_the_repair(tmp_path,
                                                                           capsys):
    b = _build(tmp_path, "separate")
    obj = b.objects()[b.model_key()]
    victim = b.path(obj)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    err = _run_error(b, capsys)
    assert "does not match its key" in err and str(victim) in err and HINT in err
    with pytest.raises(IntegrityError, match="does not match its key") as exc:
        weightstore.resolve(b.ref, store=b.store)
    _damage_context(exc.value, victim, obj)


def test_a_truncated_store_object_is_damage_not_a_short_read(tmp_path, capsys):
    b = _build(tmp_path, "separate")
    obj = b.payload()
    victim = b.path(obj)
    victim.write_bytes(victim.read_bytes()[: obj.size // 2])
    err = _run_error(b, capsys)
    assert "shorter than its index entry" in err and str(victim) in err and HINT in err
    with weightstore.resolve(b.ref, store=b.store) as r, \
            pytest.raises(IntegrityError, match="shorter than its index entry") as exc:
        _load(r)
    _damage_context(exc.value, victim, obj)


# --- 3. an index row whose size disagrees with its payload ------------------------------


@pytest.mark.parametrize("layout", ["separate", "combined"])
def test_a_row_of_the_wrong_size_is_damage_a_build_writes_again(tmp_path, capsys, layout):
    b = _build(tmp_path, layout)
    obj = b.payload()
    _set_size(b.store, obj.key, +1)
    capsys.readouterr()
    assert main(["build", str(b.recipe), "--force"]) == 0
    err = capsys.readouterr().err
    assert f"store object {obj.key} in {obj.file} at offset {obj.offset} was damaged" in err
    assert "rewritten from" in err
    assert b.objects()[obj.key].size == obj.size
    assert WeightStore(b.store).verify().ok
    assert main(["run", b.ref, "--store", str(b.store), "--inputs", str(b.inputs)]) == 0


@pytest.mark.parametrize("layout", ["separate", "combined"])
@pytest.mark.parametrize("delta", [+1, -1, 1 << 62])
def test_a_row_of_the_wrong_size_read_without_a_source_names_the_damage(
        tmp_path, capsys, layout, delta):
    b = _build(tmp_path, layout)
    obj = b.payload()
    _set_size(b.store, obj.key, delta)
    err = _run_error(b, capsys)
    assert str(b.path(obj)) in err and f"offset={obj.offset}" in err and HINT in err
    with weightstore.resolve(b.ref, store=b.store) as r, \
            pytest.raises(IntegrityError, match="disagrees with its size") as exc:
        _load(r)
    _damage_context(exc.value, b.path(obj), obj)
    assert exc.value.context["size"] == obj.size + delta
    assert exc.value.context["expected"] == obj.size


def test_a_model_object_row_of_the_wrong_size_names_the_damage(tmp_path, capsys):
    b = _build(tmp_path, "separate")
    obj = b.objects()[b.model_key()]
    _set_size(b.store, obj.key, +1)
    err = _run_error(b, capsys)
    assert "not a whole file of its size" in err and HINT in err
    with pytest.raises(IntegrityError, match="not a whole file of its size") as exc:
        weightstore.resolve(b.ref, store=b.store)
    _damage_context(exc.value, b.path(obj), obj)
    # the build has the model file at hand: it writes the object again
    assert main(["build", str(b.recipe), "--force"]) == 0
    assert WeightStore(b.store).verify().ok
    with weightstore.resolve(b.ref, store=b.store) as r:
        assert r.payload_manifest.active
