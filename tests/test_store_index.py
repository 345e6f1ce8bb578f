"""The SQLite store index: migration from format 1, GE's meta.json, hostile index files,
read-only stores, self-checks of the index API."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightstore.cli import main
from weightstore.errors import StoreError
from weightstore.io.files import align_up
from weightstore.store import FORMAT_VERSION, BytesPayload, StoredObject, WeightStore
from weightstore.store.meta import encode_legacy, read_legacy

from .helpers import assert_ge_reads_keys, held, store_index


def blob(label: str, size: int) -> bytes:
    seed = label.encode() + b"\x00"
    return (seed * (size // len(seed) + 1))[:size]


def payloads(*specs: tuple[str, int]) -> list[BytesPayload]:
    return [BytesPayload.of(blob(label, size)) for label, size in specs]


def write_format1_store(root: Path, separate: list[BytesPayload],
                        combined: dict[str, list[BytesPayload]], alignment: int = 512,
                        ) -> dict[str, StoredObject]:
    """A store exactly as format 1 wrote it: per-weight files, combined files with payloads
    at aligned offsets and zero padding, meta.json with the three maps, the lock file."""
    root.mkdir(parents=True)
    index: dict[str, StoredObject] = {}
    for p in separate:
        name = "weight_" + p.key.split(":")[1]
        (root / name).write_bytes(p.data)
        index[p.key] = StoredObject(p.key, name, 0, p.size)
    for stem, ps in combined.items():
        name = f"{stem}_weight_combined"
        data = bytearray()
        for p in ps:
            data += b"\0" * (align_up(len(data), alignment) - len(data))
            index[p.key] = StoredObject(p.key, name, len(data), p.size)
            data += p.data
        (root / name).write_bytes(bytes(data))
    (root / "meta.json").write_bytes(encode_legacy(index))
    (root / "meta.json.lock").touch()
    return index


@pytest.fixture
def v1_store(tmp_path: Path) -> tuple[WeightStore, dict[str, StoredObject], list[BytesPayload]]:
    sep = payloads(("s0", 300), ("s1", 5), ("s2", 0))
    comb = {"enc": payloads(("c0", 700), ("c1", 64), ("c2", 1500)),
            "dec": payloads(("d0", 100))}
    index = write_format1_store(tmp_path / "store", sep, comb)
    return WeightStore(tmp_path / "store"), index, [*sep, *comb["enc"], *comb["dec"]]


def test_format1_store_is_read_without_migrating(v1_store) -> None:
    store, index, ps = v1_store
    assert store_index(store) == index
    assert store.locate([ps[0].key, "blake3:" + "0" * 64]) == {ps[0].key: index[ps[0].key]}
    assert store.verify().ok
    assert store.stats().objects == len(index)
    assert not store.index_path.exists()  # reading changes nothing
    assert read_legacy(store.meta_path) == index


def test_format1_store_is_migrated_on_first_write_every_object_kept(v1_store) -> None:
    store, index, ps = v1_store
    new = payloads(("n0", 900))
    report = store.put([*ps, *new], kind="combined", combined_name="enc", alignment=512)
    assert report.written_objects == 1 and report.reused_objects == len(ps)
    assert store.index_path.exists()
    after = store_index(store)
    assert {k: after[k] for k in index} == index  # every object kept, where it was
    assert after[new[0].key].file == "enc_weight_combined"
    assert after[new[0].key].offset >= max(o.end for o in index.values()
                                           if o.file == "enc_weight_combined")
    assert store.verify().ok
    # meta.json is now a marker that format 1 readers refuse
    doc = json.loads(store.meta_path.read_text())
    assert doc["format_version"] == FORMAT_VERSION == 2
    assert "hash_to_weight_file" not in doc
    with pytest.raises(StoreError, match=r"lost index|missing"):
        store.index_path.rename(store.root / "elsewhere")
        WeightStore(store.root).lookup(ps[0].key)


def test_migration_races_keep_every_object(tmp_path: Path) -> None:
    sep = payloads(*[(f"s{i}", 100 + i) for i in range(40)])
    index = write_format1_store(tmp_path / "store", sep, {})
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_put_one, args=(str(tmp_path / "store"), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    store = WeightStore(tmp_path / "store")
    after = store_index(store)
    assert {k: after[k] for k in index} == index
    assert len(after) == len(index) + 4
    assert store.verify().ok


def _put_one(root: str, i: int) -> None:
    WeightStore(root).put(payloads((f"new{i}", 50)), kind="separate")


def test_a_build_reuses_a_migrated_store(encoder_model, save_model, tmp_path: Path) -> None:
    from weightstore.builder.run import BuildOptions, build

    from .test_build import write_recipe

    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, "\n  - {name: c, external_weight: combined}\n")
    first = build(recipe, BuildOptions(store=str(tmp_path / "s1"), jobs=2))
    # the same objects, as a format 1 store
    s1 = WeightStore(tmp_path / "s1")
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(s1.root):
        if name.endswith("_weight_combined") or name.startswith("weight_"):
            os.link(s1.root / name, old / name)
    (old / "meta.json").write_bytes(encode_legacy(store_index(s1)))
    again = build(recipe, BuildOptions(store=str(old), jobs=2, force=True))
    assert again.store_report["written_objects"] == 0
    assert again.store_report["reused_objects"] == first.store_report["written_objects"]
    assert WeightStore(old).verify().ok
    assert len(WeightStore(old).roots()) == 1


# -- export-meta --------------------------------------------------------------------------


def test_export_meta_cli_writes_ge_shape(v1_store, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = v1_store[0]
    store.put(payloads(("x", 10)), kind="separate")  # migrates
    out = tmp_path / "ge" / "meta.json"
    out.parent.mkdir()
    assert main(["store", "export-meta", "--store", str(store.root), "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"format_version", "hash_to_weight_file", "hash_to_weight_offset",
                        "hash_to_weight_size", "index"}
    rows = store_index(store)
    assert doc["hash_to_weight_file"] == {k: o.file for k, o in rows.items()}
    assert doc["hash_to_weight_offset"] == {k: o.offset for k, o in rows.items()}
    assert doc["hash_to_weight_size"] == {k: o.size for k, o in rows.items()}
    assert list(doc["hash_to_weight_file"]) == sorted(rows)
    assert_ge_reads_keys(store.root, doc)
    # the export of an unchanged store is byte-identical
    again = tmp_path / "again.json"
    store.export_meta(again)
    assert again.read_bytes() == out.read_bytes()
    # and the store keeps working with GE's maps in its own meta.json
    store.export_meta()
    assert store.put(payloads(("y", 10)), kind="separate").written_objects == 1
    assert store.verify().ok


# -- hostile index files ------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"format_version": 1, "hash_to_weight_file": {"blake3:' + "ab" * 32 + '": "weight_x"},'
    ' "hash_to_weight_offset": {"blake3:' + "ab" * 32 + '": ' + str(10**30) + '},'
    ' "hash_to_weight_size": {"blake3:' + "ab" * 32 + '": 4}}',
    "[" * 100_000 + "]" * 100_000,
    '{"format_version": 1' + ', "a": {"b": ' * 5000 + "1" + "}" * 5000 + "}",
])
def test_huge_numbers_and_deep_nesting_are_typed_errors(tmp_path: Path, text: str) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "meta.json").write_text(text)
    store = WeightStore(root)
    for call in (lambda: store_index(store), store.stats, store.verify,
                 lambda: store.put(payloads(("a", 1)), kind="separate")):
        with pytest.raises(StoreError):
            call()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=4096), at=st.integers(0, 1 << 16))
def test_a_fuzzed_index_file_gives_only_typed_errors(tmp_path_factory, data: bytes,
                                                     at: int) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    store = WeightStore(root)
    ps = payloads(("a", 100), ("b", 2000))
    store.put(ps[:1], kind="separate")
    store.put(ps[1:], kind="combined", combined_name="m")
    del store
    raw = bytearray((root / "index.sqlite").read_bytes())
    for suffix in ("-wal", "-shm"):
        (root / f"index.sqlite{suffix}").unlink(missing_ok=True)
    at %= max(1, len(raw))
    raw[at:at + len(data)] = data
    (root / "index.sqlite").write_bytes(bytes(raw))
    fresh = WeightStore(root)
    for call in (lambda: store_index(fresh), fresh.stats, fresh.verify, fresh.roots,
                 lambda: fresh.locate([p.key for p in ps]),
                 lambda: fresh.put(payloads(("c", 10)), kind="separate")):
        with contextlib.suppress(StoreError):
            call()


def test_rows_with_impossible_values_are_damage_not_tracebacks(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="combined", combined_name="m", alignment=64)
    conn = sqlite3.connect(store.index_path)
    conn.execute("UPDATE objects SET offset = ? WHERE key = ?", (2**40, ps[0].key))
    conn.commit()
    conn.close()
    report = store.verify()
    assert {(p.kind, p.key) for p in report.problems} == {("short_file", ps[0].key)}
    # the next append starts at the file's real end: no 1 TiB sparse file
    store.put(payloads(("c", 10)), kind="combined", combined_name="m")
    assert (store.root / "m_weight_combined").stat().st_size < 4096
    assert store.repair().ok


# -- read-only stores ---------------------------------------------------------------------


def test_a_read_only_store_verifies_and_serves_lookups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from weightstore.store.index import Index

    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="separate")
    monkeypatch.setattr(Index, "writable", lambda self: False)  # as on a read-only mount
    monkeypatch.setattr(Index, "writing", None)  # any write would fail loudly
    ro = WeightStore(store.root)
    assert set(ro.locate([p.key for p in ps])) == {p.key for p in ps}
    assert ro.verify().ok
    assert ro.put(ps, kind="separate").reused_objects == 2


def test_repair_never_deletes_what_it_merely_cannot_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weightstore.store.verify as verify_module

    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="separate")
    locked = store.root / ("weight_" + ps[0].key.split(":")[1])
    real = verify_module.digest_file

    def as_another_user(algo, path, *args):  # a 0600 file of someone else
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(algo, path, *args)

    monkeypatch.setattr(verify_module, "digest_file", as_another_user)
    report = store.repair()
    assert report.dropped == () and report.deleted_files == ()
    assert {p.kind for p in report.found.problems} == {"no_permission"}
    assert locked.read_bytes() == ps[0].data
    monkeypatch.undo()
    assert store.verify().ok


def test_a_symlinked_object_is_damage_and_is_rewritten(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    a, b = payloads(("a", 100), ("b", 100))
    store.put([a], kind="separate")
    obj = store.root / ("weight_" + a.key.split(":")[1])
    outside = tmp_path / "outside"
    outside.write_bytes(a.data)
    obj.unlink()
    obj.symlink_to(outside)
    assert {p.kind for p in store.verify().problems} == {"not_regular_file"}
    assert store.put([a, b], kind="separate").written_objects == 2
    assert not obj.is_symlink() and store.verify().ok


def test_temp_files_no_writer_holds_are_removed_by_repair(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 10)), kind="separate")
    dead = store.root / ".weight_dead.abc.tmp"
    live = store.root / ".weight_live.abc.tmp"
    dead.write_bytes(b"partial")
    live.write_bytes(b"partial")
    os.utime(live, (1, 1))  # however old: its writer still holds it
    with held(live):
        report = store.repair()
    assert report.removed_temps == (dead.name,)
    assert not dead.exists() and live.exists()


def test_repairs_text_output_names_the_temp_files_it_removed(tmp_path: Path, capsys) -> None:
    from weightstore.cli import main

    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 10)), kind="separate")
    old = store.root / ".weight_dead.abc.tmp"
    old.write_bytes(b"partial")
    capsys.readouterr()
    assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert f"removed temp file: {old.name} (left by an interrupted write)" in out, out


def test_a_lost_index_is_rebuilt_from_per_weight_objects(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    sep = payloads(("a", 100), ("b", 0))
    store.put(sep, kind="separate")
    store.put(payloads(("c", 300)), kind="combined", combined_name="m")
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (store.root / name).unlink(missing_ok=True)
    fresh = WeightStore(store.root)
    with pytest.raises(StoreError, match="verify --repair"):
        fresh.lookup(sep[0].key)
    report = fresh.repair()
    assert report.rebuilt == 2
    assert set(store_index(fresh)) == {p.key for p in sep}
    assert {w.kind for w in report.remaining.warnings} == {"orphan_file"}  # the combined file
    assert fresh.verify().ok
    # a broken format 1 meta.json is recovered the same way
    other = tmp_path / "v1"
    write_format1_store(other, sep, {})
    (other / "meta.json").write_text('{"format_version": 1, "hash_to_weight_file": [')
    assert WeightStore(other).repair().rebuilt == 2
    assert set(store_index(WeightStore(other))) == {p.key for p in sep}


def test_repair_of_a_lost_index_says_what_it_did_and_gc_says_it_would_refuse(
        tmp_path: Path, capsys) -> None:
    """The rebuild is reported in the text output too, the intact marker is left alone
    (no ``meta.json.broken`` beside a sound store), and gc's dry run says that the real
    run would refuse a store whose roots went with its index."""
    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 100), ("b", 700)), kind="separate")
    marker = (store.root / "meta.json").read_bytes()
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (store.root / name).unlink(missing_ok=True)
    assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "rebuilt the lost index from 2 per-weight objects" in out
    assert "roots are gone" in out
    assert (store.root / "meta.json").read_bytes() == marker
    assert not (store.root / "meta.json.broken").exists()
    assert main(["store", "gc", "--dry-run", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("refused: the store has no roots") and "--no-roots-ok" in out
    assert main(["store", "gc", "--dry-run", "--json", "--store", str(store.root)]) == 0
    assert "no roots" in json.loads(capsys.readouterr().out)["refused"]
    assert main(["store", "gc", "--store", str(store.root)]) == 2
    assert main(["store", "gc", "--dry-run", "--no-roots-ok", "--store",
                 str(store.root)]) == 0
    assert "refused" not in capsys.readouterr().out


def test_a_read_only_store_serves_a_build_without_writing(
        tmp_path: Path, encoder_model, save_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a read-only mount: every payload present, so the build needs no write."""
    from weightstore.builder.run import BuildOptions, build

    from .helpers import freeze_index, index_bytes
    from .test_build import write_recipe

    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, "\n  - {name: c, external_weight: combined}\n")
    store = tmp_path / "store"
    build(recipe, BuildOptions(store=str(store), jobs=2))
    before = freeze_index(store, monkeypatch)
    result = build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    assert result.store_report["written_objects"] == 0
    assert WeightStore(store).verify().ok
    assert index_bytes(store) == before


def test_a_writer_waiting_for_the_index_names_the_running_builds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import weightstore.store.index as index_module

    monkeypatch.setattr(index_module, "WAIT_REPORT_SECONDS", 0.05)
    builder = WeightStore(tmp_path / "s")
    builder.put(payloads(("a", 1)), kind="separate")
    with builder.leased():
        waiter = WeightStore(tmp_path / "s", lock_timeout=0.3)
        blocker = sqlite3.connect(builder.index_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="timed out"):
                waiter.put(payloads(("b", 1)), kind="separate")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    err = capsys.readouterr().err
    assert f"held by one of: pid {os.getpid()} on " in err
    assert err.count("waiting") >= 2


FORMAT1_STORE = Path(__file__).parent / "data" / "format1-store"
FORMAT1_PAYLOADS = [("s0", 300, "blake3"), ("s1", 5, "blake3"), ("s2", 0, "blake3"),
                    ("c0", 700, "blake3"), ("c1", 64, "blake3"), ("c2", 1500, "blake3"),
                    ("h0", 100, "sha256")]


def test_a_store_written_by_format_1_code_migrates_with_every_object(tmp_path: Path) -> None:
    """``tests/data/format1-store`` was written by weightstore's format 1 store code
    (separate objects, two combined files at alignments 512 and 64, sha256 and blake3)."""
    root = tmp_path / "store"
    shutil.copytree(FORMAT1_STORE, root)
    expected = {BytesPayload.of(blob(label, size), algo).key: blob(label, size)
                for label, size, algo in FORMAT1_PAYLOADS}
    store = WeightStore(root)
    legacy = read_legacy(root / "meta.json")
    assert legacy is not None and set(legacy) == set(expected)
    assert store.verify().ok  # read as it is, before any write
    report = store.put([BytesPayload.of(blob("new", 42))], kind="separate")
    assert report.written_objects == 1
    after = store_index(store)
    assert {k: after[k] for k in legacy} == legacy
    for key, data in expected.items():
        assert store.read(after[key]) == data
    assert store.verify().ok
    assert json.loads((root / "meta.json").read_text())["format_version"] == 2
    # a build-style put of the same payloads writes nothing again
    again = store.put([BytesPayload(k, d) for k, d in expected.items()], kind="combined",
                      combined_name="enc")
    assert again.written_objects == 0


@pytest.mark.parametrize(("column", "value"), [
    ("offset", 1e30), ("offset", 1.5), ("offset", "abc"), ("offset", -64), ("size", "x"),
    ("file", "m_weight\x00_combined"), ("offset", 2**63 - 1), ("file", "sub/m_weight_combined"),
    ("file", "..")])
def test_malformed_rows_are_damage_reported_and_dropped(tmp_path: Path, column: str,
                                                        value: object) -> None:
    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200), ("c", 300))
    store.put(ps, kind="combined", combined_name="m", alignment=64)
    conn = sqlite3.connect(store.index_path)
    conn.execute(f"UPDATE objects SET {column} = ? WHERE key = ?", (value, ps[1].key))
    conn.commit()
    conn.close()
    # an absent key to every reader: located nowhere, written again by the next put
    assert set(store.locate([p.key for p in ps])) == {ps[0].key, ps[2].key}
    assert store.stats().objects == 2
    assert store.plan_gc() is not None and store.roots() == []
    report = store.verify()
    assert [(p.kind, p.key) for p in report.problems] == [("malformed_row", ps[1].key)]
    repaired = store.repair()
    assert [o.key for o in repaired.dropped] == [ps[1].key] and repaired.ok
    assert set(store_index(store)) == {ps[0].key, ps[2].key}
    # a put while the malformed row is still there replaces it
    conn = sqlite3.connect(store.index_path)
    conn.execute("INSERT INTO objects VALUES (?, 'm_weight_combined', 0, 200, 0)",
                 (ps[1].key,))
    conn.execute(f"UPDATE objects SET {column} = ? WHERE key = ?", (value, ps[1].key))
    conn.commit()
    conn.close()
    assert store.put(ps, kind="combined", combined_name="m").written_objects == 1
    assert store.verify().ok


def test_a_range_past_its_files_end_is_judged_alone_not_against_every_row(
        tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    ps = payloads(*((f"p{i}", 100 + i) for i in range(20)))
    store.put(ps, kind="combined", combined_name="m", alignment=64)
    conn = sqlite3.connect(store.index_path)
    conn.execute("UPDATE objects SET size = ? WHERE key = ?", (10**13, ps[3].key))
    conn.commit()
    conn.close()
    report = store.verify()
    assert [(p.kind, p.key) for p in report.problems] == [("short_file", ps[3].key)]
    repaired = store.repair()
    assert [o.key for o in repaired.dropped] == [ps[3].key] and repaired.ok
    assert len(store_index(store)) == 19
    # two rows inside the file that do share bytes are still overlaps
    conn = sqlite3.connect(store.index_path)
    conn.execute("UPDATE objects SET offset = 0 WHERE key = ?", (ps[5].key,))
    conn.commit()
    conn.close()
    assert "overlap" in {p.kind for p in store.verify().problems}


def _store_files(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes (SQLite's shared-memory file only by name: readers write it)."""
    return {p.name: None if p.name.endswith("-shm") else p.read_bytes()
            for p in root.iterdir() if p.is_file()}


def test_repair_of_a_newer_index_touches_nothing(tmp_path: Path, capsys) -> None:
    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 100)), kind="separate")
    store.put(payloads(("b", 100)), kind="combined", combined_name="m")
    conn = sqlite3.connect(store.index_path)
    conn.execute("PRAGMA user_version=3")
    conn.close()
    before = _store_files(store.root)
    assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("weightstore: error: ")
    assert "newer weightstore" in err[0]
    assert _store_files(store.root) == before


_AS_NOBODY = """
import os, sys, locale, gettext, argparse, secrets, json, sqlite3, concurrent.futures
import shutil, tempfile
import weightstore.cli, weightstore.store.repair, weightstore.store.verify
import weightstore.store.sweep, weightstore.store.leases, weightstore.store.meta
import weightstore.io.locks, weightstore.progress
weightstore.cli._parser()  # every command's module, read while the files are readable
os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.exit(weightstore.cli.main(sys.argv[1:]))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to act as another user")
def test_repair_by_a_user_who_may_not_read_the_index_touches_nothing() -> None:
    """index.sqlite 0600 of root in a folder all may write: another user's repair reports
    the permission error and stops; it never sets the index aside as lost."""
    import subprocess
    import sys
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        top.chmod(0o755)
        store = WeightStore(top / "s")
        store.put(payloads(("a", 100)), kind="separate")
        store.put(payloads(("b", 100)), kind="combined", combined_name="m")
        store.root.chmod(0o777)
        for p in store.root.glob("index.sqlite*"):
            p.chmod(0o600)
        before = _store_files(store.root)
        res = subprocess.run([sys.executable, "-c", _AS_NOBODY, "store", "verify",
                              "--repair", "--store", str(store.root)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("weightstore: error: ")
        assert "Permission denied" in lines[0] and "index.sqlite" in lines[0]
        assert _store_files(store.root) == before
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_temp_files_of_the_cache_folders_are_removed_by_gc_and_repair(
        tmp_path: Path) -> None:
    from weightstore.store.gc import execute

    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 10)), kind="separate")
    folders = ("payload-keys", "build-actions", "derived-keys", "locks", "sources/sha256-ab")

    def leave(folder: str) -> tuple[Path, Path]:
        (store.root / folder).mkdir(parents=True, exist_ok=True)
        dead = store.root / folder / ".abc.json.x1.tmp"
        live = store.root / folder / ".abc.json.x2.tmp"
        for p in (dead, live):
            p.write_bytes(b"partial")
        os.utime(live, (1, 1))
        return dead, live

    def swept(left: dict[str, tuple[Path, Path]]) -> bool:
        return all(not dead.exists() and live.exists() for dead, live in left.values())

    left = {folder: leave(folder) for folder in folders}
    kept = store.root / "payload-keys" / "old.json"  # a cache entry, however old
    kept.write_bytes(b"{}")
    os.utime(kept, (1, 1))
    stages = store.root / "sources" / ".source.dead0000.tmp", \
        store.root / "sources" / ".source.live0000.tmp"  # pinned sources' pulls
    for stage in stages:
        (stage / "artifact").mkdir(parents=True)
        (stage / "artifact" / "model.onnx").write_bytes(b"partial")
    with contextlib.ExitStack() as writers:
        for _, live in left.values():
            writers.enter_context(held(live))
        writers.enter_context(held(stages[1]))
        report = store.repair()
        assert set(report.removed_temps) == {*(f"{f}/.abc.json.x1.tmp" for f in folders),
                                             "sources/.source.dead0000.tmp/"}
        assert swept(left) and kept.exists()
        assert not stages[0].exists() and stages[1].exists()
        left = {folder: leave(folder) for folder in folders}
        plan = store.plan_gc()
        assert set(plan.temps) == {f"{f}/.abc.json.x1.tmp" for f in folders}
        execute(plan, store)
        assert swept(left)


def test_a_store_on_a_read_only_mount_serves_a_build_without_the_folder_lock(
        tmp_path: Path, encoder_model, save_model) -> None:
    """A read-only bind mount (where this system lets the test make one): the package
    folder lock cannot be created in the store, and a build whose payloads are all present
    goes on without it."""
    import subprocess

    from weightstore.builder.run import BuildOptions, build

    from .test_build import write_recipe

    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    store, mounted = tmp_path / "store", tmp_path / "ro"
    build(recipe, BuildOptions(store=str(store)))
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", str(store), str(mounted)], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("no bind mounts here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)],
                          capture_output=True, check=False).returncode != 0:
            pytest.skip("no read-only remounts here")
        before = _store_files(store)
        result = build(recipe, BuildOptions(store=str(mounted), force=True))
        assert [p.status for p in result.packages] == ["built"]
        assert result.store_report["written_objects"] == 0
        assert _store_files(store) == before
    finally:
        # lazily: this process may still hold the index open through the mount
        subprocess.run(["umount", "-l", str(mounted)], capture_output=True, check=False)


def test_a_cache_folder_replaced_by_a_symbolic_link_never_leads_a_cleanup_outside(
        tmp_path: Path) -> None:
    """In a group-shared store a member may plant ``payload-keys -> /elsewhere``: gc and
    repair neither list nor delete the temp files found there."""
    from weightstore.store.gc import execute
    from weightstore.store.temps import sweep

    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 10)), kind="separate")
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ".important.data.tmp"
    victim.write_bytes(b"keep me")
    os.utime(victim, (1, 1))
    (store.root / "payload-keys").symlink_to(outside)
    assert not store.repair().removed_temps
    execute(store.plan_gc(), store)
    assert sweep(store.root, names=["payload-keys/.important.data.tmp"]) == []
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("key", [b"blake3:" + b"a" * 64, "blake3:" + "a" * 63 + "\x00",
                                 12345, "not-a-digest-key", "blake3:" + "A" * 64])
def test_a_row_whose_key_is_not_text_is_dropped_by_repair(tmp_path: Path,
                                                          key: object) -> None:
    """A key stored as a BLOB, holding a NUL, or a number is reported by its repr; repair
    finds the row by that and drops it."""
    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="combined", combined_name="m", alignment=64)
    conn = sqlite3.connect(store.index_path)
    conn.execute("UPDATE objects SET key = ? WHERE key = ?", (key, ps[1].key))
    conn.commit()
    conn.close()
    assert [p.kind for p in store.verify().problems] == ["malformed_row"]
    assert store.stats().objects == 1  # counted in SQL by the same rule as every reader
    repaired = store.repair()
    assert len(repaired.dropped) == 1 and repaired.ok
    assert set(store_index(store)) == {ps[0].key}
    assert store.verify().ok


def test_a_new_store_switches_its_index_to_wal_without_waiting(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """The WAL switch of a new index succeeds at once when no other connection is open;
    only a switch that another connection refused is retried after a pause."""
    import weightstore.store.index as index_module

    pauses: list[float] = []
    monkeypatch.setattr(index_module.time, "sleep", pauses.append)
    store = WeightStore(tmp_path / "store")
    store.put(payloads(("a", 700)), kind="separate")
    assert pauses == []
    with sqlite3.connect(tmp_path / "store" / "index.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _traced(tmp_path: Path, body: str, calls: str, before: str = "") -> list[str]:
    """The system calls (``calls``, strace's ``-e trace=`` list) that a fresh process makes
    while it runs ``body`` on ``store`` (``WeightStore(<tmp_path>/store)``): those between
    two marks it writes to stderr, so neither start-up (nor ``before``) nor exit is
    counted."""
    import subprocess
    import sys

    trace = tmp_path / "trace"
    code = ("import os, sys\nfrom weightstore.store import WeightStore\n"
            f"store = WeightStore(sys.argv[1])\n{before}\nos.write(2, b'<<mark>>')\n"
            f"{body}\nos.write(2, b'<<mark>>')\n")
    subprocess.run(["strace", "-f", "-o", str(trace), "-e", f"trace={calls},write",
                    sys.executable, "-c", code, str(tmp_path / "store")],
                   check=True, env=os.environ.copy(), capture_output=True)
    lines = trace.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if "<<mark>>" in line]
    return [line for line in lines[marks[0] + 1:marks[1]] if "write(" not in line]


needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


@needs_strace
def test_a_new_stores_index_writes_one_rollback_journal(tmp_path: Path) -> None:
    """The first write of a new store switches its empty index to WAL straight away: an
    empty transaction before the switch (to wait for writers an empty file never had)
    committed the first page through a rollback journal of its own, four syncs more on
    every fresh store (a pull into a new store among them)."""
    calls = _traced(tmp_path, "with store.leased():\n    pass", "openat")
    journals = [c for c in calls if "index.sqlite-journal" in c and "O_CREAT" in c]
    assert len(journals) == 1, journals
    with sqlite3.connect(tmp_path / "store" / "index.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION


@needs_strace
def test_a_lease_waits_for_no_disk_sync(tmp_path: Path) -> None:
    """A lease's rows die with its process, so opening and closing one commits without
    waiting for the disk (two syncs fewer on each build and pull; a process whose first
    write starts a new journal still pays SQLite's sync of its header); a write that
    records where bytes live still syncs, and the lease is gone once its block ends."""
    WeightStore(tmp_path / "store").put(payloads(("a", 700)), kind="separate")
    # the second lease of the process is traced: the first write of a process may start a
    # new journal, whose header SQLite syncs once (when the put's connection was closed,
    # as Python 3.10 collects it here), which is no commit of the lease's
    lease = "with store.leased():\n    pass"
    syncs = _traced(tmp_path, lease, "fsync,fdatasync", before=lease)
    assert syncs == []
    put = _traced(tmp_path, "from weightstore.store import BytesPayload\n"
                            "store.put([BytesPayload.of(b'x' * 700)], kind='separate')",
                  "fsync,fdatasync")
    assert put
    with sqlite3.connect(tmp_path / "store" / "index.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0


def test_an_index_that_will_not_switch_to_wal_is_an_error_not_a_hang(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """A switch refused for good (another program keeps the file open in its journal mode,
    or a file system without WAL) ends in a StoreError naming the index."""
    import weightstore.store.index as index_module

    monkeypatch.setattr(index_module, "WAL_SWITCH_SECONDS", 0.3)
    root = tmp_path / "s"
    root.mkdir()
    other = sqlite3.connect(root / "index.sqlite", isolation_level=None)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN")
    other.execute("SELECT * FROM t").fetchall()  # a reader holds the file: no switch
    try:
        with pytest.raises(StoreError, match="cannot switch the store index to WAL") as err:
            WeightStore(root).put(payloads(("a", 700)), kind="separate")
        assert err.value.context["journal_mode"] == "delete"
    finally:
        other.execute("COMMIT")
        other.close()


# -- ill-typed values in the tables of the index ------------------------------------------

HOSTILE_RECIPE = """package: pkg
version: "1.0.0"
store: {hash: blake3}
models:
  - {name: m, source: m.onnx}
layouts:
  - {name: c, external_weight: combined, size_threshold: 256}
  - {name: s, external_weight: separate, size_threshold: 256}
output: out
"""
# what SQLite keeps in any column whatever its declared type (a number of 30 digits is
# REAL in an INTEGER column); None where a column allows it (nowhere but a new rowid);
# 2**62 twice: two such sizes in one file overflow a sum of sizes
HOSTILE = (b"\xff\x00", "zz", "", "a\x00b", "9" * 30, 1.5, 1e300, 2**62, 2**62, 2**63 - 1,
           -1, -2**63, None)
INDEX_TABLES = {  # every table of the index: its columns, its primary key
    "objects": (("key", "file", "offset", "size", "created"), ("key",)),
    "roots": (("id", "package", "version", "layout", "folder", "fingerprint", "created",
               "pinned"), ("id",)),
    "root_keys": (("root", "key"), ("root", "key")),
    "leases": (("id", "pid", "host", "started", "created"), ("id",)),
    "lease_keys": (("lease", "key"), ("lease", "key")),
    "sha256_signed": (("key", "sha256", "mac"), ("key",)),
    "blob_repos": (("host", "digest", "repository"), ("host", "digest", "repository")),
}
STORE_TYPES = {"objects": (str, str, int, int, int), "roots": (int, *[str] * 5, int, int),
               "root_keys": (int, str), "leases": (int, int, str, str, int),
               "lease_keys": (int, str)}  # the registry's tables are left to it
RESET_COLUMNS = {("objects", "created"), ("roots", "created"), ("roots", "pinned")}


def _cli(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process: an exit code of 0, 1 or 2, no traceback, an error in one
    line (any other exception escapes and fails the test)."""
    import io

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    text = err.getvalue()
    assert code in (0, 1, 2), (argv, code, text)
    assert "Traceback" not in text, (argv, text)
    if code == 2:
        lines = text.strip().splitlines()
        assert len(lines) == 1, (argv, text)
        if "--json" in argv:
            assert "error" in json.loads(lines[0]), (argv, text)
        else:
            assert lines[0].startswith("weightstore: error: "), (argv, text)
    return code, out.getvalue()


def _rows(index: Path) -> dict[str, set[tuple]]:
    conn = sqlite3.connect(index)
    try:
        return {t: set(conn.execute(f"SELECT {', '.join(cols)} FROM {t}"))
                for t, (cols, _) in INDEX_TABLES.items()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def hostile_base(tmp_path_factory) -> Path:
    """A built recipe (two roots) whose index has more rows than HOSTILE has values in
    every table: pinned roots of folders gone, running builds of another host (leases),
    and what pushes remember."""
    import time

    import onnx

    from weightstore.registry.digests import _TABLES

    from .samples import make_encoder

    base = tmp_path_factory.mktemp("hostile")
    onnx.save_model(make_encoder(seed=0, hidden=32, layers=1), str(base / "m.onnx"))
    (base / "r.yaml").write_text(HOSTILE_RECIPE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(base / "cache"))
        assert main(["build", "-q", str(base / "r.yaml"), "--store",
                     str(base / "store")]) == 0
    conn = sqlite3.connect(base / "store" / "index.sqlite")
    keys = [k for (k,) in conn.execute("SELECT key FROM objects ORDER BY key")]
    assert len(keys) > len(HOSTILE)
    now = int(time.time())
    with conn:
        for statement in _TABLES:
            conn.execute(statement)
        for i in range(len(HOSTILE) + 2):
            cur = conn.execute("INSERT INTO roots (package, version, layout, folder, "
                               "fingerprint, created, pinned) VALUES ('extra', ?, 'c', ?, "
                               "?, ?, 1)", (f"1.{i}", f"/gone/{i}", f"blake3:{i:064x}", now))
            conn.executemany("INSERT INTO root_keys VALUES (?, ?)",
                             [(cur.lastrowid, k) for k in keys[i % 5::5]])
            cur = conn.execute("INSERT INTO leases (pid, host, started, created) "
                               "VALUES (?, 'elsewhere', '1234', ?)", (1000 + i, now))
            conn.executemany("INSERT INTO lease_keys VALUES (?, ?)",
                             [(cur.lastrowid, keys[i]), (cur.lastrowid, keys[-1 - i])])
            conn.execute("INSERT INTO sha256_signed VALUES (?, ?, 'mac')",
                         (keys[i], f"sha256:{i:064x}"))
            conn.execute("INSERT INTO blob_repos VALUES ('registry.example', ?, 'repo')",
                         (f"sha256:{i:064x}",))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return base


def _base_copy(base: Path, to: Path, *sql: str) -> Path:
    """A copy of the base (its roots naming the copy's folders), ``sql`` run on its index;
    returns its store."""
    shutil.copytree(base, to, ignore=shutil.ignore_patterns("cache"))
    conn = sqlite3.connect(to / "store" / "index.sqlite")
    with conn:
        conn.execute("UPDATE roots SET folder = replace(folder, ?, ?)", (str(base), str(to)))
        for statement in sql:
            conn.execute(statement)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return to / "store"


def _hostile_copy(base: Path, to: Path, table: str, column: str,
                  ) -> tuple[Path, dict[str, set[tuple]], list[tuple]]:
    """A copy of the base with one HOSTILE value in ``column`` of as many rows of
    ``table``; the rows before the damage, and the primary keys of the rows damaged."""
    index = _base_copy(base, to) / "index.sqlite"
    conn = sqlite3.connect(index)
    before = _rows(index)
    _, pk = INDEX_TABLES[table]
    order = "file, offset" if table == "objects" else ", ".join(pk)  # combined rows first
    targets = conn.execute(f"SELECT {', '.join(pk)} FROM {table} ORDER BY {order}").fetchall()
    assert len(targets) > len(HOSTILE)
    damaged = []
    for value, target in zip(HOSTILE, targets, strict=False):
        try:
            with conn:
                conn.execute(f"UPDATE {table} SET {column} = ? WHERE "
                             + " AND ".join(f"{c} = ?" for c in pk), (value, *target))
        except sqlite3.Error:  # NOT NULL, a type the column refuses, a duplicate
            continue
        damaged.append(target)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return to / "store", before, damaged


def test_hostile_tables_cover_the_whole_schema(hostile_base: Path) -> None:
    conn = sqlite3.connect(hostile_base / "store" / "index.sqlite")
    tables = {name: [c[1] for c in conn.execute(f"PRAGMA table_info({name})")]
              for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE "
                                          "type = 'table'")}
    conn.close()
    assert tables == {t: list(cols) for t, (cols, _) in INDEX_TABLES.items()}


@pytest.mark.parametrize(("table", "column"), [(t, c) for t, (cols, _) in INDEX_TABLES.items()
                                               for c in cols])
def test_ill_typed_values_in_any_column_are_damage_never_a_traceback(
        hostile_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str,
        column: str) -> None:
    """Every store command on an index with a BLOB, text, a float, a huge or negative
    integer (or NULL) in any column: exit 0, 1 or 2, one line for an error; repair keeps
    every intact row (the rows of a damaged root or lease go with it), a value it can
    reset is reset, and the store is sound again after it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile_base / "cache"))
    store, before, damaged = _hostile_copy(hostile_base, tmp_path / "a", table, column)
    assert damaged
    recipe = str(store.parent / "r.yaml")
    s = ["--store", str(store)]
    if table in STORE_TYPES and (table, column) != ("objects", "created"):
        assert _cli(["store", "verify", *s])[0] == 1  # a damaged row is a problem
    for argv in (["store", "stats"], ["store", "ls"], ["store", "ls", "--json"],
                 ["store", "gc", "--dry-run"],
                 ["store", "export-meta", "--output", str(tmp_path / "meta.json")],
                 ["resolve", "pkg/1.0.0/c"], ["resolve", "pkg/1.0.0/s"]):
        _cli(argv + s)
    code, _ = _cli(["store", "verify", "--repair", *s])
    assert code == 0
    after = _rows(store / "index.sqlite")
    gone = set(damaged)
    for t, rows in before.items():
        cols, key = INDEX_TABLES[t]
        if t == table:
            keep = {r for r in rows if tuple(r[cols.index(c)] for c in key) not in gone}
        elif (table, t) in (("roots", "root_keys"), ("leases", "lease_keys")):
            keep = {r for r in rows if (r[0],) not in gone}  # the rows of a damaged one
        else:
            keep = rows
        assert keep <= after[t], (t, keep - after[t])
    for t, types in STORE_TYPES.items():  # every row left holds what its table says
        for row in after[t]:
            assert tuple(type(v) for v in row) == types, (t, row)
    if (table, column) in RESET_COLUMNS:  # nothing lost: the value is reset, the row kept
        assert len(after[table]) == len(before[table])
    assert _cli(["store", "verify", *s])[0] == 0
    shutil.rmtree(store.parent / "out" / "pkg" / "1.0.0" / "s")
    assert _cli(["build", "-q", recipe, *s])[0] == 0
    assert _cli(["store", "gc", *s])[0] == 0
    assert _cli(["store", "verify", *s])[0] == 0
    # gc and a build on the damaged index itself
    store, _, _ = _hostile_copy(hostile_base, tmp_path / "b", table, column)
    s = ["--store", str(store)]
    shutil.rmtree(store.parent / "out" / "pkg" / "1.0.0" / "s")
    for argv in (["store", "gc"], ["build", "-q", recipe.replace("/a/", "/b/")],
                 ["store", "ls"], ["store", "verify"]):
        _cli(argv + s)


def _cli_json(argv: list[str]) -> tuple[int, Any]:
    code, out = _cli([*argv, "--json"])
    return code, json.loads(out)


@pytest.mark.parametrize("column", ["folder", "package", "version", "layout", "fingerprint"])
def test_a_root_that_is_not_text_is_listed_by_no_reader_and_dropped_by_repair(
        hostile_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        column: str) -> None:
    """A BLOB where a root names its package or folder: ls lists the other roots and says
    one is damaged, a store reference to the other build resolves, gc keeps every object
    the damaged root names, verify reports it, repair drops it with its keys and keeps
    the rest, and the next build registers the package again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile_base / "cache"))
    store = _base_copy(hostile_base, tmp_path / "w",
                       f"UPDATE roots SET {column} = x'ff' WHERE layout = 'c' AND id < 3")
    s = ["--store", str(store)]
    before = _rows(store / "index.sqlite")
    code, out = _cli(["store", "ls", *s])
    assert code == 0 and "1 damaged" in out and "/pkg/1.0.0/s" in out
    assert "/pkg/1.0.0/c" not in out
    assert _cli(["resolve", "pkg/1.0.0/s", *s])[0] == 0
    assert _cli(["resolve", "pkg/1.0.0/c", *s])[0] == 2  # no build matches: one line
    assert _cli(["store", "pin", "9" * 40, *s])[0] == 2  # no root has such an id
    code, plan = _cli_json(["store", "gc", "--dry-run", *s])
    assert code == 0 and plan["garbage_objects"] == 0 and plan["damaged_rows"] == 1
    assert _cli(["store", "gc", *s])[0] == 0
    assert _rows(store / "index.sqlite")["objects"] == before["objects"]
    code, report = _cli_json(["store", "verify", *s])
    assert code == 1
    assert [(p["kind"], p["detail"].split(":")[0]) for p in report["problems"]] == [
        ("malformed_root", "roots row 1")]
    code, repaired = _cli_json(["store", "verify", "--repair", *s])
    assert code == 0
    assert [(f["table"], f["row"], f["action"]) for f in repaired["fixed_rows"]] == [
        ("roots", "1", "dropped")]
    after = _rows(store / "index.sqlite")
    assert {r[0] for r in after["roots"]} == {r[0] for r in before["roots"]} - {1}
    assert after["root_keys"] == {r for r in before["root_keys"] if r[0] != 1}
    assert after["objects"] == before["objects"] and after["leases"] == before["leases"]
    assert _cli(["build", "-q", str(store.parent / "r.yaml"), *s])[0] == 0
    assert _cli(["resolve", "pkg/1.0.0/c", *s])[0] == 0
    assert _cli(["store", "verify", *s])[0] == 0


def test_a_root_whose_time_or_pin_is_damaged_is_kept_by_repair(
        hostile_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile_base / "cache"))
    store = _base_copy(hostile_base, tmp_path / "w",
                       "UPDATE roots SET created = 'x' WHERE id = 1",
                       "UPDATE roots SET pinned = 1e300 WHERE id = 2")
    s = ["--store", str(store)]
    code, report = _cli_json(["store", "verify", *s])
    assert code == 1 and sorted(p["kind"] for p in report["problems"]) == [
        "malformed_root", "malformed_root"]
    code, repaired = _cli_json(["store", "verify", "--repair", *s])
    assert code == 0
    assert [(f["row"], f["action"]) for f in repaired["fixed_rows"]] == [
        ("1", "reset"), ("2", "reset")]
    rows = {r[0]: r for r in _rows(store / "index.sqlite")["roots"]}
    assert type(rows[1][6]) is int and rows[1][7] == 0  # a time of now, still unpinned
    assert rows[2][7] == 1  # a pin it may have had is kept: its objects stay
    code, roots = _cli_json(["store", "ls", *s])
    assert {(r["id"], r["pinned"]) for r in roots} >= {(1, False), (2, True)}


def test_a_damaged_lease_is_never_believed_gc_keeps_its_keys_and_repair_drops_it(
        tmp_path: Path) -> None:
    """A lease whose created is text (a foreign host's) or whose pid is no process id
    (this host's, which gc would signal): gc and repair run, gc keeps the keys it holds,
    verify reports it, repair drops it with its keys; the writer waiting for the index
    names it without failing."""
    import time

    from weightstore.store.leases import host_name

    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="combined", combined_name="m")
    conn = sqlite3.connect(store.index_path)
    with conn:
        conn.execute("INSERT INTO leases (id, pid, host, started, created) "
                     "VALUES (7, 1, 'elsewhere', 's', 'zz')")
        conn.execute("INSERT INTO leases (id, pid, host, started, created) "
                     "VALUES (8, ?, ?, '', ?)", (2**40, host_name(), int(time.time())))
        conn.execute("INSERT INTO lease_keys VALUES (7, ?)", (ps[0].key,))
        conn.execute("INSERT INTO lease_keys VALUES (8, ?)", (ps[1].key,))
    conn.close()
    s = ["--store", str(store.root)]
    code, plan = _cli_json(["store", "gc", "--dry-run", "--no-roots-ok", *s])
    assert code == 0 and plan["garbage_objects"] == 0 and plan["damaged_rows"] == 2
    assert _cli(["store", "gc", "--no-roots-ok", *s])[0] == 0
    assert set(store_index(store)) == {p.key for p in ps}
    with store.index.reading() as snapshot:
        waiting = store.index._writers(snapshot)
    assert "pid 1 on elsewhere since 'zz'" in waiting
    code, report = _cli_json(["store", "verify", *s])
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["malformed_lease"] * 2
    code, repaired = _cli_json(["store", "verify", "--repair", *s])
    assert code == 0 and [f["row"] for f in repaired["fixed_rows"]] == ["7", "8"]
    conn = sqlite3.connect(store.index_path)
    assert conn.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM lease_keys").fetchone()[0] == 0
    conn.close()
    assert _cli(["store", "gc", "--no-roots-ok", *s])[0] == 0
    assert store_index(store) == {}


@pytest.mark.parametrize("sql", [
    "UPDATE objects SET size = 4611686018427387904, offset = 0 WHERE key IN "
    "(SELECT key FROM objects WHERE file LIKE '%combined' ORDER BY key LIMIT 2)",
    "UPDATE objects SET size = 9223372036854775807, offset = 0 WHERE key IN "
    "(SELECT key FROM objects WHERE file LIKE '%combined' ORDER BY key LIMIT 1)"])
def test_sizes_whose_sum_overflows_are_damaged_rows_not_a_damaged_index(
        hostile_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str,
        ) -> None:
    """Rows that each fit SQLite's integers but whose sizes overflow a sum: every command
    reads the index, verify reports exactly those rows (ranges past their file's end),
    and repair drops exactly them: no index set aside, no combined row or root lost."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile_base / "cache"))
    store = _base_copy(hostile_base, tmp_path / "w", sql)
    s = ["--store", str(store)]
    before = _rows(store / "index.sqlite")
    huge = {r[0] for r in before["objects"] if r[3] > 2**61}
    assert huge
    for argv in (["store", "stats"], ["store", "ls"], ["store", "gc", "--dry-run"]):
        assert _cli(argv + s)[0] == 0
    code, report = _cli_json(["store", "verify", *s])
    assert code == 1
    assert sorted((p["kind"], p["key"]) for p in report["problems"]) == sorted(
        ("short_file", key) for key in huge)
    code, repaired = _cli_json(["store", "verify", "--repair", *s])
    assert code == 0 and repaired["rebuilt"] is None
    assert sorted(o["key"] for o in repaired["dropped"]) == sorted(huge)
    after = _rows(store / "index.sqlite")
    assert after["objects"] == {r for r in before["objects"] if r[0] not in huge}
    assert after["roots"] == before["roots"] and after["root_keys"] == before["root_keys"]
    assert not [p for p in store.iterdir() if p.name.endswith(".broken")]
    assert _cli(["build", "-q", str(store.parent / "r.yaml"), "--force", *s])[0] == 0
    assert _cli(["store", "verify", *s])[0] == 0


def test_repair_never_sets_aside_a_readable_index(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A verification that fails on an index SQLite reads whole (here: an aggregate that
    fails) is an error, with nothing changed: the rows of a readable index are never put
    aside for a rebuild from per-weight objects."""
    from weightstore.store.index import Index

    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 100)), kind="separate")
    store.put(payloads(("b", 100), ("c", 50)), kind="combined", combined_name="m")
    before = _store_files(store.root)

    def overflow(conn):
        raise StoreError("the store index is damaged: integer overflow", path="x")

    monkeypatch.setattr(Index, "files", staticmethod(overflow))
    with pytest.raises(StoreError, match="integer overflow"):
        WeightStore(store.root).repair()
    assert _store_files(store.root) == before


@pytest.mark.parametrize(("sql", "restored"), [
    ("DROP TABLE roots", ["roots"]), ("DROP TABLE leases", ["leases"]),
    ("DROP TABLE root_keys", ["root_keys", "root_keys_by_key"]),
    ("DROP INDEX objects_by_file", ["objects_by_file"]),
    ("ALTER TABLE objects DROP COLUMN created", ["objects.created"]),
    ("ALTER TABLE roots DROP COLUMN pinned", ["roots.pinned"]),
    ("ALTER TABLE roots DROP COLUMN package", ["roots.package"]),
    ("ALTER TABLE leases DROP COLUMN created", ["leases.created"]),
    ("PRAGMA user_version = 0", ["user_version"])])
def test_repair_restores_what_a_readable_index_lost_of_its_schema(
        hostile_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str,
        restored: list[str]) -> None:
    """A table, index, column or format version lost: repair brings it back and keeps
    every row (of the table that lost a column naming a root or lease, what can no
    longer be what a build wrote is dropped); the store then works."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile_base / "cache"))
    store = _base_copy(hostile_base, tmp_path / "w", sql)
    s = ["--store", str(store)]
    before = {r[0] for r in _rows(hostile_base / "store" / "index.sqlite")["objects"]}
    code, repaired = _cli_json(["store", "verify", "--repair", *s])
    assert code == 0 and repaired["rebuilt"] is None
    assert repaired["restored_schema"] == restored
    after = _rows(store / "index.sqlite")
    assert {r[0] for r in after["objects"]} == before
    if "roots" not in sql:
        assert len(after["roots"]) == len(HOSTILE) + 4
    assert not [p for p in store.iterdir() if p.name.endswith(".broken")]
    for argv in (["store", "gc", "--dry-run"], ["store", "verify"], ["store", "ls"],
                 ["build", "-q", str(store.parent / "r.yaml")], ["store", "gc"],
                 ["store", "verify"]):
        assert _cli(argv + s)[0] == 0, argv


def test_a_rebuild_writes_the_new_index_not_the_one_it_set_aside(tmp_path: Path) -> None:
    """An index SQLite cannot read (a damaged page) is rebuilt although the repair had it
    open: the new index is written, not the old file renamed beside it."""
    store = WeightStore(tmp_path / "s")
    sep = payloads(*((f"s{i}", 100 + i) for i in range(50)))
    store.put(sep, kind="separate")
    store.put(payloads(*((f"c{i}", 100 + i) for i in range(50))), kind="combined",
              combined_name="m")
    conn = sqlite3.connect(store.index_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(store.index_path.read_bytes())
    raw[page + 8:2 * page] = bytes(page - 8)  # the objects table's first page
    store.index_path.write_bytes(bytes(raw))
    fresh = WeightStore(store.root)
    with pytest.raises(StoreError, match="damaged"):
        fresh.verify()
    report = fresh.repair()
    assert report.rebuilt == len(sep) and report.ok
    assert set(store_index(WeightStore(store.root))) == {p.key for p in sep}
    assert (store.root / "index.sqlite.broken").exists()


@pytest.mark.parametrize("content", [b'{"format_version": 1, "hash_to_weight_file": {}}',
                                     b"garbage{", b'{"format_version": 2}', b"", b"[]"])
def test_a_meta_json_an_older_version_could_take_for_its_index_is_put_back(
        tmp_path: Path, content: bytes) -> None:
    """With the index intact, a meta.json that is neither the marker nor an export (an
    older weightstore would write its format 1 maps there, beside the index) is a verify
    warning; repair writes the marker again and keeps what was there as meta.json.broken,
    and so does the next writer."""
    from weightstore.store.meta import is_marker

    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 700)), kind="separate")
    store.meta_path.write_bytes(content)
    report = store.verify()
    assert report.ok and [w.kind for w in report.warnings] == ["stale_marker"]
    fresh = WeightStore(store.root)
    repaired = fresh.repair()
    assert repaired.restored_marker and is_marker(fresh.meta_path)
    if content:
        assert (store.root / "meta.json.broken").read_bytes() == content
    assert not fresh.verify().warnings
    store.meta_path.write_bytes(content)
    WeightStore(store.root).put(payloads(("b", 900)), kind="separate")
    assert is_marker(store.meta_path)


def test_an_exported_meta_json_is_current_and_kept(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "s")
    store.put(payloads(("a", 700)), kind="separate")
    store.export_meta()
    exported = store.meta_path.read_bytes()
    assert b"hash_to_weight_file" in exported
    report = WeightStore(store.root).repair()
    assert not report.restored_marker and store.meta_path.read_bytes() == exported
    assert not WeightStore(store.root).verify().warnings


# -- upgrades: a format 1 store, an index of an old version --------------------------------


def as_format1(root: Path) -> dict[str, StoredObject]:
    """Turn a store into the one format 1 code would have left: its index in meta.json,
    no SQLite file, no roots."""
    store = WeightStore(root)
    index = store_index(store)
    store.index.close()
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        with contextlib.suppress(FileNotFoundError):
            (root / name).unlink()
    (root / "meta.json").write_bytes(encode_legacy(index))
    return index


def test_an_up_to_date_build_migrates_a_format_1_store_and_gc_then_runs(
        encoder_model, save_model, tmp_path: Path, capsys) -> None:
    from .test_build import write_recipe

    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    root = tmp_path / "store"
    assert main(["-q", "build", str(recipe), "--store", str(root)]) == 0
    index = as_format1(root)
    assert main(["build", str(recipe), "--store", str(root)]) == 0
    assert "up-to-date" in capsys.readouterr().out
    store = WeightStore(root)
    assert store.index_path.is_file() and read_legacy(store.meta_path) is None  # migrated
    assert store_index(store) == index  # every object kept, where it was
    assert [r.live for r in store.roots()] == [True]  # the package is a root again
    capsys.readouterr()
    assert main(["store", "gc", "--store", str(root)]) == 0  # no refusal: a root keeps it
    assert store_index(store) == index and store.verify().ok


def test_gc_migrates_a_format_1_store_every_object_kept(v1_store, capsys) -> None:
    store, index, _ = v1_store
    assert main(["store", "gc", "--dry-run", "--store", str(store.root)]) == 0
    assert not store.index_path.exists()  # a dry run changes nothing
    assert main(["store", "gc", "--store", str(store.root)]) == 2  # no roots: refused
    assert "has no roots" in capsys.readouterr().err
    assert store.index_path.is_file() and read_legacy(store.meta_path) is None
    assert store_index(WeightStore(store.root)) == index
    assert WeightStore(store.root).verify().ok


def test_repair_of_a_format_1_store_migrates_it_and_sets_nothing_aside(v1_store,
                                                                      capsys) -> None:
    store, index, _ = v1_store
    assert main(["store", "verify", "--store", str(store.root)]) == 0
    assert "stale_marker" not in capsys.readouterr().out  # meta.json is its index here
    assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 0
    assert not list(store.root.glob("*.broken"))
    assert store_index(WeightStore(store.root)) == index  # combined objects too
    assert main(["store", "verify", "--store", str(store.root)]) == 0


@pytest.mark.parametrize("version", [0, 1])
def test_an_index_that_lost_its_version_is_named_so_and_repair_restores_it(
        tmp_path: Path, version: int, capsys) -> None:
    store = WeightStore(tmp_path / "s")
    ps = payloads(("a", 100), ("b", 200))
    store.put(ps, kind="separate")
    store.index.close()
    conn = sqlite3.connect(store.index_path)
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()
    for argv in (["store", "stats"], ["store", "verify"], ["store", "gc", "--no-roots-ok"]):
        assert main([*argv, "--store", str(store.root)]) == 2
        err = capsys.readouterr().err
        assert f"says format version {version}, not 2" in err, err
        assert "missing" not in err and "verify --repair" in err
    with pytest.raises(StoreError, match=f"format version {version}, not 2"):
        WeightStore(store.root).put(payloads(("c", 10)), kind="separate")
    assert main(["store", "verify", "--repair", "--store", str(store.root)]) == 0
    after = WeightStore(store.root)
    assert set(store_index(after)) == {p.key for p in ps} and after.verify().ok
