"""A store shared between users, and a store under faults: another user tampering with it,
a full disk during gc's compaction and repair, and ``kill -9`` during compaction while other
processes read.

Every test uses real processes and real files. The tampering user is another uid where the
tests run as root (the store is then made group- and world-writable, as a shared store is);
elsewhere it is another process of the same user, which can do no less.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.io import files as fsio
from weightstore.packaging.check import check_package
from weightstore.store import BytesPayload, RootRecord, WeightStore
from weightstore.store.index import INDEX_NAME

from .helpers import assert_ge_reads_keys, fill
from .samples import make_encoder, run_onnxruntime, sample_inputs
from .test_build import write_recipe

COMBINED = "\n  - {name: c, external_weight: combined, size_threshold: 256}\n"
REF = "pkg/1.0.0/c"
OTHER_UID = 54321
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder every user may enter (pytest's own are private to their owner), removed
    afterwards; with umask 0 meanwhile, as users sharing a store set it."""
    folder = Path(tempfile.mkdtemp(prefix="ws-shared-"))
    os.chmod(folder, 0o777)
    mask = os.umask(0)
    fsio._umask.cache_clear()  # read once per process: this test changes it
    try:
        yield folder
    finally:
        os.umask(mask)
        fsio._umask.cache_clear()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def built(shared: Path) -> dict:
    """The first user's build: a one-layer encoder in a combined layout, its store, and
    the inputs and outputs of onnxruntime on the source."""
    model = make_encoder(seed=3, hidden=32, layers=1)
    source = shared / "m.onnx"
    onnx.save_model(model, str(source))
    recipe = write_recipe(shared, {"m": source}, COMBINED)
    store = shared / "store"
    build(recipe, BuildOptions(store=str(store), jobs=2))
    feed = sample_inputs(model)
    np.savez(shared / "in.npz", **feed)
    return {"recipe": recipe, "store": store, "package": shared / "out" / "pkg" / "1.0.0" / "c",
            "inputs": shared / "in.npz", "expected": run_onnxruntime(model, feed)}


TAMPER = r"""
import json, os, sqlite3, sys
from pathlib import Path
store, what, key, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if what == "object":  # the object's file replaced by one with a byte flipped in key's range
    con = sqlite3.connect(store / "index.sqlite")
    file, offset = con.execute("SELECT file, offset FROM objects WHERE key = ?", (key,)).fetchone()
    con.close()
    data = bytearray((store / file).read_bytes())
    data[offset + 7] ^= 0xFF
    (store / ".tampered").write_bytes(data)
    os.replace(store / ".tampered", store / file)
elif what == "row":  # key's row pointed at the range of another payload of its size
    con = sqlite3.connect(store / "index.sqlite")
    offset = con.execute("SELECT offset FROM objects WHERE key = ?", (other,)).fetchone()[0]
    con.execute("UPDATE objects SET offset = ? WHERE key = ?", (offset, key))
    con.commit()
    con.close()
elif what == "meta":  # meta.json made a format 1 index that maps key to other's range
    con = sqlite3.connect(store / "index.sqlite")
    file, offset, size = con.execute(
        "SELECT file, offset, size FROM objects WHERE key = ?", (other,)).fetchone()
    con.close()
    (store / "meta.json").write_text(json.dumps({
        "format_version": 1, "hash_to_weight_file": {key: file},
        "hash_to_weight_offset": {key: offset}, "hash_to_weight_size": {key: size}}))
"""


SYSTEM_PYTHON = "/usr/bin/python3"  # one every user may run (a venv may sit in a home)


def as_another_user(script: str, *argv: str) -> None:
    """Run a Python script (the standard library only) as the other user of the shared
    store: another uid where the tests run as root, else another process."""
    python, kwargs = sys.executable, {}
    if os.geteuid() == 0 and os.access(SYSTEM_PYTHON, os.X_OK):
        python = SYSTEM_PYTHON
        kwargs = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []}
    subprocess.run([python, "-c", script, *argv], check=True, timeout=60,
                   cwd=Path(argv[0]).parent, **kwargs)


def same_size_pair(store: Path) -> tuple[str, str]:
    """Two payloads of one size in the combined file (a swap GE could not tell)."""
    with sqlite3.connect(store / INDEX_NAME) as conn:
        rows = conn.execute("SELECT key, size FROM objects WHERE file LIKE '%_weight_combined' "
                            "ORDER BY size DESC, key").fetchall()
    by_size: dict[int, list[str]] = {}
    for key, size in rows:
        by_size.setdefault(size, []).append(key)
    return next(keys for keys in by_size.values() if len(keys) >= 2)[:2]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weightstore: error: "), err
    return err


def run_store(built: dict, output: Path) -> int:
    return main(["run", REF, "--store", str(built["store"]), "--inputs", str(built["inputs"]),
                 "--output", str(output)])


def assert_outputs(built: dict, output: Path) -> None:
    with np.load(output) as got:
        for name, want in zip(got.files, built["expected"], strict=True):
            np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("what", ["object", "row", "meta"])
def test_another_user_tampering_with_a_shared_store(built: dict, what: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Whatever the other user changed, no read path hands out the wrong bytes: each
    fails closed with one line, or heals, and the first user's build and run stay
    bit-identical to the source."""
    store = built["store"]
    key, other = same_size_pair(store)
    as_another_user(TAMPER, str(store), what, key, other)
    capsys.readouterr()
    # store verify: damage is a problem (exit 1) naming the key; meta.json a warning
    code = main(["store", "verify", "--store", str(store)])
    out = capsys.readouterr().out
    if what == "meta":
        assert code == 0 and "stale_marker" in out
    else:
        assert code == 1 and key in out
    # export-meta: what GE would read is proved first
    ge = tmp_path / "ge.json"
    code = main(["store", "export-meta", "--store", str(store), "--output", str(ge)])
    if what == "meta":
        assert code == 0
        assert_ge_reads_keys(store, json.loads(ge.read_bytes()))
    else:
        assert code == 2 and key in one_line(capsys) and not ge.exists()
    # run --store: the right outputs, or one line naming the damage
    output = tmp_path / "run.npz"
    code = run_store(built, output)
    if code == 0:
        assert_outputs(built, output)
    else:
        assert code == 2 and "store verify --repair" in one_line(capsys)
        assert what != "meta"  # meta.json is no index: nothing reads offsets from it
    # build warm (the package folder gone): a package bit-identical to a build from the
    # source, the store healed where the build rewrote the object
    shutil.rmtree(built["package"])
    assert main(["build", str(built["recipe"]), "--store", str(store)]) == 0
    assert check_package(built["package"], verify=True).ok
    assert main(["run", str(built["package"]), "--inputs", str(built["inputs"]),
                 "--output", str(tmp_path / "pkg.npz")]) == 0
    assert_outputs(built, tmp_path / "pkg.npz")
    # and after store verify --repair, every read path agrees again
    assert main(["store", "verify", "--repair", "--store", str(store)]) == 0
    assert main(["build", str(built["recipe"]), "--store", str(store), "--force"]) == 0
    assert WeightStore(store).verify().ok
    assert main(["store", "export-meta", "--store", str(store), "--output", str(ge)]) == 0
    assert_ge_reads_keys(store, json.loads(ge.read_bytes()))
    assert run_store(built, output) == 0
    assert_outputs(built, output)


# -- a full disk during gc's compaction and store verify --repair ---------------------------




def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightstore", *argv], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def store_on(disk: Path, damaged: bool = False) -> tuple[WeightStore, list[BytesPayload]]:
    """A store with a 2 MB combined file of which a root keeps 4 payloads (the rest is
    garbage: gc compacts it), three per-weight objects, the second damaged if asked."""
    store = WeightStore(disk / "store")
    combined = [BytesPayload.of(os.urandom(200_000)) for _ in range(10)]
    store.put(combined, kind="combined", combined_name="m", alignment=4096)
    separate = [BytesPayload.of(os.urandom(100_000)) for _ in range(3)]
    store.put(separate, kind="separate")
    package = disk / "pkg"
    package.mkdir()
    (package / "summary.json").write_text(json.dumps({"fingerprint": "fp"}))
    live = [*combined[:4], *separate]
    store.register_root(RootRecord("p", "1", "l", str(package), "fp"), [p.key for p in live])
    if damaged:
        path = store.path_of(store.lookup(separate[1].key))
        os.chmod(path, 0o644)
        data = bytearray(path.read_bytes())
        data[5] ^= 1
        path.write_bytes(data)
    store.index.close()
    return store, live


@pytest.mark.parametrize(("command", "leave"), [
    ("gc", 0),  # the index's first write fails
    ("gc", 128 * 1024),  # the rows go; the copy of the live ranges does not fit
    ("repair", 0),
])
def test_a_full_disk_during_gc_or_repair_is_one_line_and_the_store_stays_sound(
        small_disk: Path, command: str, leave: int) -> None:
    store, live = store_on(small_disk, damaged=command == "repair")
    before = sorted(os.listdir(store.root))
    fill(small_disk, leave)
    argv = ["store", "gc"] if command == "gc" else ["store", "verify", "--repair"]
    done = cli(*argv, "--store", str(store.root))
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.stdout, done.stderr)
    assert lines[0].startswith("weightstore: error: ") and str(store.root) in lines[0]
    assert "full" in lines[0] or "No space" in lines[0]
    # nothing half-done: no temp file left, every live payload intact (read once there is
    # space again: a reader needs a block for SQLite's shared-memory file)
    assert not [n for n in os.listdir(store.root) if n.startswith(".")]
    os.unlink(small_disk / "filler")
    report = store.verify()
    assert [p.kind for p in report.problems] == (["digest_mismatch"] if command == "repair"
                                                 else [])
    for p in live:
        if command != "repair" or p is not live[5]:
            assert store.read(store.lookup(p.key)) == p.data
    assert set(os.listdir(store.root)) <= {*before, "index.sqlite-wal", "index.sqlite-shm"}
    # with space again, the same command completes and the store verifies
    done = cli(*argv, "--store", str(store.root))
    assert done.returncode == 0, done.stderr
    final = store.verify()
    assert final.ok and not [w for w in final.warnings if w.kind != "temp_file"]
    if command == "gc":
        assert "compacted m_weight_combined" in done.stdout
    store.index.close()


@pytest.mark.parametrize(("kind", "leave"), [
    ("format1", 0), ("format1", 24 * 1024), ("format1", 64 * 1024),  # each SQLite step
    ("current", 0),
])
def test_a_full_disk_under_the_index_says_so_and_nothing_is_called_damaged(
        small_disk: Path, kind: str, leave: int) -> None:
    """The index's write fails for want of space (a format 1 store's migration, a current
    store's roots): one line that says the disk is full and names the store; repair on the
    full disk sets nothing aside; with space again every object is there and the same
    command completes."""
    from weightstore.store.meta import read_legacy

    from .test_store_index import write_format1_store

    root = small_disk / "store"
    if kind == "format1":
        sep = [BytesPayload.of(os.urandom(100_000)) for _ in range(3)]
        comb = [BytesPayload.of(os.urandom(150_000)) for _ in range(3)]
        index = write_format1_store(root, sep, {"m": comb})
        live = [*sep, *comb]
        argv = ["store", "gc", "--no-roots-ok"]  # the migration, gc's first write
    else:
        store, live = store_on(small_disk)
        index = {p.key: store.lookup(p.key) for p in live}
        argv = ["store", "pin", "1"]
    fill(small_disk, leave)
    done = cli(*argv, "--store", str(root))
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.stdout, done.stderr)
    assert f"disk is full (the disk holding the store {root})" in lines[0], lines[0]
    assert "damaged" not in lines[0]
    repaired = cli("store", "verify", "--repair", "--store", str(root))
    assert "damaged" not in repaired.stdout + repaired.stderr
    assert not list(root.glob("*.broken"))  # nothing set aside, nothing rebuilt
    if kind == "format1":
        assert read_legacy(root / "meta.json") == index  # still its index, unmigrated
    os.unlink(small_disk / "filler")
    store = WeightStore(root)
    assert store.verify().ok
    for p in live:
        assert store.read(store.lookup(p.key)) == p.data
    done = cli(*argv, "--store", str(root))
    assert done.returncode == 0, done.stderr
    if kind == "format1":  # migrated, then collected: no root keeps its objects
        assert read_legacy(root / "meta.json") is None and store.index_path.is_file()
    else:
        assert {key: store.lookup(key) for key in index} == index
    assert store.verify().ok
    store.index.close()


# -- kill -9 during compaction while other processes read -----------------------------------


READER = r"""
import json, sys, time
from pathlib import Path
import numpy as np
import weightstore
from weightstore.errors import WeightstoreError
from weightstore.load import WeightManager
store, inputs, expected, stop, log = sys.argv[1:6]
with np.load(inputs) as f:
    feed = {k: f[k] for k in f.files}
with np.load(expected) as f:
    want = [f[k] for k in f.files]
with open(log, "a", buffering=1) as out:  # one line per load, as it ends
    out.write(json.dumps({"started": time.time()}) + "\n")
    while not Path(stop).exists():
        start = time.time()
        try:
            with weightstore.resolve("pkg/1.0.0/c", store=store) as r:
                got = weightstore.load(r, manager=WeightManager()).run(None, feed)
        except WeightstoreError as exc:  # a clean error: typed, one message
            outcome = f"{type(exc).__name__}: {exc.message}"
        else:
            same = all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
            outcome = "ok" if same else "wrong"
        out.write(json.dumps({"start": start, "end": time.time(), "outcome": outcome}) + "\n")
"""


def reader_loads(log: Path) -> list[dict]:
    """The loads a reader logged so far (a line being written is left for later)."""
    lines = log.read_text().split("\n")[:-1] if log.exists() else []
    return [entry for entry in map(json.loads, lines) if "outcome" in entry]


def wait_for_loads(logs: list[Path], after: float, count: int,
                   procs: list[subprocess.Popen], timeout: float = 60) -> None:
    """Until every reader has logged ``count`` loads that began after ``after``."""
    deadline = time.monotonic() + timeout
    while not all(len([e for e in reader_loads(log) if e["start"] > after]) >= count
                  for log in logs):
        assert all(p.poll() is None for p in procs)
        assert time.monotonic() < deadline, [reader_loads(log)[-3:] for log in logs]
        time.sleep(0.02)


def built_in_store(tmp_path: Path, seed: int) -> tuple[onnx.ModelProto, WeightStore]:
    """A one-layer encoder built in a combined layout into the store ``tmp_path/store``."""
    model = make_encoder(seed=seed, hidden=32, layers=1)
    source = tmp_path / "m.onnx"
    onnx.save_model(model, str(source))
    store_dir = tmp_path / "store"
    build(write_recipe(tmp_path, {"m": source}, COMBINED), BuildOptions(store=str(store_dir),
                                                                        jobs=2))
    return model, WeightStore(store_dir)

def test_kill_9_during_compaction_while_other_processes_load_from_the_store(
        tmp_path: Path) -> None:
    """Readers resolving and loading a build by store reference, in two processes, while gc
    compacts the combined file they read, killed at each step (before the copy, with the
    new file written but the rows not swapped, with the rows swapped and the old file
    removed but the folder not yet synced), then while compactions run to their end.
    Every load, whenever it runs, gives the source build's outputs: a reader whose file a
    compaction took resolves again rather than fail. Each reader must have made correct
    loads while each killed gc ran and after each kill, and throughout the compactions
    that complete; the store verifies after every kill, and a last gc completes."""
    import weightstore
    from weightstore.load import WeightManager

    from .test_store_gc import GC, run_until_killed

    model, store = built_in_store(tmp_path, seed=5)
    store_dir = store.root
    keys = [o.key for o in store.objects() if o.kind == "combined"]
    feed = sample_inputs(model)
    np.savez(tmp_path / "in.npz", **feed)
    with weightstore.resolve(REF, store=store_dir) as r:
        expected = weightstore.load(r, manager=WeightManager()).run(None, feed)
    np.savez(tmp_path / "want.npz", *expected)

    def garbage() -> None:  # dead ranges in the file the readers read: gc compacts it
        (combined,) = {store.lookup(k).file for k in keys}
        name = combined.removesuffix("_weight_combined")
        store.put([BytesPayload.of(os.urandom(300_000)) for _ in range(2)],
                  kind="combined", combined_name=name)

    stop, env = tmp_path / "stop", {**os.environ, "PYTHONPATH": str(REPO)}
    logs = [tmp_path / f"reader{n}.log" for n in range(2)]
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(store_dir),
                                 str(tmp_path / "in.npz"), str(tmp_path / "want.npz"),
                                 str(stop), str(log)], env=env) for log in logs]
    windows = []  # (what, from, to): loads that began in it are counted for it
    try:
        wait_for_loads(logs, 0, 1, readers)
        for step, (func, before) in enumerate([
                ("_copy_live", "pass"),
                ("_copy_live", "real(*args, **kwargs)"),
                ("fsync_dir", "real(*args, **kwargs)")]):
            garbage()
            (tmp_path / f"ready_{func}").unlink(missing_ok=True)
            began = time.time()
            run_until_killed(tmp_path, "compact", func, GC, str(store_dir), before)
            killed = time.time()
            report = store.verify()
            assert report.ok, (step, report.problems)
            wait_for_loads(logs, killed, 2, readers)
            windows += [(f"gc {step} running", began, killed),
                        (f"gc {step} killed", killed, time.time())]
        began = time.time()
        compacted = 0
        while compacted < 20 or time.time() - began < 1.5:  # compactions that complete
            garbage()
            result = store.plan_gc(compact_ratio=0.1).execute(store)
            assert result.skipped == [] and result.compacted
            compacted += 1
        windows.append(("gc compacting", began, time.time()))
    finally:
        stop.write_text("")
        codes = [p.wait(120) for p in readers]
    assert codes == [0, 0]
    for log in logs:
        loads = reader_loads(log)
        failed = [(e["outcome"], [w for w, begin, end in windows
                                  if e["start"] < end and e["end"] > begin])
                  for e in loads if e["outcome"] != "ok"]
        assert not failed, (log.name, len(loads), failed)
        for what, begin, end in windows:  # correct loads ran while gc ran and after kills
            assert any(e["start"] < end and e["end"] > begin for e in loads), (log.name, what)
    final = store.verify()
    assert final.ok and not [w for w in final.warnings if w.kind != "temp_file"]
    result = store.plan_gc(compact_ratio=0.1).execute(store)
    assert result.skipped == []
    with weightstore.resolve(REF, store=store_dir) as r:
        got = weightstore.load(r, manager=WeightManager()).run(None, feed)
    for g, w in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, w)
    store.index.close()


def test_a_load_whose_file_a_compaction_took_after_it_was_located_reads_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the readers above run into, made certain: a compaction runs to its end
    between the load locating its store objects and reading them. The load plans again
    and gives the source's outputs; a file removed with its rows left (damage, not a
    move) is still the IntegrityError naming the repair."""
    import weightstore
    from weightstore.errors import IntegrityError
    from weightstore.load import WeightManager, session

    model, store = built_in_store(tmp_path, seed=7)
    store_dir = store.root
    (file,) = {o.file for o in store.objects() if o.kind == "combined"}
    store.put([BytesPayload.of(os.urandom(300_000))], kind="combined",
              combined_name=file.removesuffix("_weight_combined"))
    feed = sample_inputs(model)
    plan, planned = session.plan_reads, []

    def compacted_after(*args, **kwargs):  # once the reads are placed: compact
        placed = plan(*args, **kwargs)
        planned.append(placed)
        if len(planned) == 1:
            assert store.plan_gc(compact_ratio=0.1).execute(store).compacted
        return placed

    monkeypatch.setattr(session, "plan_reads", compacted_after)
    with weightstore.resolve(REF, store=store_dir) as r:
        got = weightstore.load(r, manager=WeightManager()).run(None, feed)
    for g, w in zip(got, run_onnxruntime(model, feed), strict=True):
        np.testing.assert_array_equal(g, w)
    raced = len(planned)
    with weightstore.resolve(REF, store=store_dir) as r:  # no compaction this time
        weightstore.load(r, manager=WeightManager())
    once = len(planned) - raced
    assert raced == 2 * once  # planned again, once

    (moved,) = {o.file for o in store.objects() if o.kind == "combined"}
    os.unlink(store_dir / moved)  # gone, its rows left: damage
    with weightstore.resolve(REF, store=store_dir) as r, pytest.raises(
            IntegrityError, match="store object file is missing") as err:
        weightstore.load(r, manager=WeightManager())
    assert "verify --repair" in str(err.value.context.get("hint"))
    assert len(planned) == raced + 2 * once  # not again: the index still places it there
    store.index.close()



def test_sqlites_error_is_judged_by_its_text_where_python_gives_no_code(tmp_path) -> None:
    """Python 3.10's sqlite3 errors carry no ``sqlite_errorcode``: a full disk, an I/O
    error and a locked file are then known by SQLite's own text for them, so a full disk
    is still said to be one, not damage (an error raised here carries no code either)."""
    import sqlite3

    from weightstore.store.index import index_failure, primary_code

    full = sqlite3.OperationalError("database or disk is full")
    assert primary_code(full) == 13
    assert primary_code(sqlite3.OperationalError("disk I/O error")) == 10
    assert primary_code(sqlite3.OperationalError("database is locked")) == 5
    assert primary_code(sqlite3.DatabaseError("file is not a database")) is None
    assert primary_code(OSError(28, "No space left on device")) is None
    index = tmp_path / "index.sqlite"
    assert "disk is full" in str(index_failure(full, "write", index, damage=True))
    assert "damaged" in str(index_failure(sqlite3.DatabaseError("file is not a database"),
                                          "read", index, damage=True))
    assert "damaged" not in str(index_failure(sqlite3.OperationalError("database is locked"),
                                              "read", index, damage=True))
