"""A model file opened on its own is verified against the record beside it.

A package's models carry no payload digest in their external data (onnx.proto's
``checksum`` is the SHA-1 of the whole file): the store keys are the package summary's
``external_weights``, and a device folder's (``devices/<device>/``, a ``bundle`` output,
a ``pull --device``/``--scenario`` folder, tested with the registry) are its
``bundle.json``'s. Whichever way a model file is opened (resolve and load, ``run``,
``check --verify``), a flipped byte in a live payload is caught.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

import weightstore
from weightstore.cli import main
from weightstore.errors import IntegrityError, PackageError, ResolutionError
from weightstore.package.bundle_record import read_bundle
from weightstore.packaging.bundles import assemble
from weightstore.resolve.runnable import runnable_variant

from .helpers import as_an_earlier_version_wrote_it, flip_live_byte, relocated_away
from .samples import make_encoder, run_onnxruntime, sample_inputs


@pytest.fixture
def split(split_build):
    return split_build / "out" / "pk" / "1" / "split"


def _inputs(tmp_path):
    inputs = sample_inputs(make_encoder(), seed=3)
    path = tmp_path / "inputs.npz"
    np.savez(path, **inputs)
    return inputs, path


def _load(model_file, **kwargs):
    with weightstore.resolve(model_file, **kwargs) as resolved:
        session = weightstore.load(resolved)
    return session


def _caught(model_file, inputs_path, capsys) -> None:
    """A load, ``run`` and ``check --verify`` of ``model_file`` refuse its flipped byte."""
    with pytest.raises(IntegrityError, match="do not match"):
        _load(model_file)
    capsys.readouterr()
    assert main(["run", str(model_file), "--inputs", str(inputs_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "do not match" in err
    assert main(["check", str(model_file), "--verify"]) == 1
    out = capsys.readouterr()
    assert "do not match" in out.out + out.err


def test_a_package_model_file_opened_alone_is_verified(split, tmp_path, capsys):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    summary = json.loads((copy / "summary.json").read_text())
    default = [w for w in summary["models"][0]["external_weights"]
               if w.get("scenario") is None and w["location"] == "pk.default.data"]
    _, inputs_path = _inputs(tmp_path)
    assert main(["check", str(copy / "encoder.onnx"), "--verify"]) == 0
    flip_live_byte(copy, default)
    _caught(copy / "encoder.onnx", inputs_path, capsys)


def test_a_bundle_folder_is_verified_and_runs(split, tmp_path, capsys):
    out = tmp_path / "npu"
    assert main(["bundle", str(split), "npu", "--output", str(out)]) == 0
    record = json.loads((out / "bundle.json").read_text())
    assert relocated_away(record) == relocated_away(
        json.loads((split / "devices" / "npu" / "bundle.json").read_text()))
    inputs, inputs_path = _inputs(tmp_path)
    expected = run_onnxruntime(runnable_variant(split / "encoder.onnx", "half"), inputs)
    for e, a in zip(expected, run_onnxruntime(out / "encoder.onnx", inputs), strict=True):
        assert e.tobytes() == a.tobytes()  # onnxruntime loads the folder as it is
    for e, a in zip(expected, _load(out / "encoder.onnx").run(None, inputs), strict=True):
        assert e.tobytes() == a.tobytes()
    assert main(["check", str(out / "encoder.onnx"), "--verify"]) == 0
    flip_live_byte(out, record["models"][0]["external_weights"])
    _caught(out / "encoder.onnx", inputs_path, capsys)


def test_a_device_folder_is_a_source_of_its_own(split, tmp_path, capsys, monkeypatch):
    """resolve, load and ``run`` take a device folder and a model name, as they take a
    package folder: the folder's models are the device's graphs, verified against its
    record; a device it was not made for, or a model it lacks, is one line."""
    out = tmp_path / "npu"
    assert main(["bundle", str(split), "npu", "--output", str(out)]) == 0
    inputs, inputs_path = _inputs(tmp_path)
    expected = run_onnxruntime(runnable_variant(split / "encoder.onnx", "half"), inputs)
    for kwargs in ({}, {"model": "encoder"}, {"model": "encoder", "device": "npu"}):
        with weightstore.resolve(out, **kwargs) as resolved:
            assert resolved.source.path == out / "encoder.onnx"
            got = weightstore.load(resolved).run(None, inputs)
        assert [e.tobytes() for e in expected] == [a.tobytes() for a in got]
    assert main(["run", str(out), "--model", "encoder", "--inputs", str(inputs_path),
                 "--output", str(tmp_path / "ran.npz")]) == 0
    ran = np.load(tmp_path / "ran.npz")
    assert [e.tobytes() for e in expected] == [ran[k].tobytes() for k in ran.files]
    with pytest.raises(ResolutionError, match="made for another device"):
        weightstore.resolve(out, device="cpu")
    with pytest.raises(ResolutionError, match="no such model in the device folder"):
        weightstore.resolve(out, model="decoder")
    capsys.readouterr()
    assert main(["resolve", str(out), "--model", "decoder"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such model in the device folder" in err[0]
    # settled files: the resolution is recorded, and taken from its record next time
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)
    with weightstore.resolve(out) as first:
        assert first.key is not None
    with weightstore.resolve(out) as again:
        assert again.to_dict()["record"] is not None
        got = weightstore.load(again).run(None, inputs)
    assert [e.tobytes() for e in expected] == [a.tobytes() for a in got]
    # check takes it too: every model, as the device's graph
    capsys.readouterr()
    assert main(["check", str(out), "--verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] is None and [m["scenario"] for m in report["models"]] == ["half"]
    for argv in (["--device", "cpu"], ["--scenario", "half"]):
        assert main(["check", str(out), *argv]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    flip_live_byte(out, json.loads((out / "bundle.json").read_text())["models"][0][
        "external_weights"])
    with pytest.raises(IntegrityError, match="do not match"):
        _load(out)
    assert main(["check", str(out), "--verify"]) == 1
    assert "do not match" in capsys.readouterr().out


def test_a_package_device_model_opened_alone_is_verified(split_build, split, tmp_path,
                                                          capsys):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    device = copy / "devices" / "npu"
    inputs, inputs_path = _inputs(tmp_path)
    expected = run_onnxruntime(runnable_variant(split / "encoder.onnx", "half"), inputs)
    record = json.loads((device / "bundle.json").read_text())
    for f in record["files"]:  # the package's weight files, beside the device's model
        shutil.copyfile(copy / f["name"], device / f["name"])
    flip_live_byte(device, record["models"][0]["external_weights"])
    _caught(device / "encoder.onnx", inputs_path, capsys)
    for f in record["files"]:
        (device / f["name"]).unlink()
    # without them, the record's keys find the bytes in the store
    session = _load(device / "encoder.onnx", store=split_build / "store")
    for e, a in zip(expected, session.run(None, inputs), strict=True):
        assert e.tobytes() == a.tobytes()


def test_a_malformed_record_beside_a_model_is_one_line(split, tmp_path, capsys):
    out = tmp_path / "npu"
    assemble(split, "npu", out)
    _, inputs_path = _inputs(tmp_path)
    good = (out / "bundle.json").read_text()
    # an id of no known algorithm would verify nothing
    for key, value in (("offset", "0"), ("id", "md5:" + "0" * 32)):
        record = json.loads(good)
        record["models"][0]["external_weights"][0][key] = value
        (out / "bundle.json").write_text(json.dumps(record))
        with pytest.raises(PackageError, match="malformed bundle record") as err:
            _load(out / "encoder.onnx")
        assert err.value.context["file"] == str(out / "bundle.json")
        assert err.value.context["key"] == f"models[0].external_weights[0].{key}"
    capsys.readouterr()
    for command in (["run", str(out / "encoder.onnx"), "--inputs", str(inputs_path)],
                    ["check", str(out / "encoder.onnx"), "--verify"]):
        assert main(command) == 2
        err_lines = capsys.readouterr().err.strip().splitlines()
        assert len(err_lines) == 1 and "bundle.json" in err_lines[0], command
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    (copy / "summary.json").write_text("{")
    assert main(["run", str(copy / "encoder.onnx"), "--inputs", str(inputs_path)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "summary.json" in err_lines[0]


def test_a_format_1_bundle_record_still_reads(split, tmp_path, capsys):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    as_an_earlier_version_wrote_it(copy)  # its models carry their keys, its records none
    summary = json.loads((copy / "summary.json").read_text())
    assert read_bundle(copy, "npu", summary)["format_version"] == 1
    out = tmp_path / "npu"
    assemble(copy, "npu", out)  # verified against the keys its device model declares
    # the folder's record lists those keys at their places in the folder's weight files
    record = json.loads((out / "bundle.json").read_text())
    assert record["format_version"] == 2
    inputs, inputs_path = _inputs(tmp_path)
    expected = run_onnxruntime(runnable_variant(split / "encoder.onnx", "half"), inputs)
    for e, a in zip(expected, _load(out / "encoder.onnx").run(None, inputs), strict=True):
        assert e.tobytes() == a.tobytes()
    flip_live_byte(out, record["models"][0]["external_weights"])
    _caught(out / "encoder.onnx", inputs_path, capsys)


def _one_line(command, capsys, *words) -> None:
    """``command`` exits 2 with one line on stderr holding each of ``words``."""
    capsys.readouterr()
    assert main(command) == 2, command
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), (command, lines)


@pytest.mark.parametrize("bad_id", ["md5:" + "0" * 32, "blake3:" + "0" * 40],
                         ids=["unknown-algorithm", "wrong-length"])
def test_a_summary_id_that_is_not_a_store_key_is_refused(split, tmp_path, capsys, bad_id):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    summary = json.loads((copy / "summary.json").read_text())
    weights = summary["models"][0]["external_weights"]
    j = next(j for j, w in enumerate(weights) if w["location"] == "pk.default.data")
    weights[j]["id"] = bad_id  # it would verify nothing
    (copy / "summary.json").write_text(json.dumps(summary))
    _, inputs_path = _inputs(tmp_path)
    key = f"models[0].external_weights[{j}].id"
    for source in (copy, copy / "encoder.onnx"):
        with pytest.raises(PackageError, match="an id is not a store key") as err:
            _load(source)
        assert err.value.context["file"] == str(copy / "summary.json")
        assert err.value.context["key"] == key
        _one_line(["run", str(source), "--inputs", str(inputs_path)], capsys,
                  "summary.json", key)
    _one_line(["verify", str(copy)], capsys, "summary.json", key)


def test_a_live_weight_missing_from_the_record_is_refused(split, tmp_path, capsys):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    summary = json.loads((copy / "summary.json").read_text())
    weights = summary["models"][0]["external_weights"]
    lost = next(w for w in weights
                if w.get("scenario") is None and w["location"] == "pk.default.data")
    weights.remove(lost)
    (copy / "summary.json").write_text(json.dumps(summary))
    _, inputs_path = _inputs(tmp_path)
    for source in (copy, copy / "encoder.onnx"):
        refused = pytest.raises(ResolutionError, match="no digest in its package record")
        with refused as err, weightstore.resolve(source) as resolved:  # before any read
            weightstore.load(resolved)
        assert err.value.context["location"] == lost["location"]
        assert err.value.context["offset"] == lost["offset"]
        assert err.value.context["model"] == str(copy / "encoder.onnx")
        _one_line(["run", str(source), "--inputs", str(inputs_path)], capsys,
                  "no digest in its package record", lost["location"],
                  str(lost["offset"]))


def test_a_foreign_model_with_external_data_and_no_record_still_loads(tmp_path):
    model = make_encoder()
    folder = tmp_path / "foreign"
    folder.mkdir()
    onnx.save_model(model, folder / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    inputs = sample_inputs(model, seed=3)
    expected = run_onnxruntime(folder / "m.onnx", inputs)
    for e, a in zip(expected, _load(folder / "m.onnx").run(None, inputs), strict=True):
        assert e.tobytes() == a.tobytes()


def test_scenario_replay_of_a_package_model_is_verified(split, tmp_path, capsys):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    out = tmp_path / "half.onnx"
    replay = ["scenario", "replay", str(copy / "encoder.onnx"), "half", "--output", str(out)]
    capsys.readouterr()
    assert main(replay) == 0
    summary = json.loads((copy / "summary.json").read_text())
    weights = summary["models"][0]["external_weights"]
    live = [w for w in weights if w.get("scenario") is None
            and w["location"] == "pk.common.data"]
    name = flip_live_byte(copy, live)
    out.unlink()
    _one_line(replay, capsys, "payload digest mismatch", "scenario=half")
    assert not out.exists()
    shutil.copyfile(split / "pk.common.data", copy / "pk.common.data")
    lost = next(w for w in live if w["name"] == name)
    weights.remove(lost)
    (copy / "summary.json").write_text(json.dumps(summary))
    _one_line(replay, capsys, "no digest in its package record", lost["location"],
              str(lost["offset"]))


@pytest.mark.parametrize("digest", [5, ["blake3:00"], "blake3:xyz", "md5:" + "0" * 32])
def test_a_device_record_digest_that_is_no_key_is_refused(split, tmp_path, capsys, digest):
    out = tmp_path / "npu"
    assert main(["bundle", str(split), "npu", "--output", str(out)]) == 0
    record = json.loads((out / "bundle.json").read_text())
    record["models"][0]["digest"] = digest
    (out / "bundle.json").write_text(json.dumps(record))
    _one_line(["run", str(out), "--inputs", str(_inputs(tmp_path)[1])], capsys,
              "malformed bundle record", "models[0].digest")
    with pytest.raises(PackageError, match="malformed bundle record"):
        weightstore.resolve(out)
