"""A load never computes with bytes it did not verify on that load.

File identity cannot prove content: a write through a page already dirty in a shared
mapping keeps every timestamp, and a file renamed over a weight file between a check and
onnxruntime's open swaps the inode. Each load verifies every range it hands over through
the descriptors it opened and proves onnxruntime opened those very files; a package's
model file is checked against its summary, inline tensors included; a model of no package
is checked against the SHA-1 its external data declares (onnx.proto's ``checksum``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os

import numpy as np
import onnx
import pytest

import weightstore
from weightstore.cli import main
from weightstore.convert.api import convert_to_external
from weightstore.errors import IntegrityError
from weightstore.io.digests import digest_file
from weightstore.io.identity import identity_of
from weightstore.load import LoadReport, RecordingReader, plans

from . import test_ready
from .samples import make_encoder, sample_inputs
from .test_load_damage import _build
from .test_ready import _run

package = test_ready.package  # a copy of the split sample package
settled = test_ready.settled  # files written just now count as settled


def _live_entry(resolved, file: str):
    return max((e for e in resolved.payload_manifest.active if e.source.file == file),
               key=lambda e: e.source.length)


def test_a_write_through_a_dirty_shared_page_is_caught_on_the_next_load(package, settled):
    """The audit's attack: dirty a page of a weight file through a shared mapping, let a
    load record the package, then write other bytes into the same page. Every timestamp
    stays as recorded; the next load still verifies the bytes and refuses them."""
    data = package / "pk.common.data"
    with weightstore.resolve(package) as r:
        entry = _live_entry(r, data.name)
    at = entry.source.offset + entry.source.length // 2
    fd = os.open(data, os.O_RDWR)
    try:
        view = mmap.mmap(fd, 0)
        view[at] = view[at]  # the page is dirty now (same bytes)
        with weightstore.resolve(package) as r:
            _run(weightstore.load(r), package)  # recorded: resolution and session plan
            key = plans.plan_key(r, ("CPUExecutionProvider",))
        assert plans.recorded(key) is not None
        before = identity_of(os.stat(data))
        view[at] ^= 0x55  # through the page that is already dirty
        after = identity_of(os.stat(data))
        view.close()
    finally:
        os.close(fd)
    if before != after:  # this kernel noted the write: the attack is weaker here
        pytest.skip("a write through a dirty shared page updated the file's times")
    with weightstore.resolve(package) as r, pytest.raises(IntegrityError) as err:
        assert plans.plan_key(r, ("CPUExecutionProvider",)) == key  # from the records
        weightstore.load(r)
    assert err.value.context.get("initializer") in entry.values
    assert plans.recorded(key) is None  # the plan that failed is dropped


def test_a_file_renamed_over_a_weight_file_during_the_load_is_never_used(package, settled,
                                                                         monkeypatch):
    """A same-size file with other bytes renamed over a weight file after the load opened
    it and before onnxruntime does: the session onnxruntime made is dropped, and the load
    through the load's own files reads the new file and refuses it."""
    data = package / "pk.common.data"
    with weightstore.resolve(package) as r:
        _run(weightstore.load(r), package)
        entry = _live_entry(r, data.name)
    swapped = bytearray(data.read_bytes())
    swapped[entry.source.offset + 7] ^= 0xFF
    real = plans.create_session

    def swap_then_create(*args, **kwargs):
        other = package / ".other"
        other.write_bytes(swapped)
        os.replace(other, data)  # between the load's open and onnxruntime's
        return real(*args, **kwargs)

    monkeypatch.setattr(plans, "create_session", swap_then_create)
    with weightstore.resolve(package) as r, pytest.raises(IntegrityError) as err:
        weightstore.load(r)
    assert err.value.context.get("initializer") in entry.values


def test_a_rename_away_and_back_during_the_load_is_caught(package, settled, monkeypatch):
    """The inode onnxruntime opened may be the load's own again by the time it checks;
    the rename changed its ctime, so the session is not handed over as verified."""
    data = package / "pk.common.data"
    real = plans.create_session

    def away_and_back(*args, **kwargs):
        os.replace(data, package / ".away")
        os.replace(package / ".away", data)
        return real(*args, **kwargs)

    monkeypatch.setattr(plans, "create_session", away_and_back)
    with weightstore.resolve(package) as r:
        report = LoadReport()
        _run(weightstore.load(r, report=report), package)
    assert report.not_in_place and "changed or was replaced" in report.not_in_place
    assert report.verified_bytes == report.live_bytes > 0  # read into the load's own files


def _flip_inline_tensor_bit(model_path) -> None:
    """Flip one bit inside the raw bytes of the model file's largest inline tensor."""
    proto = onnx.load(str(model_path), load_external_data=False)
    tensors = [t for t in proto.graph.initializer if t.raw_data]
    tensors += [a.t for n in proto.graph.node for a in n.attribute
                if a.type == onnx.AttributeProto.TENSOR and a.t.raw_data]
    raw = max((t.raw_data for t in tensors), key=len)
    data = bytearray(model_path.read_bytes())
    at = data.find(raw)
    assert at >= 0
    data[at + len(raw) // 2] ^= 0x01
    model_path.write_bytes(bytes(data))


@pytest.mark.parametrize("layout", ["combined", "embedded"])
def test_run_and_check_verify_the_model_files_own_bytes(tmp_path, capsys, layout):
    """One bit of an inline tensor of a package's model file flipped: every command that
    hands the model to onnxruntime refuses it, as verify does."""
    b = _build(tmp_path, layout)
    model = b.package / "encoder.onnx"
    _flip_inline_tensor_bit(model)
    assert main(["verify", str(b.package)]) == 1
    capsys.readouterr()
    for argv in (["run", str(b.package), "--inputs", str(b.inputs)],
                 ["run", str(model), "--inputs", str(b.inputs)],
                 ["check", str(b.package), "--verify"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "does not match its digest in its package record" in err, (argv, err)
        assert err.count("\n") == 1
    with pytest.raises(IntegrityError):
        weightstore.resolve(b.package)


def test_run_of_a_model_verifies_the_sha1_its_external_data_declares(tmp_path, capsys):
    """A ``convert to-external`` pair declares onnx.proto's SHA-1 of its data file: one
    byte of that file changed, ``run m.onnx`` refuses it (it used to compute with it)."""
    src = tmp_path / "src.onnx"
    onnx.save(make_encoder(vocab=64, hidden=16, layers=1, seed=5), str(src))
    out = tmp_path / "m.onnx"
    convert_to_external(src, out, threshold=256)
    model = onnx.load(str(out), load_external_data=False)
    location = next(e.value for t in model.graph.initializer for e in t.external_data
                    if e.key == "location")
    data_path = tmp_path / location
    declared = next(e.value for t in model.graph.initializer for e in t.external_data
                    if e.key == "checksum")
    assert declared == hashlib.sha1(data_path.read_bytes()).hexdigest()
    feed = sample_inputs(onnx.load(str(src)))
    np.savez(tmp_path / "in.npz", **feed)
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz")]) == 0
    data = bytearray(data_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    data_path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz")]) == 2
    err = capsys.readouterr().err
    assert "SHA-1" in err and err.count("\n") == 1
    for in_place in (True, False):
        with weightstore.resolve(out) as r, pytest.raises(IntegrityError):
            weightstore.load(r, in_place=in_place)


def test_a_copying_load_reports_the_bytes_it_verified(package):
    with weightstore.resolve(package) as r:
        report = LoadReport()
        session = weightstore.load(r, report=report, in_place=False)
        live = r.payload_manifest.active_bytes
    assert report.read_bytes == report.verified_bytes == live > 0
    _run(session, package)


def test_a_device_folder_verifies_its_model_files_own_bytes(split_build, tmp_path, capsys):
    """A device folder (``bundle``) lists each model file's digest in its record: one bit
    of an inline tensor flipped there is refused by the load, ``run`` and ``check``."""
    package = split_build / "out" / "pk" / "1" / "split"
    out = tmp_path / "npu"
    assert main(["bundle", str(package), "npu", "--output", str(out)]) == 0
    record = json.loads((out / "bundle.json").read_text())
    (entry,) = record["models"]
    algo, _, hexdigest = entry["digest"].partition(":")
    assert hexdigest == digest_file(algo, out / entry["file"])
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **sample_inputs(make_encoder(), seed=3))
    assert main(["run", str(out), "--inputs", str(inputs)]) == 0
    _flip_inline_tensor_bit(out / entry["file"])
    capsys.readouterr()
    for argv in (["run", str(out), "--inputs", str(inputs)],
                 ["run", str(out / entry["file"]), "--inputs", str(inputs)],
                 ["check", str(out), "--verify"]):
        assert main(argv) == 2, argv
        assert "does not match its digest" in capsys.readouterr().err
    with pytest.raises(IntegrityError):
        weightstore.resolve(out)


def test_a_model_file_changed_under_a_recorded_resolution_is_refused_when_reopened(
        package, settled):
    """A resolution taken from its record opens the model file only when asked for its
    metadata: the bytes it then parses are checked against the package's digest, not
    against the file's stamp, which a write through a dirty shared page keeps."""
    model = package / "encoder.onnx"
    at = model.stat().st_size // 2
    fd = os.open(model, os.O_RDWR)
    try:
        view = mmap.mmap(fd, 0)
        view[at] = view[at]  # dirty (same bytes)
        weightstore.resolve(package).close()  # recorded
        with weightstore.resolve(package) as r:
            assert r.source._unopened  # from the record: the file not opened yet
            view[at] ^= 0x01  # through the dirty page
            with pytest.raises(IntegrityError, match="does not match its digest"):
                r.source.metadata()
        view.close()
    finally:
        os.close(fd)


def test_a_verifier_that_dies_of_anything_leaves_the_load_unverified(package):
    """A reader failing in a way nobody foresaw ends the verifying thread: the session
    onnxruntime made is not handed over as verified; the load reads its own copy."""

    class Failing(RecordingReader):
        def read_pinned(self, fd, path, offset, out):
            raise RuntimeError("a reader's own failure")

    with weightstore.resolve(package) as r:
        report = LoadReport()
        session = weightstore.load(r, report=report, reader=Failing())
    assert "was not verified: RuntimeError" in report.not_in_place
    assert report.verified_bytes == report.live_bytes > 0
    _run(session, package)


def test_a_record_that_cannot_be_written_is_skipped_not_an_error(package, settled):
    """A folder (or FIFO) where a user-cache record goes is refused by the output check,
    as an OSError: the record is only a cache, so the load goes on without it."""
    with weightstore.resolve(package) as r:
        key = plans.plan_key(r, ("CPUExecutionProvider",))
        (plans.RECORDS.folder / key).mkdir(parents=True)
        report = LoadReport()
        _run(weightstore.load(r, report=report), package)
    assert plans.recorded(key) is None and report.verified_bytes == report.live_bytes
