"""A ready session: the direct load of a package's own files, verified while onnxruntime
creates the session, and the records that let a later process resolve and load the same
package without parsing it or importing onnx, every range still verified on each load
through the files the load pinned: no file identity stands for content."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import weightstore
from weightstore.errors import IntegrityError, ModelError
from weightstore.load import LoadReport, RecordingReader, WeightManager, plans
from weightstore.load import mapped as mapped_module
from weightstore.resolve import cache as resolution_cache
from weightstore.store.location import user_cache_dir

from .samples import run_onnxruntime, sample_inputs
from .test_load import _reference


@pytest.fixture
def package(split_build, tmp_path):
    """A copy of the split sample package (default scenario: weights in two files)."""
    out = tmp_path / "pkg"
    shutil.copytree(split_build / "out" / "pk" / "1" / "split", out)
    return out


@pytest.fixture
def settled(monkeypatch):
    """Files written just now count as settled (their identity stands for their bytes)."""
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)


def _records(kind: str) -> list[str]:
    folder = user_cache_dir() / kind
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def _run(session, package):
    feed, expected = _reference(package, None)
    got = session.run(None, feed)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def _rewrite_in_place(path, change=None):
    """Write the file's bytes back into it (optionally one byte changed): same inode and
    size, a new ctime."""
    data = bytearray(path.read_bytes())
    if change is not None:
        data[change] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


def test_a_direct_load_hands_over_the_package_files_verified(package, monkeypatch):
    made = []
    real = mapped_module._temp_dir
    monkeypatch.setattr(mapped_module, "_temp_dir", lambda size=0: made.append(1) or real(size))
    with weightstore.resolve(package) as r:
        report, reader = LoadReport(), RecordingReader()
        session = weightstore.load(r, report=report, reader=reader, manager=WeightManager())
        live = r.payload_manifest.active_bytes
    assert made == []  # no data file of the load's own
    assert report.verified_bytes == report.read_bytes == reader.bytes_read == live
    assert sorted(reader.reads) == sorted(set(reader.reads))  # each range once
    assert not report.from_record
    _run(session, package)


def test_files_written_just_now_are_not_recorded(package):
    for _ in range(2):
        with weightstore.resolve(package) as r:
            assert r.key is None  # the folder's files are not settled
            report = LoadReport()
            _run(weightstore.load(r, report=report), package)
            assert not report.from_record
    assert _records("resolved") == _records("sessions") == []


def test_a_later_load_takes_its_plan_from_records_and_verifies_every_range(package, settled):
    with weightstore.resolve(package) as first:
        assert first.key is not None
        _run(weightstore.load(first), package)
    assert len(_records("resolved")) == len(_records("sessions")) == 1
    with weightstore.resolve(package) as again:
        # the same resolution; --json says it came from its record, and what that cost
        said, said_first = again.to_dict(), first.to_dict()
        record = said.pop("record")
        assert said_first.pop("record") is None and said == said_first
        assert again.key == first.key == record["key"] and 0 < record["seconds"] < 5
        report, reader = LoadReport(), RecordingReader()
        session = weightstore.load(again, report=report, reader=reader)
    live = first.payload_manifest.active_bytes
    assert report.from_record and reader.bytes_read == report.read_bytes == live
    assert report.verified_bytes == live and report.files_pinned == 2
    assert report.live_bytes == live
    _run(session, package)


def test_a_changed_file_is_verified_again_and_a_damaged_one_refused(package, settled):
    with weightstore.resolve(package) as r:
        weightstore.load(r)
    data = package / "pk.common.data"
    _rewrite_in_place(data)  # same bytes, new identity: resolved and recorded anew
    with weightstore.resolve(package) as r:
        report = LoadReport()
        _run(weightstore.load(r, report=report), package)
        assert not report.from_record and report.verified_bytes == (
            r.payload_manifest.active_bytes)
    with weightstore.resolve(package) as r:
        report = LoadReport()
        weightstore.load(r, report=report)
        assert report.from_record
        entry = next(e for e in r.payload_manifest.active if e.source.file == data.name)
    _rewrite_in_place(data, change=entry.source.offset + 3)
    with weightstore.resolve(package) as r, pytest.raises(IntegrityError) as err:
        weightstore.load(r)
    assert err.value.context.get("initializer") in entry.values


def test_a_tampered_or_foreign_record_is_not_trusted(package, settled, monkeypatch, tmp_path):
    with weightstore.resolve(package) as r:
        weightstore.load(r)
        key = plans.plan_key(r, ("CPUExecutionProvider",))
    path = user_cache_dir() / "sessions" / key
    header, _, body = path.read_bytes().partition(b"\n")
    doc = json.loads(body.partition(b"\n")[0])
    doc["folder"] = str(tmp_path)  # points the session elsewhere
    path.write_bytes(header + b"\n" + json.dumps(doc).encode() + b"\n"
                     + body.partition(b"\n")[2])
    assert plans.recorded(key) is None
    with weightstore.resolve(package) as r:
        report = LoadReport()
        _run(weightstore.load(r, report=report), package)
        assert not report.from_record  # verified and recorded again
    assert plans.recorded(key) is not None
    # another user's process (another key) neither trusts these records nor ours its
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
    shutil.copytree(path.parent.parent, user_cache_dir(), ignore=shutil.ignore_patterns(
        "cache-key"))
    assert plans.recorded(key) is None
    assert resolution_cache.cached(r.key, None) is None  # type: ignore[arg-type]


def test_a_record_over_the_bound_is_a_miss_read_no_further(package, settled, monkeypatch):
    """A user-cache record larger than ``RECORD_LIMIT`` is a miss before any of it is
    read: a sparse record just over the bound costs neither its size in memory nor a
    hash of it (a 4 GiB one once took 37 s and 8.4 GB)."""
    import tracemalloc

    from weightstore.io import files

    with weightstore.resolve(package) as r:
        weightstore.load(r)
        key = plans.plan_key(r, ("CPUExecutionProvider",))
    path = user_cache_dir() / "sessions" / key
    assert plans.recorded(key) is not None
    with monkeypatch.context() as m:  # a sound record, over a lowered bound
        m.setattr(files, "RECORD_LIMIT", path.stat().st_size - 1)
        assert plans.recorded(key) is None
    assert plans.recorded(key) is not None
    os.truncate(path, files.RECORD_LIMIT + 1)  # sparse: what it held, then zeros
    tracemalloc.start()
    try:
        assert plans.recorded(key) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < files.RECORD_LIMIT // 8, peak


def test_a_changed_package_is_resolved_again(package, settled):
    with weightstore.resolve(package) as r:
        key = r.key
    summary = package / "summary.json"
    summary.write_bytes(summary.read_bytes())  # any change below the folder
    with weightstore.resolve(package) as again:
        assert again.key not in (None, key)
    with weightstore.resolve(package, cache=False) as uncached:
        timed = ("transformations", "record")  # each phase's seconds; the record's
        assert uncached.key is None and all(uncached.to_dict()[k] == again.to_dict()[k]
                                            for k in again.to_dict() if k not in timed)
    selector = weightstore.resolve(package, selector=lambda context: None)
    assert selector.key is None


FRESH = textwrap.dedent("""
    import json, sys
    import weightstore.io.identity
    weightstore.io.identity.RACY_SECONDS = -1
    import numpy as np
    import weightstore
    from weightstore.load import LoadReport
    package, feed = sys.argv[1], dict(np.load(sys.argv[2]))
    report = LoadReport()
    resolved = weightstore.resolve(package)
    session = weightstore.load(resolved, report=report)
    analyses = "weightstore.resolve.manifest" in sys.modules
    out = session.run(None, feed)
    np.save(sys.argv[3], out[0])
    assert resolved.payload_manifest.active_bytes == report.live_bytes  # unpickled now
    print(json.dumps({"onnx": "onnx" in sys.modules,
                      "messages": "onnx.onnx_ml_pb2" in sys.modules,
                      "record": report.from_record,
                      "read": report.read_bytes, "analyses": analyses}))
""")


def test_a_fresh_process_loads_from_records_without_onnx(package, tmp_path):
    feed_path, expected = tmp_path / "feed.npz", None
    full = weightstore.resolve(package, cache=False)
    with full:
        model = full.frozen_model()
    from weightstore.resolve.runnable import runnable_variant

    reference = runnable_variant(package / "encoder.onnx", None)
    feed = sample_inputs(reference)
    np.savez(feed_path, **feed)
    expected = run_onnxruntime(reference, feed)[0]
    runs = []
    for n in range(2):
        out = tmp_path / f"out{n}.npy"
        proc = subprocess.run([sys.executable, "-c", FRESH, str(package), str(feed_path),
                               str(out)], capture_output=True, text=True, timeout=300,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        np.testing.assert_array_equal(np.load(out), expected)
    # the first resolves through onnx's messages (never its initialiser); the second
    # loads neither, nor the manifest's types until something asks for the manifest
    assert runs[0]["messages"] and not runs[0]["onnx"] and not runs[0]["record"]
    live = full.payload_manifest.active_bytes
    assert runs[1] == {"onnx": False, "messages": False, "record": True, "read": live,
                       "analyses": False}
    assert model.graph.node  # the resolution the records stand for


def test_a_resolution_from_records_opens_its_model_file_only_when_asked(package, settled):
    weightstore.resolve(package).close()
    with weightstore.resolve(package) as r:
        assert r.source._unopened and not r.source.closed  # nothing opened yet
        assert r.source.metadata().graph.node  # opened and parsed now
    with weightstore.resolve(package) as r:
        _rewrite_in_place(package / "encoder.onnx")  # after the resolution, before the use
        with pytest.raises(ModelError, match="changed since it was resolved"):
            r.source.metadata()
    weightstore.resolve(package).close()  # records the changed package
    r = weightstore.resolve(package)
    assert r.source._unopened
    r.close()
    with pytest.raises(ModelError, match="closed"):
        r.source.metadata()


def test_a_file_changed_during_a_direct_load_sends_it_to_private_files(package, settled,
                                                                      monkeypatch):
    """onnxruntime may have read the bytes before or after the change: the direct load
    gives up, and the load through private data files reads and verifies what it hands
    over."""
    from weightstore.load import pinned

    real = pinned.Verifier.run

    def meanwhile(self):
        _rewrite_in_place(package / "pk.common.data")
        real(self)

    monkeypatch.setattr(pinned.Verifier, "run", meanwhile)
    made = []
    real_temp = mapped_module._temp_dir
    monkeypatch.setattr(mapped_module, "_temp_dir",
                        lambda size=0: made.append(1) or real_temp(size))
    with weightstore.resolve(package) as r:
        report = LoadReport()
        _run(weightstore.load(r, report=report), package)
        key = plans.plan_key(r, ("CPUExecutionProvider",))
    # read and verified into the load's own files (their bytes counted as verified)
    assert made and not report.from_record and report.not_in_place
    assert report.verified_bytes == report.live_bytes > 0
    assert plans.recorded(key) is None  # nothing recorded for the load given up
