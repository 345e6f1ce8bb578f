"""Recovering from objects damaged on disk after they were written.

Verification finds them (on a snapshot, without locks); repair then takes them out of the
index in one short write transaction, dropping only rows that are still exactly what was
verified, so that the next build sees their keys as missing and writes them again from its
sources. Nothing is rewritten here: the store holds no other copy of a payload. A
per-weight file is deleted once no row refers to it (:mod:`.sweep`); a damaged range of a
combined file is only unindexed, and compaction reclaims it. A range this user may not
read is never treated as damage. Temp files no process holds are removed, and so are
the lock files of combined files that no longer exist.

A damaged row of the other tables goes the same way (see :func:`repair_tables`): a root
or a lease that cannot be what a build writes is dropped with its keys, a key row that
names no root or lease is dropped, and a value that has a safe default is reset instead
(a root's time or pin, an object's time), so that the row is kept.

A lost or unreadable index is rebuilt from the per-weight objects on disk (their names are
their digests, and each is re-hashed); combined files cannot be re-indexed (their offsets
lived only in the index), so they are reported as orphans for gc to remove. An index that
is readable (:meth:`Index.readable`) is never set aside: a table or column lost from it is
created again, and a verification that still fails is an error with nothing changed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import StoreError
from ..io.digests import ALGORITHMS, digest_file, make_key
from ..io.files import open_regular
from .index import MalformedRow, disk_is_full, not_damage, shown
from .layout import SEPARATE_PREFIX, kind_of, scan
from .meta import is_marker
from .objects import StoredObject
from .sweep import remove_stale_locks, unlink_unreferenced
from .temps import sweep
from .verify import VerifyReport, verify_store

if TYPE_CHECKING:
    from .core import Store

NOT_DAMAGE = frozenset({"no_permission"})


@dataclass(frozen=True)
class RowFix:
    """What repair did to one damaged row of the roots, root_keys, leases or lease_keys
    tables (or to the times of the objects of one file): ``dropped`` or ``reset``."""

    table: str
    row: str
    action: Literal["dropped", "reset"]
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"table": self.table, "row": self.row, "action": self.action,
                "detail": self.detail}


@dataclass(frozen=True)
class RepairReport:
    """``found``: the verification before the repair; ``remaining``: the store after it."""

    root: str
    found: VerifyReport
    dropped: tuple[StoredObject | MalformedRow, ...]
    deleted_files: tuple[str, ...]
    remaining: VerifyReport
    removed_temps: tuple[str, ...] = ()
    rebuilt: int | None = None  # objects re-indexed from disk when the index was lost
    fixed_rows: tuple[RowFix, ...] = ()
    restored_schema: tuple[str, ...] = ()  # tables, indexes, columns created again
    restored_marker: bool = False  # meta.json written again (the old one: meta.json.broken)
    removed_locks: tuple[str, ...] = ()  # lock files of combined files that are gone

    @property
    def ok(self) -> bool:
        """True when every entry left in the index is sound."""
        return self.remaining.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "found": self.found.to_dict(),
            "dropped": [{"key": o.key, "file": o.file, "offset": o.offset, "size": o.size}
                        for o in self.dropped],
            "deleted_files": list(self.deleted_files),
            "removed_temps": list(self.removed_temps),
            "rebuilt": self.rebuilt,
            "fixed_rows": [f.to_dict() for f in self.fixed_rows],
            "restored_schema": list(self.restored_schema),
            "restored_marker": self.restored_marker,
            "removed_locks": list(self.removed_locks),
            "remaining": self.remaining.to_dict(),
        }


def repair_store(store: Store, jobs: int, *, progress: bool | None = False,
                 ) -> RepairReport:
    rebuilt = None
    restored: list[str] = []
    swept: list[str] = []
    store.index.take_swept()  # what this repair's own writes sweep is reported
    if not store.index.initialised():
        with contextlib.suppress(StoreError):  # what it cannot read is repaired below
            swept = store.open_for_writing()  # a format 1 store is migrated, all kept
    if store.index.exists() and store.index.writable() and store.index.missing_schema() \
            and store.index.readable():
        restored = restore_schema(store)
    try:
        found = verify_store(store, jobs, progress=progress)
    except StoreError as exc:
        if "index" not in exc.message:
            raise
        refuse_unless_lost(store, exc)
        if store.index.readable():
            raise  # never set aside: nothing repair may change explains it
        rebuilt = rebuild_index(store, jobs)
        found = verify_store(store, jobs, progress=progress)
    snapshot_bad = {p.key for p in found.problems
                    if p.key is not None and p.kind not in NOT_DAMAGE}
    malformed = {p.key for p in found.problems if p.kind == "malformed_row"}
    dropped: list[StoredObject | MalformedRow] = []
    if snapshot_bad:
        with store.index.writing() as conn:
            rows = store.index.locate(snapshot_bad, conn)
            for key in sorted(snapshot_bad):
                obj = rows.get(key)
                if obj is not None and _still_bad(found, obj):
                    dropped.append(obj)
                elif obj is None and key in malformed:
                    row = store.index.row(conn, key)  # still malformed, not rewritten
                    if isinstance(row, MalformedRow):
                        dropped.append(row)
            conn.executemany("DELETE FROM objects WHERE key = ?",
                             ((o.raw[0] if isinstance(o, MalformedRow) else o.key,)
                              for o in dropped))
    dropped.sort(key=lambda o: (o.file, o.key))
    fixed: list[RowFix] = []
    if any(p.kind in TABLE_DAMAGE for p in found.problems) \
            or any(w.kind == "malformed_time" for w in found.warnings):
        with store.index.writing() as conn:
            fixed = repair_tables(conn)
    # Only per-weight objects of well-formed rows: never a combined file, nor whatever
    # else a damaged index might name (meta.json, the lock, caches). The file of a
    # malformed row may hold intact bytes: it is left as an orphan (gc removes it).
    files = [o.file for o in dropped if isinstance(o, StoredObject)
             and o.file.startswith(SEPARATE_PREFIX) and kind_of(o.file) == "separate"]
    deleted = unlink_unreferenced(store, files)
    temps = [*swept, *store.index.take_swept(), *sweep(store.root)]
    locks = remove_stale_locks(store)
    marker = store.index.refresh_marker()
    remaining = verify_store(store, jobs, rehash=False)  # kept bytes were just hashed
    return RepairReport(root=str(store.root), found=found, dropped=tuple(dropped),
                        deleted_files=tuple(sorted(deleted)), remaining=remaining,
                        removed_temps=tuple(temps), rebuilt=rebuilt, restored_marker=marker,
                        fixed_rows=tuple(fixed), restored_schema=tuple(restored),
                        removed_locks=tuple(locks))


def restore_schema(store: Store) -> list[str]:
    """Bring back what a readable index lost of its schema (its format version, a table,
    an index, a column), every row it holds kept; returns what was restored."""
    missing = store.index.missing_schema()
    store.index.rebuilding = True  # the first write sets the version: nothing to migrate
    try:
        with store.index.writing() as conn:
            store.index.restore_schema(conn)
    finally:
        store.index.rebuilding = False
    return missing


TABLE_DAMAGE = frozenset({"malformed_root", "malformed_lease"})


def repair_tables(conn: sqlite3.Connection) -> list[RowFix]:
    """Drop or reset every damaged row of the tables beside ``objects``, as it is in this
    write transaction (a row a build rewrote since the verification is sound, and is
    left alone): a root that cannot be what a build registers is dropped with its keys
    (the next build of its folder registers it again), one whose only fault is its time
    or pin is kept with the time set to now and the pin set (its objects stay; ``store
    unpin`` undoes it); a damaged lease is dropped with its keys; a key row that is no
    digest key or names no root or lease is dropped; an object's time that is not an
    integer is set to now."""
    from . import leases, roots

    now = int(time.time())
    fixed: list[RowFix] = []
    for rid, detail, kept in roots.malformed_roots(conn):
        if kept:
            conn.execute(f"UPDATE roots SET created = CASE WHEN typeof(created) = 'integer' "
                         f"THEN created ELSE ? END, pinned = {roots.KEPT_PIN} "
                         f"WHERE id = ?", (now, rid))
        else:
            roots.remove(conn, [rid])
        fixed.append(RowFix("roots", str(rid), "reset" if kept else "dropped", detail))
    for root, key, detail in roots.malformed_root_keys(conn):
        conn.execute("DELETE FROM root_keys WHERE root IS ? AND key IS ?", (root, key))
        fixed.append(RowFix("root_keys", f"({shown(root)}, {shown(key)})", "dropped", detail))
    for lease, detail in leases.malformed_leases(conn, now):
        leases.close_lease(conn, lease)
        fixed.append(RowFix("leases", str(lease), "dropped", detail))
    for lease, key, detail in leases.malformed_lease_keys(conn):
        conn.execute("DELETE FROM lease_keys WHERE lease IS ? AND key IS ?", (lease, key))
        fixed.append(RowFix("lease_keys", f"({shown(lease)}, {shown(key)})", "dropped",
                            detail))
    for file, count in conn.execute("SELECT file, count(*) FROM objects WHERE "
                                    "typeof(created) != 'integer' GROUP BY file").fetchall():
        fixed.append(RowFix("objects", shown(file) if type(file) is not str else file,
                            "reset", f"created of {count} row(s) set to now"))
    conn.execute("UPDATE objects SET created = ? WHERE typeof(created) != 'integer'", (now,))
    return fixed


def _still_bad(found: VerifyReport, obj: StoredObject) -> bool:
    """A well-formed row still as verified (a malformed row rewritten since is sound)."""
    return any(p.key == obj.key and p.file == obj.file and p.kind != "malformed_row"
               for p in found.problems)


SQLITE_MAGIC = b"SQLite format 3\x00"


def refuse_unless_lost(store: Store, exc: StoreError) -> None:
    """Re-raise ``exc`` unless the index is really lost or damaged: an index of a newer
    format, or one this user may not read, is not damage, and rebuilding it would set aside
    every combined object and root it holds. Nothing is touched before this check."""
    from .index import FORMAT_VERSION

    version = exc.context.get("format_version")
    if type(version) is int and version > FORMAT_VERSION:
        raise exc
    if not_damage(exc) or disk_is_full(store.root):
        raise StoreError(f"{exc.message}; a full or failing disk is not damage of the "
                         f"index, so nothing was changed: free space and run the repair "
                         f"again", path=str(store.index.path)) from exc
    for name in (store.index.path.name, store.index.path.name + "-wal",
                 store.index.path.name + "-shm", store.meta_path.name):
        path = store.root / name
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            continue
        except PermissionError as err:
            raise StoreError(f"cannot read the store index ({err.strerror}): not damage, "
                             f"so nothing was changed; run the repair as a user who may "
                             f"read and write it", path=str(path)) from None
        except OSError:
            continue  # not a regular file: damage, set aside by the rebuild
        try:
            head = os.pread(fd, 100, 0)
        finally:
            os.close(fd)
        if name == store.index.path.name and head.startswith(SQLITE_MAGIC) \
                and len(head) >= 64:
            version = int.from_bytes(head[60:64], "big")
            if version > FORMAT_VERSION:
                raise StoreError("store index was written by a newer weightstore; upgrade "
                                 "to repair it (nothing was changed)", path=str(path),
                                 format_version=version, supported=FORMAT_VERSION)
    if not os.access(store.root, os.W_OK):
        raise StoreError("cannot rebuild the store index: this user may not write the "
                         "store folder (nothing was changed)", path=str(store.root))


def rebuild_index(store: Store, jobs: int) -> int:
    """A new index from the per-weight objects on disk; the old one is set aside."""
    from concurrent.futures import ThreadPoolExecutor

    store.index.close()  # nothing may go on writing into the file set aside
    for name in (store.index.path.name, store.index.path.name + "-wal",
                 store.index.path.name + "-shm", store.meta_path.name):
        path = store.root / name
        if path.exists() and not (name == store.meta_path.name and is_marker(path)):
            os.replace(path, store.root / f"{name}.broken")
    names = [n for n in scan(store.root).objects if kind_of(n) == "separate"
             and n.startswith(SEPARATE_PREFIX)]

    def identify(name: str) -> StoredObject | None:
        hex_digest = name[len(SEPARATE_PREFIX):]
        path = store.root / name
        for algo in ALGORITHMS:
            try:
                if digest_file(algo, path) == hex_digest:
                    return StoredObject(make_key(algo, hex_digest), name, 0,
                                        os.path.getsize(path))
            except OSError:
                return None
        return None

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        found = [o for o in pool.map(identify, names) if o is not None]
    store.index.rebuilding = True
    try:
        with store.index.writing() as conn:
            store.index.insert(conn, found)
    finally:
        store.index.rebuilding = False
    return len(found)
