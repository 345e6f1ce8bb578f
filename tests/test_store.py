"""Tests for the content-addressed weight store (layout, dedup, crash safety, verify, stats)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filelock import FileLock, Timeout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weightstore.store.core as store_module
import weightstore.store.writer as writer_module
from weightstore.cli import main
from weightstore.errors import IntegrityError, StoreError
from weightstore.io import files as fsio
from weightstore.io.digests import digest_bytes, make_key
from weightstore.io.files import align_up
from weightstore.store import (
    FORMAT_VERSION,
    BytesPayload,
    FilePayload,
    StoredObject,
    WeightStore,
    resolve_store_path,
    user_cache_dir,
)
from weightstore.store.index import Index
from weightstore.store.meta import read_legacy as read_index

from .helpers import (
    assert_ge_reads_keys,
    needs_removable_locks,
    set_row,
    store_files,
    store_index,
)
from .test_build import write_recipe

# -- helpers ------------------------------------------------------------------------------


def blob(label: str, size: int) -> bytes:
    """Deterministic, distinct bytes per label."""
    seed = label.encode() + b"\x00"
    return (seed * (size // len(seed) + 1))[:size]


def payloads(*specs: tuple[str, int], algo: str = "blake3") -> list[BytesPayload]:
    return [BytesPayload.of(blob(label, size), algo) for label, size in specs]


@dataclass
class FlakyPayload:
    """A payload whose read() raises: stands in for a crash in the middle of a put."""

    inner: BytesPayload
    calls: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.inner.key

    @property
    def size(self) -> int:
        return self.inner.size

    def read(self) -> bytes:
        self.calls.append(self.key)
        raise RuntimeError("injected failure")

    def file_range(self) -> None:
        return None

    def describe(self) -> str:
        return "a source that fails when read"


@dataclass(frozen=True)
class LyingPayload:
    """Claims a size its read() does not deliver."""

    key: str
    size: int
    data: bytes

    def read(self) -> bytes:
        return self.data

    def file_range(self) -> None:
        return None

    def describe(self) -> str:
        return "a source shorter than it claims"


@dataclass(frozen=True)
class ImpostorPayload:
    """The right key and size, other bytes: a source that changed after it was hashed."""

    key: str
    size: int
    data: bytes

    @classmethod
    def of(cls, real: BytesPayload) -> ImpostorPayload:
        other = bytes(b ^ 0x5A for b in real.data)
        return cls(key=real.key, size=real.size, data=other)

    def read(self) -> bytes:
        return self.data

    def file_range(self) -> None:
        return None

    def describe(self) -> str:
        return "a source that changed after it was hashed"


def temp_files(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.startswith("."))


def assert_index_complete(store: WeightStore) -> None:
    """Every index entry's bytes are present and hash to its key."""
    for key, obj in store_index(store).items():
        algo, hex_digest = key.split(":")
        assert digest_bytes(algo, store.read(obj)) == hex_digest


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def store(tmp_path: Path) -> WeightStore:
    return WeightStore(tmp_path / "store")


# -- basic layout -------------------------------------------------------------------------


def test_root_is_created_with_parents_by_the_first_put(tmp_path: Path) -> None:
    s = WeightStore(tmp_path / "a" / "b" / "c")
    assert not (tmp_path / "a").exists()
    assert store_index(s) == {}
    assert s.lookup(make_key("blake3", "0" * 64)) is None
    s.put(payloads(("a", 10)), kind="separate")
    assert s.root.is_dir()
    assert s.verify().ok


def test_reading_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    s = WeightStore(tmp_path / "typo" / "a" / "b")
    for call in (s.stats, s.verify, s.repair):
        with pytest.raises(StoreError, match="no store") as exc:
            call()
        assert exc.value.context["path"] == str(s.root)
    assert store_index(s) == {}
    assert os.listdir(tmp_path) == []
    # Nor does verifying a folder no writer ever touched (no index, no lock file).
    (tmp_path / "empty").mkdir()
    e = WeightStore(tmp_path / "empty")
    assert e.verify().ok and e.stats().objects == 0
    assert os.listdir(e.root) == []


def test_empty_put_creates_the_root(tmp_path: Path) -> None:
    s = WeightStore(tmp_path / "s")
    assert s.put([], kind="separate").written_objects == 0
    assert s.root.is_dir() and os.listdir(s.root) == []


def test_root_under_a_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    s = WeightStore(tmp_path / "f" / "store")
    with pytest.raises(StoreError) as exc:
        s.put(payloads(("a", 1)), kind="separate")
    assert exc.value.context["path"] == str(s.root)


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "not_a_dir"
    f.write_bytes(b"x")
    with pytest.raises(StoreError) as exc:
        WeightStore(f)
    assert exc.value.context["path"] == str(f)


def test_put_separate_writes_one_file_per_weight(store: WeightStore) -> None:
    ps = payloads(("a", 1000), ("b", 3), ("c", 0)) + payloads(("d", 77), algo="sha256")
    report = store.put(ps, kind="separate")
    assert report.written_objects == 4
    assert report.written_bytes == 1080
    assert (report.reused_objects, report.reused_bytes, report.padding_bytes) == (0, 0, 0)
    assert list(report.objects) == [p.key for p in ps]
    for p in ps:
        obj = report.objects[p.key]
        assert obj == StoredObject(p.key, "weight_" + p.key.split(":")[1], 0, p.size)
        assert obj.kind == "separate"
        assert (store.root / obj.file).read_bytes() == p.data
        assert store.lookup(p.key) == obj
        assert store.read(obj) == p.data
        assert store.path_of(obj) == store.root / obj.file
    assert temp_files(store.root) == []


def test_export_meta_is_ge_shaped_deterministic_and_relative(store: WeightStore,
                                                             tmp_path: Path) -> None:
    ps = payloads(("x", 10), ("y", 600))
    store.put(ps[:1], kind="separate")
    store.put(ps[1:], kind="combined", combined_name="enc", alignment=64)
    # the store's own meta.json is a marker that format 1 readers refuse
    assert json.loads(store.meta_path.read_text())["format_version"] == FORMAT_VERSION
    with pytest.raises(StoreError, match="newer"):
        _v1_read(store.meta_path)
    path, count = store.export_meta(tmp_path / "meta.json")
    assert count == 2
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert doc == {
        "format_version": FORMAT_VERSION,
        "hash_to_weight_file": {ps[0].key: "weight_" + ps[0].key[7:],
                                ps[1].key: "enc_weight_combined"},
        "hash_to_weight_offset": {ps[0].key: 0, ps[1].key: 0},
        "hash_to_weight_size": {ps[0].key: 10, ps[1].key: 600},
        "index": "index.sqlite",
    }
    assert raw == (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()
    assert store.export_meta()[0] == store.meta_path
    assert store.meta_path.read_bytes() == raw
    empty = WeightStore(tmp_path / "empty")
    empty.put([], kind="separate")
    doc = json.loads(empty.export_meta()[0].read_bytes())
    assert doc["hash_to_weight_file"] == {} and doc["hash_to_weight_size"] == {}
    # an output in a missing folder is named as given, never by its temp file
    with pytest.raises(FileNotFoundError) as info:
        store.export_meta(tmp_path / "missing" / "m.json")
    assert info.value.filename == str(tmp_path / "missing" / "m.json")


# -- export-meta exports only what it proved ------------------------------------------


def _tamper_offset(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    """Point x's row at y's range, same size: GE would read y's bytes for x."""
    x, y = store.lookup(ps[0].key), store.lookup(ps[1].key)
    set_row(store, x.key, offset=y.offset)
    return x.key, x.file, y.offset


def _tamper_size(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    x = store.lookup(ps[0].key)
    set_row(store, x.key, size=x.size - 8)
    return x.key, x.file, x.offset


def _tamper_file(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    """x's row names the per-weight file of z, at offset 0."""
    x, z = store.lookup(ps[0].key), store.lookup(ps[2].key)
    set_row(store, x.key, file=z.file, offset=0, size=z.size)
    return x.key, z.file, 0


def _tamper_bytes(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    """Another user of the store flips one byte of x in its combined file."""
    x = store.lookup(ps[0].key)
    flip_byte(store.root / x.file, x.offset + 5)
    return x.key, x.file, x.offset


def _tamper_past_end(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    y = store.lookup(ps[1].key)
    set_row(store, y.key, offset=y.offset + 4096)
    return y.key, y.file, y.offset + 4096


def _malformed_row(store: WeightStore, ps: list[BytesPayload]) -> tuple[str, str, int]:
    """A row whose offset is text: every reader takes the key as absent; an export
    without it would leave GE a map that silently lacks a weight."""
    x = store.lookup(ps[0].key)
    set_row(store, x.key, offset="sixty-four")
    return x.key, x.file, None


@pytest.mark.parametrize("tamper", [_tamper_offset, _tamper_size, _tamper_file, _tamper_bytes,
                                    _tamper_past_end, _malformed_row])
def test_export_meta_refuses_an_index_its_objects_do_not_prove(
        store: WeightStore, tmp_path: Path, tamper, capsys: pytest.CaptureFixture[str]) -> None:
    ps = payloads(("x", 600), ("y", 600), ("z", 600))
    store.put(ps[:2], kind="combined", combined_name="enc", alignment=64)
    store.put(ps[2:], kind="separate")
    out = tmp_path / "ge" / "meta.json"
    out.parent.mkdir()
    out.write_bytes(b"the user's earlier export\n")
    marker = store.meta_path.read_bytes()
    key, file, offset = tamper(store, ps)
    with pytest.raises(IntegrityError) as info:
        store.export_meta(out)
    assert info.value.context["key"] == key
    assert info.value.context["file"] == file
    assert info.value.context.get("offset") == offset
    assert out.read_bytes() == b"the user's earlier export\n"  # nothing written
    assert sorted(os.listdir(out.parent)) == ["meta.json"]
    # the command line: one line naming key, file and offset; exit 2; nothing written
    code = main(["store", "export-meta", "--store", str(store.root)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert key in err and f"file={file}" in err and "nothing written" in err
    if offset is not None:
        assert f"offset={offset}" in err
    assert store.meta_path.read_bytes() == marker
    # once repaired, the export holds only what the objects prove
    store.repair()
    path, count = store.export_meta(out)
    doc = json.loads(path.read_bytes())
    assert count == len(doc["hash_to_weight_file"]) == len(store_index(store))
    assert_ge_reads_keys(store.root, doc)


def _v1_read(path: Path) -> None:
    """What weightstore 0.x (format 1) does with a format 2 meta.json: refuse it."""
    doc = json.loads(path.read_text())
    if doc["format_version"] > 1:
        raise StoreError("store index was written by a newer weightstore; upgrade to read it")


def test_store_is_relocatable(store: WeightStore, tmp_path: Path) -> None:
    ps = payloads(("x", 10), ("y", 600))
    store.put(ps, kind="combined", combined_name="m")
    moved = WeightStore(shutil.copytree(store.root, tmp_path / "elsewhere"))
    for p in ps:
        obj = moved.lookup(p.key)
        assert obj is not None
        assert moved.read(obj) == p.data
    assert moved.verify().ok


def test_put_combined_aligns_and_zero_pads(store: WeightStore) -> None:
    ps = payloads(("a", 100), ("b", 64), ("c", 0), ("d", 1))
    report = store.put(ps, kind="combined", combined_name="enc", alignment=64)
    offsets = [report.objects[p.key].offset for p in ps]
    assert offsets == [0, 128, 192, 192]
    assert report.padding_bytes == 28
    data = (store.root / "enc_weight_combined").read_bytes()
    assert len(data) == 193
    assert data[100:128] == bytes(28)
    for p in ps:
        assert store.read(report.objects[p.key]) == p.data
    # A second call appends after the current end, aligned again.
    more = payloads(("e", 5))
    report2 = store.put(more, kind="combined", combined_name="enc", alignment=64)
    assert report2.objects[more[0].key].offset == 256
    assert report2.padding_bytes == 256 - 193


def test_empty_payload_at_the_end_lies_inside_the_file(store: WeightStore) -> None:
    ps = payloads(("a", 3), ("empty", 0))
    report = store.put(ps, kind="combined", combined_name="m", alignment=512)
    assert report.objects[ps[1].key].offset == 512
    assert (store.root / "m_weight_combined").stat().st_size == 512
    assert store.read(report.objects[ps[1].key]) == b""
    assert store.put(ps, kind="combined", combined_name="m").written_objects == 0
    assert store.verify().ok


# -- deduplication ------------------------------------------------------------------------


def test_duplicates_within_one_call_are_written_once(store: WeightStore) -> None:
    a, b = payloads(("a", 50), ("b", 70))
    report = store.put([a, b, a, a, b], kind="combined", combined_name="m", alignment=16)
    assert report.written_objects == 2
    assert report.written_bytes == 120
    assert list(report.objects) == [a.key, b.key]
    assert (store.root / "m_weight_combined").stat().st_size == 64 + 70


@pytest.mark.parametrize("first", ["separate", "combined"])
@pytest.mark.parametrize("second", ["separate", "combined"])
def test_present_keys_are_reused_across_calls_and_kinds(store: WeightStore, first: str,
                                                         second: str) -> None:
    a, b, c = payloads(("a", 50), ("b", 70), ("c", 90))
    r1 = store.put([a, b], kind=first, combined_name="m1" if first == "combined" else None)
    r2 = store.put([b, c, a], kind=second,
                   combined_name="m2" if second == "combined" else None)
    assert (r2.written_objects, r2.written_bytes) == (1, 90)
    assert (r2.reused_objects, r2.reused_bytes) == (2, 120)
    assert r2.objects[a.key] == r1.objects[a.key]
    assert r2.objects[b.key] == r1.objects[b.key]
    assert list(r2.objects) == [b.key, c.key, a.key]
    assert store.stats().objects == 3


def test_separate_results_do_not_depend_on_thread_count(tmp_path: Path) -> None:
    ps = payloads(*[(f"p{i}", i * 13) for i in range(40)])
    one, many = WeightStore(tmp_path / "one"), WeightStore(tmp_path / "many")
    r1 = one.put(ps, kind="separate", jobs=1)
    r8 = many.put(ps, kind="separate", jobs=8)
    assert list(r1.objects.items()) == list(r8.objects.items())
    assert store_index(one) == store_index(many)


def test_missing_or_damaged_objects_are_written_again(store: WeightStore) -> None:
    a, b = payloads(("a", 50), ("b", 70))
    r = store.put([a, b], kind="separate")
    (store.root / r.objects[a.key].file).unlink()
    with open(store.root / r.objects[b.key].file, "ab") as f:
        f.write(b"junk")  # a per-weight object must have exactly its size
    again = store.put([a, b], kind="separate")
    assert again.written_objects == 2
    assert store.verify().ok

    c = payloads(("c", 100))[0]
    rc = store.put([c], kind="combined", combined_name="m", alignment=8)
    os.truncate(store.root / "m_weight_combined", 50)
    again = store.put([c], kind="combined", combined_name="m", alignment=8)
    assert again.written_objects == 1
    # Appended at the file's real end: an entry claiming more is damage, never a reason
    # to write past the end.
    assert again.objects[c.key].offset == 56 != rc.objects[c.key].offset
    assert store.read(again.objects[c.key]) == c.data
    assert store.verify().ok


def test_file_payloads_are_copied_by_range(store: WeightStore, tmp_path: Path) -> None:
    src = tmp_path / "model.data"
    data = blob("big", 5000)
    src.write_bytes(b"\xaa" * 123 + data + b"\xbb" * 7)
    key = make_key("sha256", digest_bytes("sha256", data))
    fp = FilePayload(key=key, size=len(data), path=str(src), offset=123)
    assert fp.read() == data
    rs = store.put([fp], kind="separate")
    assert store.read(rs.objects[key]) == data
    other = WeightStore(tmp_path / "other")
    rc = other.put([fp], kind="combined", combined_name="m")
    assert other.read(rc.objects[key]) == data
    assert store.verify().ok and other.verify().ok


# -- argument and input validation --------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"kind": "combined", "combined_name": "m", "alignment": 3},
    {"kind": "combined", "combined_name": "m", "alignment": 0},
    {"kind": "combined", "combined_name": "m", "alignment": -8},
    {"kind": "combined", "combined_name": "m", "alignment": 1 << 21},
    {"kind": "combined", "combined_name": "m", "alignment": 1 << 62},
    {"kind": "combined", "combined_name": "../up"},
    {"kind": "combined", "combined_name": "a/b"},
    {"kind": "combined", "combined_name": ".hidden"},
    {"kind": "combined", "combined_name": ""},
    {"kind": "combined"},
    {"kind": "separate", "combined_name": "m"},
    {"kind": "other"},
    {"kind": "separate", "jobs": 0},
])
def test_bad_arguments_raise_value_error(store: WeightStore, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        store.put(payloads(("a", 1)), **kwargs)
    assert not store.root.exists()


def test_malformed_payload_keys_and_sizes(store: WeightStore) -> None:
    good = payloads(("a", 10))[0]
    with pytest.raises(IntegrityError):
        store.put([BytesPayload("blake3:ABC", b"x")], kind="separate")
    with pytest.raises(IntegrityError):
        store.put([LyingPayload(good.key, 11, good.data)], kind="separate")
    with pytest.raises(IntegrityError):
        store.put([good, LyingPayload(good.key, 11, good.data)], kind="separate")
    store.put([good], kind="separate")
    with pytest.raises(IntegrityError):  # same key, different size than what is stored
        store.put([LyingPayload(good.key, 12, good.data + b"xx")], kind="separate")
    with pytest.raises(IntegrityError):
        store.lookup("nope")
    assert temp_files(store.root) == []


def test_short_payload_file_is_an_integrity_error(store: WeightStore, tmp_path: Path) -> None:
    src = tmp_path / "short.bin"
    src.write_bytes(b"x" * 10)
    fp = FilePayload(key=make_key("blake3", "1" * 64), size=100, path=str(src))
    for kind, name in (("separate", None), ("combined", "m")):
        with pytest.raises(IntegrityError):
            store.put([fp], kind=kind, combined_name=name)
    assert store_files(store.root) == []


def test_partly_copied_payload_is_cut_off_the_combined_file(store: WeightStore,
                                                            tmp_path: Path) -> None:
    src = tmp_path / "short.bin"
    src.write_bytes(b"x" * 1000)
    good = payloads(("a", 100), ("b", 300))
    short = FilePayload(key=make_key("blake3", "1" * 64), size=5000, path=str(src))
    with pytest.raises(IntegrityError):
        store.put([*good, short], kind="combined", combined_name="m", alignment=64)
    index = store_index(store)
    assert set(index) == {p.key for p in good}
    assert (store.root / "m_weight_combined").stat().st_size == 128 + 300
    assert_index_complete(store)
    assert store.verify().ok


# -- meta.json parsing --------------------------------------------------------------------


GOOD_KEY = make_key("blake3", "ab" * 32)


def meta(files: object = None, offsets: object = None, sizes: object = None,
         version: object = 1) -> str:
    return json.dumps({
        "format_version": version,
        "hash_to_weight_file": {GOOD_KEY: "weight_" + "ab" * 32} if files is None else files,
        "hash_to_weight_offset": {GOOD_KEY: 0} if offsets is None else offsets,
        "hash_to_weight_size": {GOOD_KEY: 4} if sizes is None else sizes,
    })


@pytest.mark.parametrize("text", [
    "{",
    "[]",
    "\xff",
    json.dumps({"format_version": 1}),
    meta(version="1"),
    meta(version=0),
    meta(offsets={GOOD_KEY: "0"}),
    meta(offsets={GOOD_KEY: -1}),
    meta(sizes={GOOD_KEY: True}),
    meta(sizes={GOOD_KEY: 1.5}),
    meta(files={GOOD_KEY: 7}),
    meta(files={GOOD_KEY: "../escape"}),
    meta(files={GOOD_KEY: "/abs/path"}),
    meta(files=[]),
    meta(sizes={}),
    meta(files={"blake3:AB": "x"}, offsets={"blake3:AB": 0}, sizes={"blake3:AB": 1}),
    meta(files={"md5:" + "0" * 32: "x"}, offsets={"md5:" + "0" * 32: 0},
         sizes={"md5:" + "0" * 32: 1}),
])
def test_malformed_meta_json_is_a_store_error(store: WeightStore, text: str) -> None:
    store.root.mkdir()
    store.meta_path.write_bytes(text.encode("latin-1"))
    for call in (lambda: store_index(store), store.stats, store.verify,
                 lambda: store.put(payloads(("a", 1)), kind="separate")):
        with pytest.raises(StoreError) as exc:
            call()
        assert exc.value.context["path"] == str(store.meta_path)
    assert [n for n in os.listdir(store.root) if n.startswith("weight_")] == []


def test_newer_format_version_says_so(store: WeightStore) -> None:
    store.root.mkdir()
    store.meta_path.write_text(meta(version=FORMAT_VERSION + 1))
    with pytest.raises(StoreError, match="newer"):
        store_index(store)


def test_well_formed_meta_json_parses(store: WeightStore) -> None:
    store.root.mkdir()
    store.meta_path.write_text(meta())
    assert read_index(store.meta_path) == {
        GOOD_KEY: StoredObject(GOOD_KEY, "weight_" + "ab" * 32, 0, 4)}


# -- locking ------------------------------------------------------------------------------


def lock_is_held(path: Path) -> bool:
    probe = FileLock(path, timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    probe.release()
    return False


def write_lock_is_free(store: WeightStore) -> bool:
    probe = sqlite3.connect(store.index_path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def test_bytes_move_outside_the_store_wide_lock(store: WeightStore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store.put(payloads(("z", 1)), kind="separate")  # creates the index
    seen: list[bool] = []
    real_copy = writer_module.copy_payload

    def spying_copy(src, fd, offset, dest):
        seen.append(write_lock_is_free(store))
        return real_copy(src, fd, offset, dest)

    monkeypatch.setattr(writer_module, "copy_payload", spying_copy)
    store.put(payloads(("a", 10), ("b", 20)), kind="separate", jobs=1)  # probes in turn
    store.put(payloads(("c", 10)), kind="combined", combined_name="m")
    assert seen == [True, True, True]
    assert max(store.index.write_holds) < 1.0


def test_readers_and_verify_never_wait_for_a_writer(store: WeightStore) -> None:
    ps = payloads(("a", 10), ("b", 20))
    store.put(ps, kind="separate")
    with WeightStore(store.root).index.writing():  # another writer, mid-transaction
        assert set(store_index(store)) == {p.key for p in ps}
        assert store.lookup(ps[0].key) is not None
        assert store.verify().ok
        assert store.stats().objects == 2


def test_lock_timeout_is_a_store_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    s = WeightStore(tmp_path / "s", lock_timeout=0.05)
    s.put(payloads(("z", 1)), kind="separate")
    blocker = sqlite3.connect(s.index_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match="timed out") as exc:
            s.put(payloads(("a", 1)), kind="separate")
        assert exc.value.context["path"] == str(s.index_path)
        # Readers need no lock.
        assert set(store_index(s)) == {payloads(("z", 1))[0].key}
        assert s.verify().ok
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert s.put(payloads(("a", 1)), kind="separate").written_objects == 1


def test_a_waiting_writer_names_the_holder_every_ten_seconds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import weightstore.io.locks as locking

    monkeypatch.setattr(locking, "WAIT_REPORT_SECONDS", 0.05)
    monkeypatch.setattr(store_module, "COMBINED_SIBLINGS", 1)  # no sibling to go to
    s = WeightStore(tmp_path / "s", lock_timeout=0.3)
    s.put(payloads(("a", 1)), kind="combined", combined_name="m")
    with s.file_lock("m_weight_combined"):
        holder = json.loads((s.root / "locks" / "m_weight_combined.lock.holder").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] and holder["since"]
        with pytest.raises(StoreError, match="held by pid"):
            s.put(payloads(("b", 1)), kind="combined", combined_name="m")
    err = capsys.readouterr().err
    assert f"held by pid {os.getpid()} on {holder['host']} since {holder['since']}" in err
    assert err.count("waiting") >= 2


def _filelock_major() -> int:
    from importlib.metadata import version

    return int(version("filelock").split(".")[0])


def test_a_file_system_without_flock_takes_no_lock_and_goes_on(tmp_path: Path,
                                                                monkeypatch) -> None:
    """``flock`` refused with ENOSYS, as some network file systems do: filelock 3 says so
    by raising NotImplementedError, filelock 4 falls back to its soft lock; either way a
    lock is taken or gone without, never an error, and the work under it goes on
    (correctness comes from temp + rename: :mod:`weightstore.io.locks`). A pull's
    partial-file lock likewise. Run at filelock's declared floor too (``.ci/run``)."""
    import errno
    import fcntl

    from weightstore.io.locks import file_lock, partial_file_lock
    from weightstore.store import BytesPayload

    attempts: list[int] = []

    def no_flock(fd: int, operation: int) -> None:
        attempts.append(operation)
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):  # taken (or gone without) and let go, twice
            with file_lock(tmp_path / "x.lock", 1, StoreError, "test"):
                pass
        partial = tmp_path / ".pull-x.tmp"
        with partial_file_lock(partial, 1, StoreError, "download"):
            partial.write_bytes(b"kept")
        assert attempts  # flock was asked, and refused
        store = WeightStore(tmp_path / "store")
        (obj,) = store.put([BytesPayload.of(b"w" * 64)], kind="separate").objects.values()
        assert store.read(obj) == b"w" * 64 and store.verify().ok
    # filelock 4 says it falls back to its soft lock; filelock 3 raised, silently caught
    assert bool(seen) == (_filelock_major() >= 4)
    assert all("flock" in str(w.message) for w in seen)


@pytest.mark.skipif(_filelock_major() < 4, reason="filelock 3 raises on a file system "
                    "without flock (the test above) instead of warning")
def test_a_librarys_warning_is_one_line_of_the_command(tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    """filelock 4 warns as it falls back to its soft lock on a file system without
    flock: a command prints that as one line, like its other messages, not Python's
    source path and line of code; ``-v`` leaves it to Python's own handling."""
    import errno
    import fcntl

    from weightstore.cli import main
    from weightstore.store import BytesPayload

    root = tmp_path / "store"
    WeightStore(root).put([BytesPayload.of(b"w" * 64)], kind="separate")

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    gc = ["store", "gc", "--store", str(root), "--no-roots-ok"]
    capsys.readouterr()
    assert main(gc) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("weightstore: warning: ") for line in err), err
    assert any("flock" in line for line in err)
    with pytest.warns(UserWarning, match="flock"):  # -v: Python's own handling
        assert main(["-v", *gc]) == 0
    assert "weightstore: warning" not in capsys.readouterr().err


_TAKE_TURNS = """
import sys, time
from pathlib import Path
from weightstore.errors import StoreError
from weightstore.io.locks import file_lock
lock, counter = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with file_lock(lock, -1, StoreError, "test", removable=True):
        value = int(counter.read_text())
        time.sleep(0.0005)  # a read-modify-write that overlaps if two hold the lock
        counter.write_text(str(value + 1))
"""


@needs_removable_locks
def test_a_removable_lock_goes_with_its_holder_and_stays_exclusive(tmp_path: Path) -> None:
    import subprocess
    import sys

    from weightstore.io.locks import file_lock

    lock, counter = tmp_path / "pull-x.lock", tmp_path / "counter"
    with file_lock(lock, 0, StoreError, "test", removable=True):
        assert lock_is_held(lock)
    assert not lock.exists() and not list(tmp_path.glob("*.holder"))
    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _TAKE_TURNS, str(lock), str(counter),
                               "40"]) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    assert counter.read_text() == "120"  # no two processes ever held it at once
    assert not lock.exists()


_PARTIAL_TURNS = """
import os, sys, time
from pathlib import Path
from weightstore.errors import StoreError
from weightstore.io.locks import partial_file_lock
partial, counter = Path(sys.argv[1]), Path(sys.argv[2])
for i in range(int(sys.argv[3])):
    with partial_file_lock(partial, -1, StoreError, "test"):
        value = int(counter.read_text())
        time.sleep(0.0005)  # a read-modify-write that overlaps if two hold the lock
        counter.write_text(str(value + 1))
        if i % 3 == 0:  # adopted: renamed away while held
            os.rename(partial, partial.with_name(f"away-{os.getpid()}-{i}"))
        elif i % 3 == 1:  # brought by another: removed while held
            partial.unlink()
        # else left at the path, to be resumed
"""


def test_a_partial_file_is_its_own_lock_and_stays_exclusive(tmp_path: Path) -> None:
    """A blob's partial download is locked by flocking the file itself: exclusive between
    processes whether its holder renames it away, removes it or leaves it; a taker that
    waited takes the file now at the path; a timeout is a typed error; a symbolic link at
    the path is refused."""
    import subprocess
    import sys
    import threading

    from weightstore.io.locks import partial_file_lock

    partial, counter = tmp_path / ".pull-x.tmp", tmp_path / "counter"
    with partial_file_lock(partial, 0, StoreError, "download"):
        assert partial.exists() and partial.stat().st_size == 0
        with (pytest.raises(StoreError, match="timed out waiting for the download"),
              partial_file_lock(partial, 0.1, StoreError, "download")):
            pass
        partial.write_bytes(b"prefix")
    with partial_file_lock(partial, 0, StoreError, "download"):  # kept to be resumed
        assert partial.read_bytes() == b"prefix"

    # a waiter that opened the file before its holder renamed it away locks the new one
    got = []
    with partial_file_lock(partial, 0, StoreError, "download"):
        waiter = threading.Thread(target=lambda: got.append(_take(partial)))
        waiter.start()
        time.sleep(0.2)
        assert not got  # still waiting
        os.rename(partial, tmp_path / "adopted")
    waiter.join(10)
    assert got == [b""] and (tmp_path / "adopted").read_bytes() == b"prefix"

    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _PARTIAL_TURNS, str(partial),
                               str(counter), "40"]) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    assert counter.read_text() == "120"  # no two processes ever held it at once

    partial.unlink(missing_ok=True)
    partial.symlink_to(tmp_path / "elsewhere")
    with (pytest.raises(StoreError, match="cannot open the download"),
          partial_file_lock(partial, 0, StoreError, "download")):
        pass
    assert not (tmp_path / "elsewhere").exists()


def _take(partial: Path) -> bytes:
    from weightstore.io.locks import partial_file_lock

    with partial_file_lock(partial, 10, StoreError, "download"):
        return partial.read_bytes()


# -- crash safety -------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 4])
def test_failure_mid_put_separate_leaves_only_complete_objects(store: WeightStore,
                                                               jobs: int) -> None:
    ps = payloads(*[(f"p{i}", 100 + i) for i in range(12)])
    store.put(ps[:2], kind="separate")
    before = store_index(store)
    flaky = FlakyPayload(ps[6])
    with pytest.raises(RuntimeError, match="injected"):
        store.put([*ps[:6], flaky, *ps[7:]], kind="separate", jobs=jobs)
    assert flaky.calls == [ps[6].key]
    assert temp_files(store.root) == []
    after = store_index(store)
    assert ps[6].key not in after
    assert not (store.root / ("weight_" + ps[6].key[7:])).exists()
    assert before.items() <= after.items()
    assert_index_complete(store)
    report = store.verify()
    assert report.ok and report.warnings == ()
    # A retry writes exactly what is missing.
    retry = store.put(ps, kind="separate", jobs=jobs)
    assert retry.written_objects == 12 - len(after)
    assert store.verify().ok


@pytest.mark.parametrize("fail_at", [0, 3, 7])
def test_failure_mid_put_combined_leaves_only_complete_objects(store: WeightStore,
                                                               fail_at: int) -> None:
    ps = payloads(*[(f"p{i}", 100 + i) for i in range(8)])
    bad = [*ps[:fail_at], FlakyPayload(ps[fail_at]), *ps[fail_at + 1:]]
    with pytest.raises(RuntimeError, match="injected"):
        store.put(bad, kind="combined", combined_name="m", alignment=64)
    index = store_index(store)
    assert set(index) == {p.key for p in ps[:fail_at]}
    assert_index_complete(store)
    assert temp_files(store.root) == []
    combined = store.root / "m_weight_combined"
    if fail_at == 0:
        assert not combined.exists()
    else:
        # Cut back to the last complete object: nothing half-written remains.
        assert combined.stat().st_size == max(o.end for o in index.values())
    assert store.verify().ok
    retry = store.put(ps, kind="combined", combined_name="m", alignment=64)
    assert retry.written_objects == 8 - fail_at
    assert all(o.offset % 64 == 0 for o in retry.objects.values())
    assert_index_complete(store)


def test_failure_while_publishing_the_index_keeps_the_old_index(
        store: WeightStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ps = payloads(("a", 10), ("b", 20), ("c", 30))
    store.put(ps[:1], kind="separate")
    old = store_index(store)

    def broken_insert(self, conn, objects) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Index, "insert", broken_insert)
    with pytest.raises(OSError, match="disk full"):
        store.put(ps, kind="separate")
    with pytest.raises(OSError, match="disk full"):
        store.put(ps, kind="combined", combined_name="m")
    monkeypatch.undo()
    assert store_index(store) == old
    assert temp_files(store.root) == []
    report = store.verify()
    assert report.ok
    assert {w.kind for w in report.warnings} == {"orphan_file"}
    retry = store.put(ps, kind="combined", combined_name="m", alignment=512)
    assert retry.written_objects == 2
    # The unindexed bytes from the failed append are skipped, not reused.
    assert all(o.offset >= 512 for o in retry.objects.values() if o.kind == "combined")
    assert store.verify().ok


def test_garbage_from_a_crashed_append_is_skipped(store: WeightStore) -> None:
    a, b = payloads(("a", 100), ("b", 100))
    store.put([a], kind="combined", combined_name="m", alignment=64)
    with open(store.root / "m_weight_combined", "ab") as f:
        f.write(b"\x99" * 50)  # a crashed append: bytes on disk, never indexed
    r = store.put([b], kind="combined", combined_name="m", alignment=64)
    assert r.objects[b.key].offset == align_up(150, 64)
    assert r.padding_bytes == 192 - 150
    assert store.verify().ok
    stats = store.stats()
    assert stats.bytes_on_disk == stats.payload_bytes + stats.padding_bytes
    assert stats.padding_bytes == 192 - 100


def test_stray_temp_files_and_orphans_are_warnings(store: WeightStore) -> None:
    store.put(payloads(("a", 10)), kind="separate")
    (store.root / ".weight_deadbeef.k2j3.tmp").write_bytes(b"partial")
    (store.root / ("weight_" + "cd" * 32)).write_bytes(b"orphan")
    report = store.verify()
    assert report.ok
    assert [(w.kind, w.file) for w in report.warnings] == [
        ("temp_file", ".weight_deadbeef.k2j3.tmp"), ("orphan_file", "weight_" + "cd" * 32)]
    stats = store.stats()
    assert stats.orphan_files == 1
    assert stats.unreferenced_bytes == 6


# -- verify on write ----------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, object]:
    files: dict[str, object] = {name: (root / name).read_bytes()
                                for name in store_files(root)}
    files["index"] = store_index(WeightStore(root))
    return files


@pytest.mark.parametrize("jobs", [1, 4])
@pytest.mark.parametrize("kind", ["separate", "combined"])
def test_bytes_that_do_not_match_their_key_are_never_indexed(store: WeightStore, kind: str,
                                                             jobs: int) -> None:
    name = "m" if kind == "combined" else None
    ps = payloads(*[(f"p{i}", 100 + i) for i in range(6)])
    store.put(ps[:2], kind=kind, combined_name=name, alignment=64)
    before = snapshot(store.root)
    impostor = ImpostorPayload.of(ps[2])
    with pytest.raises(IntegrityError) as exc:
        store.put([impostor], kind=kind, combined_name=name, alignment=64, jobs=jobs)
    assert exc.value.context["key"] == ps[2].key
    assert exc.value.context["source"] == "a source that changed after it was hashed"
    assert exc.value.context["got"] == BytesPayload.of(impostor.data).key
    assert snapshot(store.root) == before  # index, objects and combined file unchanged
    assert temp_files(store.root) == []
    # Such a source among good ones: what precedes it is kept (in a combined file, nothing
    # after it: the append is cut back to the end of the last verified object).
    with pytest.raises(IntegrityError) as exc:
        store.put([ps[2], ps[3], ImpostorPayload.of(ps[4]), ps[5]], kind=kind,
                  combined_name=name, alignment=64, jobs=jobs)
    assert exc.value.context["key"] == ps[4].key
    index = store_index(store)
    assert ps[2].key in index and ps[3].key in index and ps[4].key not in index
    if kind == "combined":
        assert ps[5].key not in index
        assert (store.root / "m_weight_combined").stat().st_size == index[ps[3].key].end
    else:
        assert not (store.root / separate_name(ps[4].key)).exists()
    assert temp_files(store.root) == []
    assert_index_complete(store)
    report = store.verify()
    assert report.ok and report.warnings == ()
    # The correct bytes go in on the next put.
    retry = store.put(ps, kind=kind, combined_name=name, alignment=64, jobs=jobs)
    assert retry.reused_objects + retry.written_objects == 6
    assert set(store_index(store)) == {p.key for p in ps}
    assert_index_complete(store)
    assert store.verify().ok


@pytest.mark.parametrize("kind", ["separate", "combined"])
def test_source_file_changed_after_hashing_is_refused(store: WeightStore, tmp_path: Path,
                                                      kind: str) -> None:
    src = tmp_path / "model.data"
    data = blob("weights", 3000)
    src.write_bytes(b"\0" * 10 + data)
    key = make_key("blake3", digest_bytes("blake3", data))
    fp = FilePayload(key=key, size=len(data), path=str(src), offset=10)
    src.write_bytes(b"\0" * 10 + blob("rewritten", 3000))  # same size, other bytes
    name = "m" if kind == "combined" else None
    with pytest.raises(IntegrityError) as exc:
        store.put([fp], kind=kind, combined_name=name)
    assert exc.value.context["key"] == key
    assert exc.value.context["source"] == f"{src} at offset 10"
    assert store_index(store) == {}
    assert store_files(store.root) == []
    src.write_bytes(b"\0" * 10 + data)
    assert store.put([fp], kind=kind, combined_name=name).written_objects == 1
    assert store.read(store_index(store)[key]) == data
    assert store.verify().ok


# -- verify -------------------------------------------------------------------------------


@pytest.fixture
def filled(store: WeightStore) -> tuple[WeightStore, list[BytesPayload]]:
    ps = payloads(("s0", 300), ("s1", 5), ("c0", 200), ("c1", 1000), ("c2", 64))
    store.put(ps[:2], kind="separate")
    store.put(ps[2:], kind="combined", combined_name="m", alignment=128)
    assert store.verify().ok
    return store, ps


def only_problem(store: WeightStore) -> tuple[str, str, str | None]:
    report = store.verify(jobs=2)
    assert not report.ok
    assert len(report.problems) == 1, report.problems
    p = report.problems[0]
    json.dumps(report.to_dict())
    assert report.to_dict()["problems"][0] == {"kind": p.kind, "file": p.file, "key": p.key,
                                              "detail": p.detail}
    return p.kind, p.file, p.key


def test_verify_detects_flipped_bytes(filled: tuple[WeightStore, list[BytesPayload]]) -> None:
    store, ps = filled
    sep = store.lookup(ps[0].key)
    assert sep is not None
    flip_byte(store.path_of(sep), 17)
    assert only_problem(store) == ("digest_mismatch", sep.file, sep.key)
    flip_byte(store.path_of(sep), 17)
    comb = store.lookup(ps[3].key)
    assert comb is not None
    flip_byte(store.path_of(comb), comb.offset + comb.size - 1)
    assert only_problem(store) == ("digest_mismatch", comb.file, comb.key)


def test_verify_detects_truncation(filled: tuple[WeightStore, list[BytesPayload]]) -> None:
    store, ps = filled
    sep = store.lookup(ps[0].key)
    assert sep is not None
    os.truncate(store.path_of(sep), 299)
    assert only_problem(store) == ("size_mismatch", sep.file, sep.key)
    with pytest.raises(IntegrityError):
        store.read(sep)
    store.path_of(sep).write_bytes(ps[0].data)
    last = store.lookup(ps[4].key)
    assert last is not None
    os.truncate(store.path_of(last), last.end - 1)
    assert only_problem(store) == ("short_file", last.file, last.key)
    with pytest.raises(IntegrityError):
        store.read(last)


def test_verify_detects_deletion(filled: tuple[WeightStore, list[BytesPayload]]) -> None:
    store, ps = filled
    sep = store.lookup(ps[1].key)
    assert sep is not None
    store.path_of(sep).unlink()
    assert only_problem(store) == ("missing_file", sep.file, sep.key)
    with pytest.raises(IntegrityError):
        store.read(sep)
    (store.root / "m_weight_combined").unlink()
    report = store.verify()
    assert sorted(p.kind for p in report.problems) == ["missing_file"] * 4


def test_verify_detects_misnamed_and_overlapping_entries(store: WeightStore) -> None:
    a, b = payloads(("a", 100), ("b", 100))
    store.put([a, b], kind="combined", combined_name="m", alignment=1)
    wrong_name = "weight_" + "0" * 64
    (store.root / wrong_name).write_bytes(a.data)
    set_row(store, b.key, offset=50)  # overlaps a's [0, 100)
    set_row(store, a.key, file=wrong_name)
    report = store.verify()
    kinds = {(p.kind, p.key) for p in report.problems}
    assert ("name_mismatch", a.key) in kinds
    assert ("digest_mismatch", b.key) in kinds
    assert not any(p.kind == "overlap" for p in report.problems)  # a moved to its own file
    set_row(store, a.key, file="m_weight_combined")
    report = store.verify()
    assert ("overlap", "m_weight_combined", b.key) in {(p.kind, p.file, p.key)
                                                       for p in report.problems}
    assert report.to_dict()["ok"] is False


# -- repair -------------------------------------------------------------------------------


def damage(store: WeightStore, ps: list[BytesPayload]) -> dict[str, str]:
    """Damage three objects of ``filled`` in three ways; return key -> expected problem."""
    flipped, deleted, short = (store.lookup(ps[i].key) for i in (0, 1, 4))
    assert flipped is not None and deleted is not None and short is not None
    flip_byte(store.path_of(flipped), 3)
    store.path_of(deleted).unlink()
    os.truncate(store.path_of(short), short.end - 1)
    return {flipped.key: "digest_mismatch", deleted.key: "missing_file",
            short.key: "short_file"}


def test_repair_drops_damaged_entries_and_the_next_put_rewrites_them(
        filled: tuple[WeightStore, list[BytesPayload]]) -> None:
    store, ps = filled
    expected = damage(store, ps)
    # c1 sits in the same combined file as the short c2: flip one of its bytes too.
    c1 = store.lookup(ps[3].key)
    assert c1 is not None
    flip_byte(store.path_of(c1), c1.offset)
    expected[c1.key] = "digest_mismatch"
    combined_size = (store.root / "m_weight_combined").stat().st_size
    report = store.repair(jobs=2)
    assert {(p.key, p.kind) for p in report.found.problems} == set(expected.items())
    assert {o.key for o in report.dropped} == set(expected)
    # Per-weight files are deleted; combined ranges are only unindexed.
    assert report.deleted_files == (separate_name(ps[0].key),)
    assert not (store.root / separate_name(ps[0].key)).exists()
    assert (store.root / "m_weight_combined").stat().st_size == combined_size
    assert report.ok and report.remaining.objects == 1
    assert report.remaining.bytes_hashed == 0  # kept bytes were hashed once, not twice
    assert set(store_index(store)) == {ps[2].key}
    json.dumps(report.to_dict())
    assert report.to_dict()["dropped"][0].keys() == {"key", "file", "offset", "size"}
    assert store.verify().ok
    # A second repair finds nothing and rewrites nothing.
    index_before = store_index(store)
    again = store.repair()
    assert (again.dropped, again.deleted_files, again.found.problems) == ((), (), ())
    assert store_index(store) == index_before
    # The next put writes the dropped payloads again, past the damaged bytes.
    retry = store.put(ps[:2], kind="separate")
    retry_c = store.put(ps[2:], kind="combined", combined_name="m", alignment=128)
    assert retry.written_objects + retry_c.written_objects == 4
    assert all(retry_c.objects[p.key].offset >= combined_size for p in ps[3:])
    assert_index_complete(store)
    assert store.verify().ok


def separate_name(key: str) -> str:
    return "weight_" + key.split(":")[1]


def test_repair_deletes_only_per_weight_files_nothing_else_uses(store: WeightStore) -> None:
    a, b, c = payloads(("a", 100), ("b", 100), ("c", 100))
    store.put([a, b, c], kind="separate")
    (store.root / "source-digests.json").write_bytes(b"{}")
    # b's entry names a's (sound) file, c's names a file that is not an object at all.
    set_row(store, b.key, file=separate_name(a.key))
    set_row(store, c.key, file="source-digests.json")
    report = store.repair()
    assert {o.key for o in report.dropped} == {b.key, c.key}
    assert report.deleted_files == ()
    assert (store.root / separate_name(a.key)).read_bytes() == a.data
    assert (store.root / "source-digests.json").read_bytes() == b"{}"
    assert report.ok
    assert {(w.kind, w.file) for w in report.remaining.warnings} == {
        ("orphan_file", separate_name(b.key)), ("orphan_file", separate_name(c.key))}
    assert set(store_index(store)) == {a.key}


def test_cli_verify_repair(filled: tuple[WeightStore, list[BytesPayload]],
                           capsys: pytest.CaptureFixture[str]) -> None:
    store, ps = filled
    expected = damage(store, ps)
    root = str(store.root)
    assert main(["store", "verify", "--store", root]) == 1
    capsys.readouterr()
    assert main(["store", "verify", "--repair", "--store", root, "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    for key in expected:
        assert f"dropped: {key} " in out
    assert f"deleted: {separate_name(ps[0].key)}" in out
    assert out.rstrip().endswith("dropped 3, 2 left: ok")
    assert main(["store", "verify", "--store", root]) == 0
    capsys.readouterr()
    assert main(["store", "verify", "--repair", "--json", "--store", root]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["dropped"] == [] and doc["remaining"]["objects"] == 2


@pytest.mark.parametrize("argv", [["store", "stats"], ["store", "stats", "--json"],
                                  ["store", "verify"], ["store", "verify", "--repair"]])
def test_cli_on_a_missing_store_exits_2_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    missing = tmp_path / "typo" / "a" / "b"
    assert main([*argv, "--store", str(missing)]) == 2
    err = capsys.readouterr().err
    if "--json" in argv:
        doc = json.loads(err)
        assert doc["error"] == "no store at this path" and doc["context"]["path"] == str(missing)
    else:
        assert err.startswith("weightstore: error: no store") and str(missing) in err
    assert os.listdir(tmp_path) == []


def test_repair_lets_the_next_build_recover(encoder_model, save_model, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src},
                          "\n  - {name: l, external_weight: combined}\n")
    root = tmp_path / "store"
    assert main(["build", str(recipe), "--store", str(root)]) == 0
    store = WeightStore(root)
    objects = store.stats().objects
    victim = max(store_index(store).values(), key=lambda o: o.size)
    flip_byte(store.path_of(victim), victim.offset)
    capsys.readouterr()
    # The damaged range is indexed and sized right. (With the source's payload keys
    # cached, the build copies from the source instead, which gives the right package but
    # leaves the store as it is.) A build that copies it rewrites it from its source.
    assert main(["build", str(recipe), "--store", str(root), "--force"]) == 0
    shutil.rmtree(root / "payload-keys")
    assert main(["build", str(recipe), "--store", str(root), "--force"]) == 0
    assert "was damaged; rewritten from" in capsys.readouterr().err
    assert store.verify().ok
    # Repair recovers too: it drops the damaged row, the next build writes it again.
    victim = store.lookup(victim.key)
    assert victim is not None
    flip_byte(store.path_of(victim), victim.offset)
    assert main(["store", "verify", "--repair", "--store", str(root)]) == 0
    assert f"dropped: {victim.key} " in capsys.readouterr().out
    assert victim.key not in store_index(store)
    assert main(["build", str(recipe), "--store", str(root), "--force"]) == 0
    assert store.stats().objects == objects
    assert store.lookup(victim.key) is not None
    assert store.verify().ok


# -- permissions --------------------------------------------------------------------------


@pytest.fixture
def group_umask():
    """umask 002, as for a store shared by a group (restored afterwards)."""
    old = os.umask(0o002)
    fsio._umask.cache_clear()
    try:
        yield 0o002
    finally:
        os.umask(old)
        fsio._umask.cache_clear()


def test_store_files_get_the_umask_mode(tmp_path: Path, group_umask: int) -> None:
    store = WeightStore(tmp_path / "shared")
    store.put(payloads(("a", 10), ("b", 20)), kind="separate")
    store.put(payloads(("c", 30)), kind="combined", combined_name="m")
    a = store.lookup(payloads(("a", 10))[0].key)
    assert a is not None
    flip_byte(store.path_of(a), 0)
    store.repair()  # rewrites the index
    store.put(payloads(("a", 10)), kind="separate")
    names = sorted(n for n in os.listdir(store.root) if n != "locks")
    assert names == sorted(["index.sqlite", "index.sqlite-shm", "index.sqlite-wal",
                            "meta.json", "meta.json.lock", "m_weight_combined",
                            *(separate_name(p.key) for p in payloads(("a", 10), ("b", 20)))])
    names += [f"locks/{n}" for n in os.listdir(store.root / "locks")]
    for name in names:
        mode = (store.root / name).stat().st_mode & 0o777
        assert mode == 0o666 & ~group_umask, (name, oct(mode))
    assert store.root.stat().st_mode & 0o777 == 0o777 & ~group_umask


# -- stats --------------------------------------------------------------------------------


def test_stats_two_models_sharing_payloads_in_one_combined_store(store: WeightStore) -> None:
    shared = payloads(("emb", 1000), ("norm", 64))
    model_a = [*payloads(("a0", 300), ("a1", 0)), *shared]
    model_b = [*shared, *payloads(("b0", 513), ("b1", 1))]
    ra = store.put(model_a, kind="combined", combined_name="m", alignment=512)
    rb = store.put(model_b, kind="combined", combined_name="m", alignment=512)
    # a0 [0,300) a1 @512 (empty) emb [512,1512) norm [1536,1600) b0 [2048,2561) b1 [3072,3073)
    assert [ra.objects[p.key].offset for p in model_a] == [0, 512, 512, 1536]
    assert [rb.objects[p.key].offset for p in model_b[2:]] == [2048, 3072]
    assert (rb.reused_objects, rb.reused_bytes) == (2, 1064)
    unique = 300 + 0 + 1000 + 64 + 513 + 1
    padding = (512 - 300) + (1536 - 1512) + (2048 - 1600) + (3072 - 2561)
    assert ra.padding_bytes + rb.padding_bytes == padding
    assert ra.written_bytes + rb.written_bytes == unique
    stats = store.stats()
    assert stats.to_dict() == {
        "root": str(store.root),
        "objects": 6,
        "separate_objects": 0,
        "combined_objects": 6,
        "payload_bytes": unique,
        "bytes_on_disk": unique + padding,
        "padding_bytes": padding,
        "unreferenced_bytes": 0,
        "files": 1,
        "separate_files": 0,
        "combined_files": 1,
        "orphan_files": 0,
        "missing_files": 0,
    }
    assert (store.root / "m_weight_combined").stat().st_size == 3073


def test_stats_counts_kinds_and_files(store: WeightStore) -> None:
    store.put(payloads(("s0", 10), ("s1", 20)), kind="separate")
    store.put(payloads(("c0", 10)), kind="combined", combined_name="x")
    store.put(payloads(("c1", 10)), kind="combined", combined_name="y")
    (store.root / "y_weight_combined").unlink()
    s = store.stats()
    assert (s.objects, s.separate_objects, s.combined_objects) == (4, 2, 2)
    assert (s.files, s.separate_files, s.combined_files) == (3, 2, 1)
    assert (s.missing_files, s.orphan_files) == (1, 0)
    assert s.bytes_on_disk == 40
    json.dumps(s.to_dict())


# -- store location -----------------------------------------------------------------------


def test_resolve_store_path_priority(tmp_path: Path) -> None:
    env = {"WEIGHTSTORE_DIR": str(tmp_path / "env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    recipe = tmp_path / "recipe_store"
    assert resolve_store_path(str(tmp_path / "flag"), recipe, env) == tmp_path / "flag"
    assert resolve_store_path(None, recipe, env) == recipe
    assert resolve_store_path(None, None, env) == tmp_path / "env"
    del env["WEIGHTSTORE_DIR"]
    assert resolve_store_path(None, None, env) == user_cache_dir(env)
    assert resolve_store_path("rel", None, env) == Path.cwd() / "rel"


def test_user_cache_dir_per_platform() -> None:
    home = "/home/u"
    assert user_cache_dir({"HOME": home, "XDG_CACHE_HOME": "/c"}, "linux") == Path(
        "/c/weightstore")
    assert user_cache_dir({"HOME": home, "XDG_CACHE_HOME": "rel"}, "linux") == Path(
        "/home/u/.cache/weightstore")
    assert user_cache_dir({"HOME": home}, "linux") == Path("/home/u/.cache/weightstore")
    assert user_cache_dir({"HOME": home}, "darwin") == Path(
        "/home/u/Library/Caches/weightstore")
    win = user_cache_dir({"LOCALAPPDATA": "C:/Users/u/AppData/Local"}, "win32")
    assert win == Path("C:/Users/u/AppData/Local") / "weightstore"


# -- property -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    picks=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["blake3", "sha256"])),
                   max_size=12),
    kind=st.sampled_from(["separate", "combined"]),
    alignment=st.sampled_from([1, 2, 16, 64, 512, 4096]),
    split=st.integers(0, 12),
)
def test_property_put_then_read_round_trips(pool: list[bytes], picks: list[tuple[int, str]],
                                            kind: str, alignment: int, split: int) -> None:
    batch = [BytesPayload.of(pool[i % len(pool)], algo) for i, algo in picks]
    expected = {p.key: p.data for p in batch}
    with tempfile.TemporaryDirectory() as tmp:
        s = WeightStore(tmp)
        name = "m" if kind == "combined" else None
        r1 = s.put(batch[:split], kind=kind, combined_name=name, alignment=alignment)
        r2 = s.put(batch, kind=kind, combined_name=name, alignment=alignment, jobs=3)
        assert r1.written_objects + r2.written_objects == len(expected)
        assert r2.reused_objects == len(r1.objects)
        for key, data in expected.items():
            obj = s.lookup(key)
            assert obj is not None and obj == r2.objects[key]
            assert s.read(obj) == data
            if obj.kind == "combined":
                assert obj.offset % alignment == 0
        stats = s.stats()
        assert stats.payload_bytes == sum(len(d) for d in expected.values())
        assert stats.bytes_on_disk == stats.payload_bytes + stats.padding_bytes
        assert s.verify(jobs=2).ok
