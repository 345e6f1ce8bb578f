"""Temp files left in a store by writers killed with ``kill -9``: ``store verify`` names
them, the next writer (or gc) removes them at once, and a live writer's are never touched.

Each writer runs in its own process with one real step of its write stalled (after doing
it), so that the kill lands while its temp file exists, as it would at any moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weightstore.cli import main
from weightstore.store import BytesPayload, RootRecord, WeightStore

from .test_build import write_recipe

REPO = Path(__file__).resolve().parents[1]

STALLED = r"""
import importlib, sys, time
from pathlib import Path
module, name, ready = sys.argv[1], sys.argv[2], Path(sys.argv[3])
target = importlib.import_module(module)
real = getattr(target, name)
def stall():
    ready.write_text("ready")
    time.sleep(120)
def stalled(*args, **kwargs):
{body}
setattr(target, name, stalled)
sys.argv = ["weightstore", *sys.argv[4:]]
from weightstore.cli import main
sys.exit(main(sys.argv[1:]))
"""

AFTER_REAL = "    real(*args, **kwargs)\n    stall()"
# an atomic write of a cache entry, stalled with its temp file written, not yet renamed
INSIDE_ATOMIC_WRITE = """    from weightstore.io.files import atomic_writer
    with atomic_writer(args[0]) as f:
        f.write(bytes(args[1]))
        f.flush()
        stall()"""


def start_stalled(tmp_path: Path, module: str, name: str, body: str,
                  *argv: str) -> subprocess.Popen:
    """``weightstore *argv`` in a process whose ``module.name`` stalls; returns once the
    stall is reached."""
    script = tmp_path / f"stalled_{name}.py"
    ready = tmp_path / f"ready_{name}"
    script.write_text(STALLED.format(body=body))
    proc = subprocess.Popen([sys.executable, str(script), module, name, str(ready), *argv],
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    if proc.stderr:
        proc.stderr.close()


def temps(root: Path) -> list[str]:
    """Every temp file under the store root, relative to it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp") if p.is_file())


def verify_warnings(root: Path) -> list[tuple[str, str]]:
    done = cli("store", "verify", "--json", "--store", str(root))
    assert done.returncode == 0, done.stderr
    return [(w["kind"], w["file"]) for w in json.loads(done.stdout)["warnings"]]


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightstore", *argv], capture_output=True,
                          text=True, timeout=300, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def next_writer(root: Path) -> None:
    """Another process's first write to the store: a put of one new payload."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, sys\n"
         "from weightstore.store import BytesPayload, WeightStore\n"
         "WeightStore(sys.argv[1]).put([BytesPayload.of(os.urandom(64))], kind='separate')",
         str(root)], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr


def test_a_gc_killed_while_compacting_leaves_a_temp_file_the_next_gc_removes(
        tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store")
    ps = [BytesPayload.of(os.urandom(3 << 20)) for _ in range(8)]
    store.put(ps, kind="combined", combined_name="m")
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"fingerprint": "fp"}))
    store.register_root(RootRecord("p", "1", "l", str(folder), "fp"), [p.key for p in ps[:2]])
    store.index.close()
    proc = start_stalled(tmp_path, "weightstore.store.compact", "copy_range", AFTER_REAL,
                         "store", "gc", "--compact-ratio", "0.1", "--store", str(store.root))
    try:
        (left,) = temps(store.root)  # the compaction's copy, being written
        assert left.startswith(".m.c") and "_weight_combined." in left
        next_writer(store.root)  # a live writer's temp file is never touched
        assert temps(store.root) == [left]
        assert ("temp_file", left) not in verify_warnings(store.root)
    finally:
        kill(proc)
    assert ("temp_file", left) in verify_warnings(store.root)  # named once it is left
    done = cli("store", "gc", "--compact-ratio", "0.1", "--store", str(store.root))
    assert done.returncode == 0, done.stderr
    assert f"removed stale temp file {left}" in done.stdout
    assert temps(store.root) == []
    report = store.verify()
    assert report.ok and not report.warnings, report.warnings
    for p in ps[:2]:
        assert store.read(store.lookup(p.key)) == p.data


@pytest.fixture
def built(encoder_model, save_model, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A recipe built into a store: (recipe, package folder, store)."""
    recipe = write_recipe(tmp_path, {"encoder": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    store = tmp_path / "store"
    assert main(["-q", "build", str(recipe), "--store", str(store)]) == 0
    return recipe, tmp_path / "out" / "pkg" / "1.0.0" / "c", store


def test_a_killed_prepare_leaves_temp_files_the_next_writer_removes(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, package, store = built
    proc = start_stalled(tmp_path, "weightstore.store.writer", "check_written", AFTER_REAL,
                         "prepare", str(package), "--store", str(store))
    try:  # its other threads may still be staging theirs: more may come, none may go
        left = temps(store)
        assert left and all(n.startswith(".weight_") for n in left), left
        next_writer(store)
        ws = WeightStore(store)
        ws.plan_gc().execute(ws)  # nor does gc touch it
        assert set(left) <= set(temps(store))
    finally:
        kill(proc)
    left = temps(store)
    warned = verify_warnings(store)
    assert all(("temp_file", n) in warned for n in left), warned
    next_writer(store)
    assert temps(store) == []
    assert main(["prepare", str(package), "--store", str(store)]) == 0
    assert WeightStore(store).verify().ok


def test_a_killed_build_leaves_a_cache_temp_file_the_next_writer_removes(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    recipe, _, store = built
    cache = store / "payload-keys"
    for entry in cache.iterdir():
        entry.unlink()  # the build writes its payload keys again
    proc = start_stalled(tmp_path, "weightstore.caches.payload_keys", "atomic_write_bytes",
                         INSIDE_ATOMIC_WRITE, "-q", "build", str(recipe), "--store",
                         str(store), "--force")
    try:
        (left,) = temps(store)
        assert left.startswith("payload-keys/."), left
        next_writer(store)
        assert temps(store) == [left]
    finally:
        kill(proc)
    assert ("temp_file", left) in verify_warnings(store)
    next_writer(store)
    assert temps(store) == []
    assert main(["-q", "build", str(recipe), "--store", str(store), "--force"]) == 0
    report = WeightStore(store).verify()
    assert report.ok and not [w for w in report.warnings if w.kind == "temp_file"]


def test_a_large_put_holds_a_bounded_number_of_staged_files(tmp_path: Path) -> None:
    """Staged per-weight objects stay open (held) until their rows are recorded: a put of
    many goes in batches, within a low limit of open files."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, resource, sys\n"
         "from weightstore.store import BytesPayload, WeightStore\n"
         "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
         "ps = [BytesPayload.of(os.urandom(100)) for _ in range(500)]\n"
         "store = WeightStore(sys.argv[1])\n"
         "assert store.put(ps, kind='separate', jobs=4).written_objects == 500\n"
         "assert store.verify().ok", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert temps(tmp_path / "store") == []
