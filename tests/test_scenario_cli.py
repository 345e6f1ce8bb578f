"""``weightstore scenario`` and conversions of models that carry scenarios."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from weightstore.cli import main
from weightstore.resolve.runnable import runnable_variant
from weightstore.scenarios.api import replay_modification_scenario, scenario_names

from .samples import run_onnxruntime, sample_inputs


@pytest.fixture
def model_path(encoder_model, save_model):
    return save_model(encoder_model, "m.onnx")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_add_list_show_replay_remove(model_path, encoder_model, tmp_path, capsys):
    m = str(model_path)
    before = model_path.read_bytes()
    code, out, _ = _run(capsys, "scenario", "add", m, "fused", "--passes", "fuse-qkv,cleanup")
    assert code == 0 and "fused" in out
    after = model_path.read_bytes()
    assert after != before and after.startswith(before)  # in place: records appended
    code, out, _ = _run(capsys, "scenario", "add", m, "half", "--passes", "cast-fp16")
    assert code == 0
    code, out, _ = _run(capsys, "scenario", "list", m, "--json")
    listed = json.loads(out)
    assert [s["name"] for s in listed] == ["fused", "half"]
    assert "fuse-qkv" in listed[0]["operations"]
    code, out, _ = _run(capsys, "scenario", "show", m, "fused", "--json")
    shown = json.loads(out)
    fused_inits = [i for r in shown["rewrites"] for i in r["added_initializers"]
                   if i["derived"]]
    assert fused_inits and fused_inits[0]["derived"]["operation"] == "concat"
    out_path = tmp_path / "fused.onnx"
    code, out, _ = _run(capsys, "scenario", "replay", m, "fused", "--output", str(out_path))
    assert code == 0
    inputs = sample_inputs(encoder_model, seed=2)
    expected = run_onnxruntime(encoder_model, inputs)
    actual = run_onnxruntime(out_path, inputs)
    for e, a in zip(expected, actual, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    assert len(onnx.load(str(out_path)).graph.node) < len(encoder_model.graph.node)
    code, _, _ = _run(capsys, "scenario", "remove", m, "half")
    assert code == 0
    assert scenario_names(onnx.load(str(model_path))) == ["fused"]
    # the base model is untouched by all this: same outputs, bit for bit
    base = run_onnxruntime(model_path, inputs)
    assert all(e.tobytes() == a.tobytes() for e, a in zip(expected, base, strict=True))


@pytest.mark.parametrize("args, fragment", [
    (["scenario", "add", "{m}", "s", "--passes", "no-such-pass"], "unknown pass"),
    (["scenario", "show", "{m}", "nope"], "unknown scenario"),
    (["scenario", "replay", "{m}", "nope", "--output", "{o}"], "unknown scenario"),
    (["scenario", "remove", "{m}", "nope"], "unknown scenario"),
    (["scenario", "list", "{missing}"], "not found"),
])
def test_errors_are_one_line(model_path, tmp_path, capsys, args, fragment):
    filled = [a.format(m=model_path, o=tmp_path / "o.onnx", missing=tmp_path / "x.onnx")
              for a in args]
    before = model_path.read_bytes()
    code, _, err = _run(capsys, *filled)
    assert code == 2 and fragment in err and err.count("\n") == 1
    assert model_path.read_bytes() == before


def test_duplicate_needs_replace(model_path, capsys):
    m = str(model_path)
    assert _run(capsys, "scenario", "add", m, "s", "--passes", "cleanup,fuse-qkv")[0] == 0
    code, _, err = _run(capsys, "scenario", "add", m, "s", "--passes", "fuse-qkv")
    assert code == 2 and "already exists" in err
    assert "--replace" in err and "add_scenario(..., replace=True)" in err
    assert _run(capsys, "scenario", "add", m, "s", "--passes", "fuse-qkv",
                "--replace")[0] == 0
    assert scenario_names(onnx.load(str(model_path))) == ["s"]
    # the Python form the message names
    import weightstore

    weightstore.add_scenario(model_path, "s", ["cleanup"], replace=True)
    assert scenario_names(onnx.load(str(model_path))) == ["s"]


def test_conversions_carry_scenarios(model_path, encoder_model, tmp_path, capsys):
    m = str(model_path)
    assert _run(capsys, "scenario", "add", m, "fused", "--passes", "fuse-qkv,cleanup")[0] == 0
    ext = tmp_path / "ext.onnx"
    assert _run(capsys, "convert", "to-external", m, str(ext), "--threshold", "0")[0] == 0
    converted = onnx.load(str(ext), load_external_data=False)
    replay_modification_scenario(converted, "fused")  # digest rebased on the new form
    inputs = sample_inputs(encoder_model, seed=3)
    expected = run_onnxruntime(encoder_model, inputs)
    actual = run_onnxruntime(runnable_variant(ext, "fused"), inputs)
    for e, a in zip(expected, actual, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    back = tmp_path / "back.onnx"
    assert _run(capsys, "convert", "to-inline", str(ext), str(back))[0] == 0
    assert back.read_bytes() == model_path.read_bytes()  # scenarios included, byte for byte
    code, _, err = _run(capsys, "convert", "to-file-constant", m, str(tmp_path / "fc.onnx"))
    assert code == 2 and "scenarios" in err


def test_an_in_place_add_removes_what_a_killed_one_left(model_path, capsys):
    """A killed in-place ``scenario add`` leaves its temp copy beside the model: the next
    rewrite of that model removes it, but never a temp file a live writer still holds."""
    import fcntl
    import os

    folder = model_path.parent
    dead = folder / ".m.onnx.k1ll3d00.tmp"
    dead.write_bytes(model_path.read_bytes()[:5000])  # what the killed run wrote
    live = folder / ".m.onnx.l1v3w0rk.tmp"
    live.write_bytes(b"being written")
    fresh = folder / ".m.onnx.fr3sh000.tmp"  # just written, but held by no process
    fresh.write_bytes(b"")
    for path in (dead, live):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    other = folder / ".other.onnx.k1ll3d00.tmp"  # not this model's
    other.write_bytes(b"x")
    os.utime(other, (1_000_000_000, 1_000_000_000))
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert _run(capsys, "scenario", "add", str(model_path), "s", "--passes",
                    "cleanup")[0] == 0
    # a writer holds its temp file from its creation: one no process holds is a
    # leftover, however young (see docs/reference/formats/store.md, "Temp files")
    assert not dead.exists() and not fresh.exists() and live.exists() and other.exists()
    assert scenario_names(onnx.load(str(model_path), load_external_data=False)) == ["s"]


def test_a_model_cut_short_while_it_is_copied_is_one_line(model_path, capsys, monkeypatch):
    """Another process truncates the model between the read of its fields and their copy:
    one ModelError naming the model, and the model left as that process left it."""
    import os

    from weightstore.scenarios import files

    real = files.copy_range

    def truncating(src_fd, *args):
        os.truncate(model_path, os.path.getsize(model_path) // 2)
        return real(src_fd, *args)

    monkeypatch.setattr(files, "copy_range", truncating)
    size = model_path.stat().st_size
    code, _, err = _run(capsys, "scenario", "add", str(model_path), "s1", "--passes",
                        "cleanup")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weightstore: error: model file ended early")
    assert f"file={model_path}" in lines[0]
    assert model_path.stat().st_size == size // 2
    assert [p.name for p in model_path.parent.iterdir()] == [model_path.name]


def test_a_replayed_converted_model_keeps_no_stale_encoding_record(encoder_model, save_model,
                                                                   tmp_path, capsys):
    """to-external records which tensors were typed fields, by structural path; a replay
    writes every payload inline and moves paths, so the record would only mislead."""
    from weightstore.convert.external_data import ENCODINGS_KEY

    src = str(save_model(encoder_model, "src.onnx"))
    ext = str(tmp_path / "ext.onnx")
    assert _run(capsys, "convert", "to-external", src, ext, "--threshold", "0")[0] == 0
    assert ENCODINGS_KEY in {p.key for p in onnx.load(ext, load_external_data=False)
                             .metadata_props}  # the encoder has typed Constant fields
    assert _run(capsys, "scenario", "add", ext, "half", "--passes", "cast-fp16,cleanup")[0] == 0
    out = tmp_path / "half.onnx"
    assert _run(capsys, "scenario", "replay", ext, "half", "--output", str(out))[0] == 0
    replayed = onnx.load(str(out))
    assert ENCODINGS_KEY not in {p.key for p in replayed.metadata_props}
    inputs = sample_inputs(encoder_model, seed=4)
    for a, b in zip(run_onnxruntime(replayed, inputs),
                    run_onnxruntime(runnable_variant(ext, "half"), inputs), strict=True):
        np.testing.assert_array_equal(a, b)
