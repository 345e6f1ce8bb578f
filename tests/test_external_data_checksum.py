"""External data's ``checksum`` as onnx.proto defines it: the SHA-1 of the whole file at
``location``.

Sources that declare one are checked by that meaning (one line naming the file, exit 2,
nothing written); packages write no ``checksum`` at all (their digests are in
``summary.json`` and the store), and packages of earlier versions, which wrote the
payload's ``blake3:``/``sha256:`` digest there, are still read, resolved, verified and
loaded, and rebuilt into the current form.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import (
    ExternalDataInfo,
    _get_all_tensors,
    set_external_data,
    uses_external_data,
)

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.recipe.schema import load_recipe
from weightstore.scenarios.storage import read_scenarios

from .helpers import as_an_earlier_version_wrote_it, scenario_package
from .samples import make_encoder, run_onnxruntime, sample_inputs

STANDARD_KEYS = {"location", "offset", "length"}


def _source(folder: Path, checksum: str | None = None) -> Path:
    """The small encoder saved by onnx with its weights in ``m.data``, each external
    tensor's ``checksum`` set with onnx's own helper to the SHA-1 of ``m.data`` (or to
    ``checksum``)."""
    path = folder / "m.onnx"
    onnx.save_model(make_encoder(vocab=64, hidden=16, layers=1, seed=3), path,
                    save_as_external_data=True, location="m.data", size_threshold=256)
    sha1 = checksum or hashlib.sha1((folder / "m.data").read_bytes()).hexdigest()
    entries = onnx.load(path, load_external_data=False)
    full = onnx.load(path)  # payloads back in raw_data, which set_external_data needs
    for old, tensor in zip(_get_all_tensors(entries), _get_all_tensors(full), strict=True):
        if uses_external_data(old):
            info = ExternalDataInfo(old)
            set_external_data(tensor, info.location, info.offset, info.length, checksum=sha1)
            tensor.ClearField("raw_data")  # m.data holds it (onnx's save would drop checksum)
    path.write_bytes(full.SerializeToString())
    return path


def _recipe(folder: Path, source: Path, layout: str = "{name: c, external_weight: combined}"
            ) -> Path:
    recipe = folder / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nstore: {{path: {folder / 'store'}}}\n"
                      f"models: [{{name: m, source: {source}}}]\nlayouts: [{layout}]\n"
                      f"output: {folder / 'out'}\n")
    return recipe


def _entries(path: Path) -> list[dict[str, str]]:
    """Every external tensor's entries in a model file, scenario records' included, read
    from the proto."""
    model = onnx.load(path, load_external_data=False)
    tensors = list(_get_all_tensors(model))
    for scenario in read_scenarios(model):
        tensors += _tensors_in(scenario)
    return [{e.key: e.value for e in t.external_data} for t in tensors if uses_external_data(t)]


def _tensors_in(message) -> list[onnx.TensorProto]:
    out = []
    for _, value in message.ListFields():
        values = value if isinstance(value, Sequence) and not isinstance(
            value, (str, bytes)) else [value]
        for v in values:
            if getattr(v, "DESCRIPTOR", None) is onnx.TensorProto.DESCRIPTOR:
                out.append(v)
            elif hasattr(v, "ListFields"):
                out += _tensors_in(v)
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_source_with_onnx_sha1_checksums_builds_converts_and_runs(tmp_path, capsys):
    source = _source(tmp_path)
    inputs = sample_inputs(onnx.load(source, load_external_data=False), vocab=64)
    expected = run_onnxruntime(source, inputs)  # onnxruntime takes the checksum as it is
    assert main(["build", str(_recipe(tmp_path, source))]) == 0
    package = tmp_path / "out/p/1/c"
    for got, want in zip(run_onnxruntime(package / "m.onnx", inputs), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert main(["convert", "to-inline", str(source), str(tmp_path / "in.onnx")]) == 0
    for got, want in zip(run_onnxruntime(tmp_path / "in.onnx", inputs), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    np.savez(tmp_path / "in.npz", **inputs)
    capsys.readouterr()
    assert main(["inspect", str(source), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    sha1 = hashlib.sha1((tmp_path / "m.data").read_bytes()).hexdigest()
    assert sha1 in json.dumps(shown)
    for argv in (["resolve", str(source)],
                 ["run", str(source), "--inputs", str(tmp_path / "in.npz"),
                  "--output", str(tmp_path / "y.npz")]):
        assert main(argv) == 0, argv
    with np.load(tmp_path / "y.npz") as got:
        np.testing.assert_array_equal(got[sorted(got.files)[0]], expected[0])


@pytest.mark.parametrize("damage", ["byte flipped", "wrong value", "upper-case, flipped"])
def test_a_file_that_does_not_match_its_sha1_is_refused_naming_it(tmp_path, capsys, damage):
    source = _source(tmp_path, "0" * 40 if damage == "wrong value" else None)
    if damage == "upper-case, flipped":  # onnx.proto does not say which case: both are read
        model = onnx.load(source, load_external_data=False)
        for t in _get_all_tensors(model):
            for e in t.external_data:
                if e.key == "checksum":
                    e.value = e.value.upper()
        source.write_bytes(model.SerializeToString())
    if damage != "wrong value":
        data = bytearray((tmp_path / "m.data").read_bytes())
        data[-1] ^= 1
        (tmp_path / "m.data").write_bytes(data)
    recipe = _recipe(tmp_path, source)
    capsys.readouterr()
    for argv in (["build", str(recipe)],
                 ["convert", "to-inline", str(source), str(tmp_path / "o.onnx")],
                 ["convert", "to-external", str(source), str(tmp_path / "o.onnx")],
                 ["convert", "to-file-constant", str(source), str(tmp_path / "o.onnx")]):
        assert main(argv) == 2, argv
        line = _one_line(capsys)
        assert "SHA-1" in line and str(tmp_path / "m.data") in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data", "m.onnx", "r.yaml"]


def test_packages_write_external_data_as_onnx_proto_defines_it(tmp_path):
    """No ``checksum`` in any model a package holds (scenario records and device models
    included): the store keys are the summary's, and onnx's checker and onnxruntime read
    the models as they are."""
    package, model = scenario_package(tmp_path)
    summary = json.loads((package / "summary.json").read_text())
    assert summary["format_version"] == 4
    models = sorted(package.rglob("*.onnx"))
    assert len(models) >= 3  # the model and the device folders' models
    seen = 0
    for path in models:
        for entries in _entries(path):
            assert set(entries) == STANDARD_KEYS, (path, entries)
            seen += 1
    assert seen > 10
    assert any(w.get("scenario") for m in summary["models"] for w in m["external_weights"])
    onnx.checker.check_model(str(package / "encoder.onnx"))
    inputs = sample_inputs(model, vocab=64)
    for got, want in zip(run_onnxruntime(package / "encoder.onnx", inputs),
                         run_onnxruntime(model, inputs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_convert_output_declares_its_data_file_sha1(tmp_path):
    """A converted model stands alone with its data file, no summary beside it: it carries
    onnx.proto's checksum, the SHA-1 of that file, and a changed byte is caught when the
    pair is read again; a package of the same model carries none."""
    source = tmp_path / "e.onnx"
    model = make_encoder(vocab=64, hidden=16, layers=1, seed=5)
    onnx.save_model(model, source)
    out = tmp_path / "conv" / "m.onnx"
    out.parent.mkdir()
    assert main(["convert", "to-external", str(source), str(out), "--threshold", "256"]) == 0
    entries = _entries(out)
    (location,) = {e["location"] for e in entries}
    sha1 = hashlib.sha1((out.parent / location).read_bytes()).hexdigest()
    assert entries and all(e == {**e, "checksum": sha1} and set(e) == {*STANDARD_KEYS,
                           "checksum"} for e in entries)
    inputs = sample_inputs(model, vocab=64)
    for got, want in zip(run_onnxruntime(out, inputs), run_onnxruntime(model, inputs),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    assert main(["build", str(_recipe(tmp_path, out))]) == 0
    assert all(set(e) == STANDARD_KEYS for e in _entries(tmp_path / "out/p/1/c/m.onnx"))
    data = bytearray((out.parent / location).read_bytes())
    data[-1] ^= 1
    (out.parent / location).write_bytes(data)
    assert main(["convert", "to-inline", str(out), str(tmp_path / "back.onnx")]) == 2
    assert not (tmp_path / "back.onnx").exists()


def test_a_package_an_earlier_version_wrote_is_read_verified_loaded_and_rebuilt(
        tmp_path, capsys):
    source = tmp_path / "e.onnx"
    model = make_encoder(vocab=64, hidden=16, layers=1, seed=5)
    onnx.save_model(model, source)
    recipe = _recipe(tmp_path, source)
    build(recipe, BuildOptions())
    package = tmp_path / "out/p/1/c"
    current = {p.name: p.read_bytes() for p in package.iterdir()}
    as_an_earlier_version_wrote_it(package)
    old = _entries(package / "m.onnx")
    assert old and all(e["checksum"].startswith("blake3:") for e in old)

    inputs = sample_inputs(model, vocab=64)
    np.savez(tmp_path / "in.npz", **inputs)
    capsys.readouterr()
    assert main(["verify", str(package)]) == 0
    capsys.readouterr()
    assert main(["resolve", str(package), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)["manifest"]
    active = [e for e in manifest["active"] if e["file"]]
    assert active and {e["checksum"] for e in active} <= {e["checksum"] for e in old}
    want = run_onnxruntime(model, inputs)
    for target in (package, package / "m.onnx"):  # the model file alone: its own checksums
        assert main(["run", str(target), "--inputs", str(tmp_path / "in.npz"),
                     "--output", str(tmp_path / "y.npz")]) == 0
        with np.load(tmp_path / "y.npz") as got:
            np.testing.assert_array_equal(got[sorted(got.files)[0]], want[0])

    damaged = tmp_path / "damaged"
    shutil.copytree(package, damaged)
    weights = damaged / "m_weight_combined"
    data = bytearray(weights.read_bytes())
    data[active[0]["offset"]] ^= 1
    weights.write_bytes(data)
    capsys.readouterr()
    assert main(["run", str(damaged / "m.onnx"), "--inputs", str(tmp_path / "in.npz")]) == 2
    assert "checksum" in _one_line(capsys)

    # the next build rewrites it as this version writes the build, byte for byte
    assert main(["build", str(recipe)]) == 0
    assert {p.name: p.read_bytes() for p in package.iterdir()} == current
    assert "not proven" not in capsys.readouterr().err


def test_alignment_4096_gives_page_aligned_offsets(tmp_path):
    """What mmap loaders want (onnx.proto recommends page-size multiples): accepted by the
    recipe schema and its JSON Schema, and every offset of the package a multiple of it."""
    source = tmp_path / "e.onnx"
    onnx.save_model(make_encoder(vocab=64, hidden=16, layers=1, seed=5), source)
    layout = "{name: c, external_weight: combined, alignment: 4096}"
    recipe = _recipe(tmp_path, source, layout)
    schema = json.loads((Path(__file__).parents[1] / "schemas/recipe.schema.json").read_text())
    bounds = schema["$defs"]["Layout"]["properties"]["alignment"]
    assert bounds["minimum"] <= 4096 <= bounds["maximum"]
    assert load_recipe(recipe).recipe.layouts[0].alignment == 4096
    build(recipe, BuildOptions())
    package = tmp_path / "out/p/1/c"
    offsets = [int(e["offset"]) for e in _entries(package / "m.onnx")]
    assert len(set(offsets)) > 2 and all(o % 4096 == 0 for o in offsets)
    summary = json.loads((package / "summary.json").read_text())
    assert all(w["offset"] % 4096 == 0 for w in summary["models"][0]["external_weights"])
