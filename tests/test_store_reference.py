"""Store references: a build resolved and loaded by name from the store, no folder needed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import weightstore
from weightstore.builder.run import BuildOptions, build
from weightstore.caches import build_actions
from weightstore.cli import main
from weightstore.errors import IntegrityError, ResolutionError
from weightstore.load import RecordingReader, WeightManager
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import WeightStore

from .samples import make_encoder, run_onnxruntime, sample_inputs
from .test_split import _write

REF = "pk/1/split"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The split recipe of the sample encoder built into ``store`` (with its action
    records, under this test's own secret), packages in ``out``."""
    build(_write(tmp_path, make_encoder()), BuildOptions(jobs=2))
    return tmp_path


def _expected(package: Path, scenario: str | None):
    full = runnable_variant(package / "encoder.onnx", scenario)
    feed = sample_inputs(full)
    return feed, run_onnxruntime(full, feed)


def _outputs(resolved, feed, reader=None):
    session = weightstore.load(resolved, reader=reader, manager=WeightManager())
    return session.run(None, feed)


def _object_path(store: Path, key: str) -> Path:
    s = WeightStore(store)
    return s.path_of(s.lookup(key))


def _summary_key(store: Path, package: Path) -> str:
    fingerprint = json.loads((package / "summary.json").read_bytes())["fingerprint"]
    record = build_actions.load(store, fingerprint)
    assert record is not None
    return next(f.pieces[0].key for f in record.files if f.name == "summary.json")


@pytest.mark.parametrize("scenario", [None, "fused"])
def test_a_store_reference_loads_bit_identical_outputs_with_the_folder_deleted(project,
                                                                                scenario):
    package = project / "out" / "pk" / "1" / "split"
    feed, expected = _expected(package, scenario)
    with weightstore.resolve(package, scenario=scenario) as r:
        from_folder = _outputs(r, feed)
    shutil.rmtree(project / "out")
    store = project / "store"
    with weightstore.resolve(weightstore.StoreReference("pk", "1", "split"), store=store,
                             scenario=scenario) as r:
        assert r.source.folder is None and str(store) in str(r.source.path)
        reader = RecordingReader()
        outputs = _outputs(r, feed, reader)
        assert reader.reads and all(str(store) in str(p) for p, _, _ in reader.reads)
        assert sum(n for _, _, n in reader.reads) == r.payload_manifest.active_bytes
    for got, want, folder in zip(outputs, expected, from_folder, strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, folder)


def test_resolving_a_store_reference_reads_no_payload_byte(project, monkeypatch):
    """Only the index, the action record and the summary and model objects are opened:
    no weight object and nothing of the package folder."""
    store = project / "store"
    package = project / "out" / "pk" / "1" / "split"
    summary = json.loads((package / "summary.json").read_bytes())
    model = next(c["digest"] for c in summary["contents"] if c["path"] == "encoder.onnx")
    allowed = {str(_object_path(store, _summary_key(store, package))),
               str(_object_path(store, model))}
    opened: list[str] = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    with weightstore.resolve(REF, store=store, scenario="fused",
                             transformations=["cast-fp16"]) as r:
        assert r.payload_manifest.active
    monkeypatch.undo()
    assert opened and all(str(store) in p for p in opened)
    payloads = [p for p in opened if "weight" in Path(p).name and p not in allowed]
    assert payloads == []


def test_a_reference_names_exactly_one_build(project):
    store = project / "store"
    with pytest.raises(ResolutionError, match="no build in the store") as err:
        weightstore.resolve("pk/2/split", store=store)
    assert "pk/1/split" in str(err.value) and "pk/2/split" in str(err.value)
    with pytest.raises(ResolutionError, match="several builds") as err:
        weightstore.resolve("pk/1", store=store)
    assert "pk/1/split@" in str(err.value) and "pk/1/split-sep@" in str(err.value)
    root = next(r.id for r in WeightStore(store).roots() if r.layout == "split-sep")
    with weightstore.resolve(f"pk/1@{root}", store=store) as r:
        assert r.payload_manifest.active
    digest = _summary_key(store, project / "out" / "pk" / "1" / "split")
    with weightstore.resolve(f"pk@{digest}", store=store) as r:
        assert r.payload_manifest.active
    with pytest.raises(ResolutionError, match="no such model file, package folder or"):
        weightstore.resolve("pk/1/split/extra", store=store)
    with pytest.raises(ResolutionError, match="no weight store"):
        weightstore.resolve(REF, store=project / "nowhere")


def test_reference_syntax_round_trips_and_an_existing_path_wins(project, monkeypatch):
    ref = weightstore.StoreReference.parse("pk/1/split@blake3:" + "ab" * 32)
    assert (ref.package, ref.version, ref.layout) == ("pk", "1", "split")
    assert str(weightstore.StoreReference.parse(str(ref))) == str(ref)
    assert weightstore.StoreReference.parse("pk@7").pin == "7"
    assert weightstore.StoreReference.parse("pk@0").pin == "0"
    # a root id is ASCII digits, written once: no other script's digits, no leading zero
    for bad in ("", "a//b", "pk@", "pk@x y", "a/b/c/d", "pk@\u0662", "pk@007", "pk@-1"):
        with pytest.raises(ResolutionError, match="not a store reference"):
            weightstore.StoreReference.parse(bad)
    monkeypatch.chdir(project / "out")  # 'pk/1/split' is now also a folder: it is taken
    with weightstore.resolve(REF, store=project / "store") as r:
        assert r.source.folder == Path(REF) and not r.source.in_store


def test_a_tampered_record_or_a_damaged_object_is_refused(project):
    store = project / "store"
    package = project / "out" / "pk" / "1" / "split"
    fingerprint = json.loads((package / "summary.json").read_bytes())["fingerprint"]
    summary = json.loads((package / "summary.json").read_bytes())
    model = next(c["digest"] for c in summary["contents"] if c["path"] == "encoder.onnx")
    model_path = _object_path(store, model)
    good = model_path.read_bytes()
    model_path.chmod(0o644)
    model_path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit off
    with pytest.raises(IntegrityError, match="does not match its key"):
        weightstore.resolve(REF, store=store)
    model_path.unlink()
    with pytest.raises(IntegrityError, match="unreadable"):
        weightstore.resolve(REF, store=store)
    model_path.write_bytes(good)
    summary_path = _object_path(store, _summary_key(store, package))
    summary_path.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        weightstore.resolve(REF, store=store)
    path = build_actions.record_path(store, fingerprint)
    doc = json.loads(path.read_bytes())
    doc["files"][0]["size"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ResolutionError, match="no sound action record"):
        weightstore.resolve(REF, store=store)


def test_cli_resolves_and_runs_a_store_reference(project, tmp_path, capsys):
    package = project / "out" / "pk" / "1" / "split"
    feed, expected = _expected(package, "fused")  # the cpu device runs 'fused'
    inputs, output = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, **feed)
    shutil.rmtree(project / "out")
    store = str(project / "store")
    assert main(["resolve", REF, "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["manifest"]["active"]
    assert main(["resolve", REF, "--recipe", str(project / "recipe.yaml")]) == 0
    assert "active entries" in capsys.readouterr().out
    assert main(["run", REF, "--store", store, "--device", "cpu", "--inputs", str(inputs),
                 "--output", str(output), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenario"] == "fused"
    with np.load(output) as got:
        for name, want in zip(got.files, expected, strict=True):
            np.testing.assert_array_equal(got[name], want)
    assert main(["run", REF, "--store", store, "--device", "gpu9", "--inputs",
                 str(inputs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: no such device") and err.count("\n") == 1
    assert main(["resolve", "pk/9", "--store", store]) == 2
    err = capsys.readouterr().err
    assert "no build in the store matches" in err and err.count("\n") == 1


def test_a_root_redirected_in_the_index_is_refused(project):
    """The roots table is shared and unauthenticated: a row that names another build's
    fingerprint must not make the reference resolve that build."""
    import sqlite3

    from weightstore.store.index import INDEX_NAME

    store = project / "store"
    other = json.loads((project / "out" / "pk" / "1" / "split-sep" / "summary.json")
                       .read_bytes())["fingerprint"]
    with sqlite3.connect(store / INDEX_NAME) as conn:
        conn.execute("UPDATE roots SET fingerprint = ? WHERE layout = 'split'", (other,))
    with pytest.raises(ResolutionError, match="not what the store's roots say"):
        weightstore.resolve(REF, store=store)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_store_object_replaced_by_a_fifo_is_refused_not_waited_on(project, tmp_path):
    import subprocess
    import sys

    package = project / "out" / "pk" / "1" / "split"
    feed, _ = _expected(package, "fused")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **feed)
    summary = json.loads((package / "summary.json").read_bytes())
    store = project / "store"

    def cli(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "weightstore", *args, "--store",
                              str(store)], capture_output=True, text=True, timeout=60,
                             check=False)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0].startswith("weightstore: error: ")
        return lines[0]

    def fifo_for(digest: str) -> Path:
        path = _object_path(store, digest)
        path.unlink()
        os.mkfifo(path)
        return path

    # a payload's object: resolving reads no payload byte, running does
    model = next(c["digest"] for c in summary["contents"] if c["path"] == "encoder.onnx")
    skip = {model, _summary_key(store, package)}
    payload = max((o for o in WeightStore(store).objects() if o.key not in skip),
                  key=lambda o: o.size)
    path = fifo_for(payload.key)
    err = cli("run", REF, "--device", "cpu", "--inputs", str(inputs))
    assert "not a regular file" in err and path.name in err and "--repair" in err
    # the model's own object: resolving reads it
    path.unlink()
    path.write_bytes(b"")  # (a short object: damage of another kind)
    path = fifo_for(model)
    for command in (("resolve", REF), ("run", REF, "--device", "cpu", "--inputs",
                                       str(inputs))):
        err = cli(*command)
        assert "not a regular file" in err and path.name in err and "--repair" in err
