"""Roots, gc and compaction, and the store under concurrent builds and kill -9."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.packaging.check import check_package
from weightstore.store import BytesPayload, RootRecord, WeightStore

from .helpers import (
    needs_removable_locks,
    package_objects,
    record_calls,
    store_files,
    store_index,
)
from .samples import make_encoder
from .test_build import write_recipe

COMBINED = "\n  - {name: c, external_weight: combined, size_threshold: 256}\n"
SEPARATE = "\n  - {name: s, external_weight: separate, size_threshold: 256}\n"


def blob(label: str, size: int) -> bytes:
    seed = label.encode() + b"\x00"
    return (seed * (size // len(seed) + 1))[:size]


def payloads(*specs: tuple[str, int]) -> list[BytesPayload]:
    return [BytesPayload.of(blob(label, size)) for label, size in specs]


def recipe_for(folder: Path, seed: int, layouts: str = COMBINED, hidden: int = 32) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "m.onnx"
    if not model.exists():
        onnx.save_model(make_encoder(seed=seed, hidden=hidden, layers=1), str(model))
    return write_recipe(folder, {"m": model}, layouts)


def package_of(recipe: Path, layout: str = "c") -> Path:
    return recipe.parent / "out" / "pkg" / "1.0.0" / layout


def fake_summary(folder: Path, fingerprint: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"fingerprint": fingerprint}))


# -- roots --------------------------------------------------------------------------------


def test_builds_register_roots_and_ls_shows_sizes(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    r1 = recipe_for(tmp_path / "a", 0, COMBINED + "  - {name: s, external_weight: separate, "
                                        "size_threshold: 256}\n")
    r2 = recipe_for(tmp_path / "b", 1)
    build(r1, BuildOptions(store=str(store), jobs=2))
    build(r2, BuildOptions(store=str(store), jobs=2))
    roots = WeightStore(store).roots()
    assert [(r.layout, r.live) for r in roots] == [("c", True), ("c", True), ("s", True)]
    a_c, b_c, a_s = roots
    assert a_c.folder.startswith(str(tmp_path / "a"))
    # a's two layouts share every payload; each also keeps its own model and summary
    files_c, files_s = package_objects(package_of(r1)), package_objects(package_of(r1, "s"))
    assert a_c.size - sum(files_c.values()) == a_s.size - sum(files_s.values()) > 0
    assert a_c.objects - len(files_c) == a_s.objects - len(files_s)
    assert a_c.exclusive_bytes == sum(files_c.values())
    assert 0 < b_c.exclusive_bytes <= b_c.size  # b shares little with a
    assert a_c.folder == str(package_of(r1))
    assert main(["store", "ls", "--store", str(store), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["folder"] for r in listed] == [r.folder for r in roots]
    assert main(["store", "ls", "--store", str(store)]) == 0
    assert "3 root(s), 0 dead" in capsys.readouterr().out


def test_an_up_to_date_build_registers_a_missing_root(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    recipe = recipe_for(tmp_path / "a", 0)
    build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    store = WeightStore(store_dir)
    (root,) = store.roots()
    store.remove_roots(str(root.id))
    assert store.roots() == []
    # as after an upgrade: no build stamp yet, so the packages are checked one by one
    from weightstore.caches import build_stamp
    from weightstore.store.location import user_cache_dir

    shutil.rmtree(user_cache_dir() / build_stamp.FOLDER, ignore_errors=True)
    again = build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    assert again.packages[0].status == "up-to-date"
    (back,) = store.roots()
    assert (back.folder, back.fingerprint, back.objects) == (root.folder, root.fingerprint,
                                                             root.objects)


def test_gc_keeps_what_live_roots_use_and_deletes_the_rest(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    r1, r2 = recipe_for(tmp_path / "a", 0), recipe_for(tmp_path / "b", 1, SEPARATE)
    build(r1, BuildOptions(store=str(store_dir), jobs=2))
    build(r2, BuildOptions(store=str(store_dir), jobs=2))
    store = WeightStore(store_dir)
    before = store_index(store)
    kept = package_objects(package_of(r1))  # a's model and summary files, for its record
    b_keys = {k for k, o in before.items() if o.kind == "separate"} - kept.keys()
    shutil.rmtree(package_of(r2, "s"))  # the package is gone: its root is dead
    plan = store.plan_gc()
    assert [r.layout for r in plan.dead_roots] == ["s"]
    assert {o.key for o in plan.garbage} == b_keys
    assert store_index(store) == before  # planning changes nothing
    result = plan.execute(store)
    assert result.dropped_roots == 1 and result.deleted_objects == len(b_keys)
    assert set(store_index(store)) == set(before) - b_keys
    assert [n for n in store_files(store.root) if n.startswith("weight_")] == sorted(
        before[k].file for k in kept)
    assert store.verify().ok
    assert check_package(package_of(r1), verify=True).ok
    # the deleted payloads come back with the next build
    again = build(r2, BuildOptions(store=str(store_dir), jobs=2))
    assert again.store_report["written_objects"] == len(b_keys)


def test_pin_unpin_rm_and_older_than(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = WeightStore(tmp_path / "store")
    ps = payloads(("a", 100), ("b", 100))
    store.put(ps, kind="separate")
    folder = tmp_path / "pkg"
    fake_summary(folder, "fp1")
    store.register_root(RootRecord("pkg", "1", "l", str(folder), "fp1"), [ps[0].key])
    assert {o.key for o in store.plan_gc().garbage} == {ps[1].key}
    assert store.plan_gc(older_than=3600).garbage == ()  # b was written just now
    shutil.rmtree(folder)
    assert main(["store", "pin", "pkg/1", "--store", str(store.root)]) == 0
    assert {o.key for o in store.plan_gc().garbage} == {ps[1].key}  # pinned: a stays
    assert main(["store", "unpin", str(folder), "--store", str(store.root)]) == 0
    assert {o.key for o in store.plan_gc().garbage} == {p.key for p in ps}
    fake_summary(folder, "fp1")
    assert main(["store", "rm", "pkg", "--store", str(store.root)]) == 0
    assert store.roots() == []
    assert main(["store", "rm", "pkg", "--store", str(store.root)]) == 2
    assert "no root matches" in capsys.readouterr().err
    assert main(["store", "gc", "--dry-run", "--store", str(store.root)]) == 0
    assert "dry run" in capsys.readouterr().out
    assert set(store_index(store)) == {p.key for p in ps}
    assert main(["store", "gc", "--older-than", "1x", "--store", str(store.root)]) == 2
    assert main(["store", "gc", "--store", str(store.root)]) == 2  # no roots: refused
    assert "no roots" in capsys.readouterr().err
    assert main(["store", "gc", "--json", "--no-roots-ok", "--store", str(store.root)]) == 0
    assert json.loads(capsys.readouterr().out)["deleted_objects"] == 2
    assert store_index(store) == {}


def test_compaction_copies_live_ranges_and_swaps_rows(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store")
    ps = payloads(*[(f"p{i}", 1000 + 7 * i) for i in range(10)])
    store.put(ps, kind="combined", combined_name="m", alignment=512)
    with open(store.root / "m_weight_combined", "ab") as f:
        f.write(b"\x99" * 3000)  # an interrupted append's tail
    assert any(w.kind == "unreferenced_bytes" for w in store.verify().warnings)
    folder = tmp_path / "pkg"
    fake_summary(folder, "fp")
    live = ps[:3]
    store.register_root(RootRecord("p", "1", "l", str(folder), "fp"), [p.key for p in live])
    old_size = (store.root / "m_weight_combined").stat().st_size
    plan = store.plan_gc(compact_ratio=0.5)
    assert [f.file for f in plan.compact] == ["m_weight_combined"]
    result = plan.execute(store)
    (done,) = result.compacted
    assert not (store.root / "m_weight_combined").exists()
    index = store_index(store)
    assert set(index) == {p.key for p in live}
    assert {o.file for o in index.values()} == {done["new_file"]}
    assert all(o.offset % 512 == 0 for o in index.values())
    for p in live:
        assert store.read(index[p.key]) == p.data
    assert done["new_size"] < old_size / 3
    report = store.verify()
    assert report.ok and report.warnings == ()
    # appends go on in a fresh file, and a second compaction keeps the name short
    store.put(ps[5:6], kind="combined", combined_name="m")
    assert len(done["new_file"]) == len("m.c12345678_weight_combined")


def test_compaction_waits_for_builds_that_hold_keys(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store")
    ps = payloads(*[(f"p{i}", 600) for i in range(6)])
    store.put(ps, kind="combined", combined_name="m", alignment=64)
    folder = tmp_path / "pkg"
    fake_summary(folder, "fp")
    store.register_root(RootRecord("p", "1", "l", str(folder), "fp"), [ps[0].key])
    builder = WeightStore(store.root)
    with builder.leased():
        located = builder.locate([ps[0].key, ps[1].key])  # a build relies on these
        result = store.plan_gc(compact_ratio=0.1).execute(store)
        assert result.compacted == [] and result.skipped[0]["reason"].startswith("a running")
        assert ps[1].key in store_index(store)  # leased: not garbage either
        assert builder.read(located[ps[1].key]) == ps[1].data
    result = store.plan_gc(compact_ratio=0.1).execute(store)
    assert len(result.compacted) == 1
    assert set(store_index(store)) == {ps[0].key}
    assert store.verify().ok


# -- many builds, gc in a loop, kill -9 ---------------------------------------------------


def _build(args: tuple[str, str, bool]) -> dict:
    recipe, store, force = args
    return build(recipe, BuildOptions(store=store, jobs=1, force=force)).store_report


def test_eight_processes_build_into_one_store(tmp_path: Path) -> None:
    recipes = [recipe_for(tmp_path / f"r{i}", i % 4, COMBINED if i % 2 else SEPARATE)
               for i in range(8)]
    store = tmp_path / "store"
    with mp.get_context("spawn").Pool(8) as pool:
        reports = pool.map(_build, [(str(r), str(store), False) for r in recipes])
    ws = WeightStore(store)
    index = store_index(ws)
    for recipe in recipes:
        layout = "c" if "name: c" in recipe.read_text() else "s"
        summary = json.loads((package_of(recipe, layout) / "summary.json").read_text())
        for w in summary["models"][0]["external_weights"]:
            assert w["id"] in index  # no lost row
        assert check_package(package_of(recipe, layout), verify=True).ok
    assert sum(r["written_objects"] for r in reports) >= len(index)
    report = ws.verify()
    assert report.ok, report.problems
    assert len(ws.roots()) == 8


def test_a_file_removed_while_the_store_is_listed_is_left_out(tmp_path, monkeypatch):
    """Listing a store races writers and gc that remove files (an emptied combined file):
    one gone between the listing and its stat is simply not there, not an error."""
    from weightstore.store import layout

    (tmp_path / "a_weight_combined").write_bytes(b"x" * 3)
    (tmp_path / "b_weight_combined").write_bytes(b"y" * 5)
    real = os.scandir

    class Listing:
        def __init__(self, path):
            self.it = real(path)

        def __enter__(self):
            entries = list(self.it)
            (tmp_path / "a_weight_combined").unlink()  # gone before it is stat'ed
            return iter(entries)

        def __exit__(self, *exc):
            self.it.close()

    monkeypatch.setattr(layout.os, "scandir", Listing)
    assert layout.scan(tmp_path).objects == {"b_weight_combined": 5}


def _gc_loop(store: str, stop: str, done: str) -> None:
    ws = WeightStore(store)
    runs = deleted = 0
    while not os.path.exists(stop):
        if not ws.index_path.exists():
            time.sleep(0.05)  # the first build has not created the store yet
            continue
        deleted += ws.plan_gc(compact_ratio=0.05).execute(ws).deleted_objects
        runs += 1
    Path(done).write_text(json.dumps({"runs": runs, "deleted": deleted}))


def test_gc_in_a_loop_while_builds_run(tmp_path: Path) -> None:
    store = tmp_path / "store"
    recipes = [recipe_for(tmp_path / f"r{i}", i, COMBINED if i % 2 else SEPARATE)
               for i in range(4)]
    ctx = mp.get_context("spawn")
    stop, done = tmp_path / "stop", tmp_path / "done"
    gc = ctx.Process(target=_gc_loop, args=(str(store), str(stop), str(done)))
    gc.start()
    try:
        with ctx.Pool(2) as pool:
            for round_ in range(3):
                pool.map(_build, [(str(r), str(store), True) for r in recipes])
                for i, recipe in enumerate(recipes):  # garbage for the next round
                    if (i + round_) % 2:
                        shutil.rmtree(recipe.parent / "out")
    finally:
        stop.touch()
        gc.join(60)
    assert gc.exitcode == 0
    counts = json.loads(done.read_text())
    assert counts["runs"] >= 2 and counts["deleted"] > 0, counts
    ws = WeightStore(store)
    report = ws.verify()
    assert report.ok, report.problems
    index = store_index(ws)
    built = [r for r in recipes if (r.parent / "out").exists()]
    assert built
    for recipe in built:
        layout = "c" if "name: c" in recipe.read_text() else "s"
        assert check_package(package_of(recipe, layout), verify=True).ok
        summary = json.loads((package_of(recipe, layout) / "summary.json").read_text())
        assert {w["id"] for w in summary["models"][0]["external_weights"]} <= set(index)


KILL_SCRIPT = r"""
import os, sys, time
from pathlib import Path
import weightstore.store.{module} as target
real = target.{func}
def stalled(*args, **kwargs):
    {before}
    Path(sys.argv[2]).write_text("ready")
    time.sleep(60)
target.{func} = stalled
{run}
"""


def run_until_killed(tmp_path: Path, module: str, func: str, run: str, arg: str,
                     before: str = "pass") -> None:
    script = tmp_path / f"kill_{func}.py"
    ready = tmp_path / f"ready_{func}"
    script.write_text(KILL_SCRIPT.format(module=module, func=func, run=run, before=before))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), arg, str(ready)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


BUILD = ("from weightstore.builder import build, BuildOptions\n"
         "build(sys.argv[1], BuildOptions(jobs=2))")


@pytest.mark.parametrize(("module", "func", "before"), [
    ("writer", "publish_staged", "pass"),  # separate objects staged, rows not recorded
    ("writer", "check_written", "real(*args, **kwargs)"),  # mid-append, under the file lock
    ("roots", "register", "pass"),  # package published, root not registered
])
def test_kill_during_a_build_then_verify_and_rerun(tmp_path: Path, module: str, func: str,
                                                   before: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv("WEIGHTSTORE_DIR", str(store))
    layouts = SEPARATE if func == "publish_staged" else COMBINED
    recipe = recipe_for(tmp_path / "r", 0, layouts)
    run_until_killed(tmp_path, module, func, BUILD, str(recipe), before)
    ws = WeightStore(store)
    report = ws.verify()
    assert report.ok, report.problems
    result = build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    layout = "c" if layouts == COMBINED else "s"
    assert check_package(package_of(recipe, layout), verify=True).ok
    assert ws.verify().ok
    # the killed build's lease died with it: gc reclaims what it left behind
    ws.plan_gc().execute(ws)
    after = ws.verify()
    assert after.ok and not [w for w in after.warnings if w.kind != "temp_file"]
    assert result.packages[0].status == "built"


GC = ("from weightstore.store import WeightStore\n"
      "ws = WeightStore(sys.argv[1]); ws.plan_gc(compact_ratio=0.1).execute(ws)")


@pytest.mark.parametrize(("func", "before"), [
    ("_copy_live", "pass"),  # nothing copied yet
    ("_copy_live", "real(*args, **kwargs)"),  # the new file written, rows not swapped
    ("fsync_dir", "real(*args, **kwargs)"),  # rows swapped, the old file not yet gone
])
def test_kill_during_compaction_then_verify_and_rerun(tmp_path: Path, func: str,
                                                      before: str) -> None:
    store = WeightStore(tmp_path / "store")
    ps = payloads(*[(f"p{i}", 2000 + i) for i in range(8)])
    store.put(ps, kind="combined", combined_name="m")
    folder = tmp_path / "pkg"
    fake_summary(folder, "fp")
    store.register_root(RootRecord("p", "1", "l", str(folder), "fp"), [p.key for p in ps[:2]])
    run_until_killed(tmp_path, "compact", func, GC, str(store.root), before)
    report = store.verify()
    assert report.ok, report.problems
    for p in ps[:2]:
        assert store.read(store.lookup(p.key)) == p.data
    result = store.plan_gc(compact_ratio=0.1).execute(store)
    assert result.skipped == []
    final = store.verify()
    assert final.ok and [w for w in final.warnings if w.kind != "temp_file"] == []
    assert set(store_index(store)) == {p.key for p in ps[:2]}


# -- self-healing builds ------------------------------------------------------------------


@pytest.mark.parametrize("layouts", [COMBINED, SEPARATE])
def test_a_build_rewrites_a_damaged_object_from_its_source(
        tmp_path: Path, layouts: str, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = tmp_path / "store"
    recipe = recipe_for(tmp_path / "r", 0, layouts)
    build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    store = WeightStore(store_dir)
    victim = max(store_index(store).values(), key=lambda o: o.size)
    with open(store.path_of(victim), "r+b") as f:
        f.seek(victim.offset + 5)
        byte = f.read(1)
        f.seek(victim.offset + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert not store.verify().ok
    shutil.rmtree(store_dir / "payload-keys")  # else the package copies from the source
    capsys.readouterr()
    result = build(recipe, BuildOptions(store=str(store_dir), jobs=2, force=True))
    assert f"store object {victim.key}" in capsys.readouterr().err
    layout = "c" if layouts == COMBINED else "s"
    assert result.packages[0].status == "built"
    assert check_package(package_of(recipe, layout), verify=True).ok
    assert store.verify().ok


def test_a_damaged_object_without_a_source_is_left_to_the_copy_error(tmp_path: Path,
                                                                     ) -> None:
    from weightstore.packaging.write import heal

    store = WeightStore(tmp_path / "store")
    (p,) = payloads(("a", 100))
    store.put([p], kind="separate")
    assert heal(store, [], p.key, store.lookup(p.key)) is None  # no good copy at hand


def test_a_busy_combined_file_sends_the_next_writer_to_a_sibling(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store", lock_timeout=0.2)
    a, b = payloads(("a", 700), ("b", 900))
    store.put([a], kind="combined", combined_name="enc")
    with store.file_lock("enc_weight_combined"):  # another build is appending to it
        report = store.put([b], kind="combined", combined_name="enc")
    assert report.objects[b.key].file == "enc.1_weight_combined"
    assert store.read(report.objects[b.key]) == b.data
    assert store.verify().ok


def test_a_stamped_up_to_date_build_registers_a_missing_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``store rm``, an up-to-date build decided by the build stamp registers the
    root again, as the full check does: gc then keeps the package's model and summary
    objects, and the folder deleted later is materialized back from the store."""
    store_dir = tmp_path / "store"
    recipe = recipe_for(tmp_path / "a", 0)
    build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    store = WeightStore(store_dir)
    (root,) = store.roots()
    assert main(["store", "rm", str(root.id), "--store", str(store_dir)]) == 0
    stamped = build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    assert stamped.packages[0].status == "up-to-date"
    (back,) = store.roots()
    assert (back.folder, back.fingerprint, back.objects) == (root.folder, root.fingerprint,
                                                             root.objects)
    assert main(["store", "gc", "--store", str(store_dir)]) == 0
    shutil.rmtree(package_of(recipe))
    import weightstore.builder.run as run

    converted = record_calls(monkeypatch, run, "_fill_and_write")
    again = build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    assert again.packages[0].status == "built" and converted == []  # from the store
    assert check_package(package_of(recipe), verify=True).ok


# -- lock files of combined files ---------------------------------------------------------


def combined_locks(store: WeightStore) -> set[str]:
    return {n for n in os.listdir(store.root / "locks") if n.endswith("_weight_combined.lock")}


def combined_files(store: WeightStore) -> set[str]:
    return {n for n in os.listdir(store.root) if n.endswith("_weight_combined")}


@needs_removable_locks
def test_a_combined_files_lock_file_goes_with_the_file(tmp_path: Path) -> None:
    """Each compaction left the lock file of the file it removed, and so did gc's removal
    of an emptied combined file: 50 lock files for 3 live files. Now a lock file is
    removed (while held) with its file."""
    store = WeightStore(tmp_path / "store")
    folder = tmp_path / "pkg"
    fake_summary(folder, "fp")
    kept: list[BytesPayload] = []
    for n in range(6):
        ps = payloads(*[(f"r{n}p{i}", 700) for i in range(4)])
        store.put(ps, kind="combined", combined_name="m", alignment=64)
        kept = [*kept[-1:], ps[0]]  # the two last rounds' first payloads stay live
        store.register_root(RootRecord("p", "1", "l", str(folder), "fp"),
                            [p.key for p in kept])
        result = store.plan_gc(compact_ratio=0.3).execute(store)
        assert result.compacted and result.skipped == []
        assert combined_locks(store) <= {f"{f}.lock" for f in combined_files(store)}
    assert len(combined_files(store)) == 2
    assert not [n for n in os.listdir(store.root / "locks") if n.endswith(".holder")]
    assert store.verify().ok
    for p in kept:
        assert store.read(store.lookup(p.key)) == p.data


HOLD_LOCK = r"""
import sys, time
from pathlib import Path
from weightstore.store import WeightStore
store = WeightStore(sys.argv[1])
Path(sys.argv[3]).write_text("waiting")
with store.file_lock(sys.argv[2], timeout=30):
    Path(sys.argv[3]).write_text("held")
    time.sleep(60)
"""


def hold_in_another_process(tmp_path: Path, store: WeightStore, file: str,
                            until: str = "held") -> subprocess.Popen:
    """A process that takes (or waits for) the lock of ``file`` and keeps it; returned once
    its state file says ``until``."""
    state = tmp_path / f"state_{file}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(store.root), file,
                             str(state)], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (state.exists() and state.read_text() == until):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


TAKE_TURNS = r"""
import sys, time
from pathlib import Path
from weightstore.store import WeightStore
store, counter = WeightStore(sys.argv[1]), Path(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with store.file_lock("x_weight_combined", timeout=60):
        value = int(counter.read_text())
        time.sleep(0.0005)  # a read-modify-write that overlaps if two hold the lock
        counter.write_text(str(value + 1))
"""


@needs_removable_locks
def test_a_combined_files_lock_stays_exclusive_while_its_file_is_removed(
        tmp_path: Path) -> None:
    """The unlink-while-locked race: the lock file of an absent combined file is removed on
    every release, so waiters keep finding it removed under them; a waiter must then take
    the lock at the path again, never hold one nobody else sees."""
    store = WeightStore(tmp_path / "store")
    store.put([], kind="separate")
    counter = tmp_path / "counter"
    counter.write_text("0")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", TAKE_TURNS, str(store.root),
                               str(counter), "40"], env=env) for _ in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert counter.read_text() == "120"  # no two processes ever held it at once
    assert combined_locks(store) == set()


@needs_removable_locks
@pytest.mark.parametrize("command", ["gc", "repair"])
def test_gc_and_repair_sweep_lock_files_of_combined_files_that_are_gone(
        tmp_path: Path, command: str) -> None:
    store = WeightStore(tmp_path / "store")
    ps = payloads(("a", 600))
    store.put(ps, kind="combined", combined_name="m")
    fake_summary(tmp_path / "pkg", "fp")
    store.register_root(RootRecord("p", "1", "l", str(tmp_path / "pkg"), "fp"), [ps[0].key])
    locks = store.root / "locks"
    for n in range(3):  # left by earlier versions, or by a kill between the two unlinks
        (locks / f"gone{n}.c0000000{n}_weight_combined.lock").touch()
    (locks / "gone0.c00000000_weight_combined.lock.holder").write_text("{}")
    (locks / "m_weight_combined.lock").touch()  # its file exists: kept
    (locks / "0123abcd.lock").touch()  # a package folder's lock: not a combined file's
    holder = hold_in_another_process(tmp_path, store, "busy_weight_combined")
    try:
        if command == "gc":
            assert main(["store", "gc", "--store", str(store.root)]) == 0
        else:
            assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 0
        left = set(os.listdir(locks))
        assert not {n for n in left if n.startswith("gone")}
        assert {"m_weight_combined.lock", "0123abcd.lock", "busy_weight_combined.lock"} <= left
    finally:
        holder.kill()
        holder.wait(30)
    store.plan_gc().execute(store)
    assert "busy_weight_combined.lock" not in os.listdir(locks)
    assert store.read(store.lookup(ps[0].key)) == ps[0].data
