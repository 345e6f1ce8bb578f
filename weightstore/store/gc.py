"""Garbage collection: delete what no live root references.

Mark and sweep, planned first. :func:`gather` reads the facts (roots and whether each is
live, leases, the objects nothing keeps, combined files' live bytes, orphans, stale temp
files); :func:`plan_gc` turns them into a frozen :class:`GcPlan` without any I/O, which
``--dry-run`` prints and :meth:`GcPlan.execute` carries out:

1. dead roots and dead leases are dropped (one short transaction);
2. garbage rows are deleted in batches, each batch re-checked in its own transaction
   against every root and lease that exists at that moment (a build that registered a
   root or leased a key since the plan was made keeps it);
3. per-weight files and orphans no row refers to are unlinked (:mod:`.sweep`);
4. combined files whose garbage passes the threshold are compacted (:mod:`.compact`);
5. temp files no process holds are removed (:mod:`.temps`), and so are the lock files of
   combined files that no longer exist (:func:`.sweep.remove_stale_locks`).

Safety against concurrent builds comes from **leases**, not from a grace period: a build
holds every key it has decided to reuse from the transaction that located it until its
package is published and its root registered (see :mod:`.leases`). ``older_than`` is an
extra, optional grace: objects written less than that long ago are kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from . import leases as leases_mod
from . import roots as roots_mod
from . import temps as temps_mod
from .index import batched, marks, row_object
from .layout import kind_of, scan
from .objects import StoredObject
from .sweep import remove_stale_locks, unlink_unreferenced

if TYPE_CHECKING:
    from .core import Store
    from .roots import Root

DELETE_BATCH = 5000
DEFAULT_COMPACT_RATIO = 0.5
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a bare number is seconds)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 12h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class FileFacts:
    """One combined file: its size, and the bytes of the rows that stay."""

    file: str
    size: int
    live_objects: int
    live_bytes: int


@dataclass(frozen=True)
class GcPlan:
    """What gc will do; built by :func:`plan_gc`, printed by ``--dry-run``."""

    root: str
    cutoff: float  # objects created before this (unix time) may go
    roots: int  # every root registered, live or dead
    dead_roots: tuple[Root, ...]
    dead_leases: tuple[int, ...]
    garbage: tuple[StoredObject, ...]
    delete_files: tuple[str, ...]  # per-weight files of garbage, orphans, empty combined
    compact: tuple[FileFacts, ...]
    temps: tuple[str, ...]
    freed_bytes: int  # expected, from the plan's snapshot
    compact_ratio: float
    damaged_rows: int = 0  # damaged roots and leases rows: their keys are kept (repair's)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "roots": self.roots,
            "dead_roots": [r.to_dict() for r in self.dead_roots],
            "garbage_objects": len(self.garbage),
            "garbage_bytes": sum(o.size for o in self.garbage),
            "delete_files": list(self.delete_files),
            "compact": [asdict(f) for f in self.compact],
            "temps": list(self.temps),
            "freed_bytes": self.freed_bytes,
            "damaged_rows": self.damaged_rows,
        }

    def execute(self, store: Store) -> GcResult:
        return execute(self, store)


@dataclass
class GcResult:
    """What gc did."""

    dropped_roots: int = 0
    deleted_objects: int = 0
    deleted_files: list[str] = field(default_factory=list)
    compacted: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    removed_temps: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    removed_locks: list[str] = field(default_factory=list)  # of combined files now gone

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_gc(*, root: str, cutoff: float, roots: list[Root], dead_leases: list[int],
            garbage: list[StoredObject], files: list[FileFacts], file_sizes: dict[str, int],
            orphans: list[str], temps: list[str], compact_ratio: float,
            damaged_roots: int = 0, damaged_leases: int = 0) -> GcPlan:
    """Pure: the facts in, the plan out (``damaged_roots``: roots rows no reader believes,
    counted among the roots registered)."""
    dead = tuple(r for r in roots if not r.live)
    separate = sorted({o.file for o in garbage if o.kind == "separate"})
    empty = sorted(f.file for f in files if f.live_objects == 0)
    compact = tuple(f for f in files if f.live_objects and f.size
                    and (f.size - f.live_bytes) / f.size >= compact_ratio)
    delete = tuple(sorted({*separate, *empty, *orphans}))
    freed = sum(file_sizes.get(name, 0) for name in delete)
    freed += sum(f.size - f.live_bytes for f in compact)
    return GcPlan(root=root, cutoff=cutoff, roots=len(roots) + damaged_roots, dead_roots=dead,
                  dead_leases=tuple(dead_leases),
                  garbage=tuple(sorted(garbage, key=lambda o: o.key)), delete_files=delete,
                  compact=compact, temps=tuple(sorted(temps)), freed_bytes=freed,
                  compact_ratio=compact_ratio, damaged_rows=damaged_roots + damaged_leases)


def gather(store: Store, *, older_than: float = 0.0,
           compact_ratio: float = DEFAULT_COMPACT_RATIO) -> GcPlan:
    """Read the facts from one snapshot of the index and the folder; plan."""
    if older_than < 0 or not 0 < compact_ratio <= 1:
        raise ValueError("older_than must be >= 0 and compact_ratio in (0, 1]")
    cutoff = time.time() - older_than
    listing = scan(store.root)
    now = time.time()
    with store.index.reading() as conn:
        has_index = store.index.exists()
        roots = roots_mod.list_roots(conn, sizes=False) if has_index else []
        _, dead_leases = leases_mod.live_leases(conn, now) if has_index else ([], [])
        damaged_roots = len(roots_mod.malformed_roots(conn)) if has_index else 0
        damaged_leases = len(leases_mod.malformed_leases(conn, now)) if has_index else 0
        # A key is kept by every root and lease but the dead ones: a damaged row (neither
        # live nor dead, never believed) keeps its keys until repair drops it, as the
        # transaction that deletes rows does (it spares every key any row names).
        dead_roots = ",".join(str(r.id) for r in roots if not r.live)
        dead = ",".join(str(i) for i in dead_leases)
        garbage = [obj for row in conn.execute(
            f"""SELECT key, file, offset, size FROM objects o WHERE created < ?
                AND NOT EXISTS (SELECT 1 FROM root_keys rk WHERE rk.key = o.key
                                AND +rk.root NOT IN ({dead_roots}))
                AND NOT EXISTS (SELECT 1 FROM lease_keys lk WHERE lk.key = o.key
                                AND +lk.lease NOT IN ({dead}))""", (cutoff,))
                   if (obj := row_object(row)) is not None]  # malformed rows: repair's
        # ("+" keeps SQLite on the key indexes: one probe per object, not one per root)
        totals = store.index.files(conn)
    gone: dict[str, tuple[int, int]] = {}
    for obj in garbage:
        n, b = gone.get(obj.file, (0, 0))
        gone[obj.file] = (n + 1, b + obj.size)
    files = []
    for file, count, payload, _ in totals:
        if kind_of(file) != "combined" or file not in listing.objects:
            continue
        n, b = gone.get(file, (0, 0))
        files.append(FileFacts(file, listing.objects[file], count - n, payload - b))
    indexed = {f[0] for f in totals}
    orphans = [name for name in listing.objects if name not in indexed]
    temps = temps_mod.leftovers(store.root)
    return plan_gc(root=str(store.root), cutoff=cutoff, roots=roots, dead_leases=dead_leases,
                   garbage=garbage, files=files, file_sizes=listing.objects, orphans=orphans,
                   temps=temps, compact_ratio=compact_ratio, damaged_roots=damaged_roots,
                   damaged_leases=damaged_leases)


def execute(plan: GcPlan, store: Store,
            progress: Callable[[str], None] | None = None) -> GcResult:
    """Carry out ``plan`` (under the gc lock: one gc at a time per store)."""
    from ..io.locks import file_lock
    from .compact import compact_file

    result = GcResult()
    folder = store.root / "locks"
    folder.mkdir(exist_ok=True)
    with file_lock(folder / "gc.lock", store.lock_timeout, StoreError, "gc"):
        if plan.dead_roots or plan.dead_leases:
            with store.index.writing() as conn:
                roots_mod.remove(conn, [r.id for r in plan.dead_roots])
                leases_mod.drop_dead(conn, plan.dead_leases)
            result.dropped_roots = len(plan.dead_roots)
        for chunk in batched((o.key for o in plan.garbage), DELETE_BATCH):
            result.deleted_objects += _delete_unkept(store, chunk, plan.cutoff)
        before = _sizes(store, plan.delete_files)
        result.deleted_files = unlink_unreferenced(store, plan.delete_files)
        result.freed_bytes += sum(before.get(name, 0) for name in result.deleted_files)
        for facts in plan.compact:
            if progress is not None:
                progress(facts.file)
            outcome = compact_file(store, facts.file)
            (result.compacted if outcome.get("new_file") else result.skipped).append(outcome)
            result.freed_bytes += outcome.get("freed_bytes", 0)
        result.removed_temps = temps_mod.sweep(store.root, names=plan.temps)
        result.removed_locks = remove_stale_locks(store)
    return result


def _delete_unkept(store: Store, keys: list[str], cutoff: float) -> int:
    """Delete the rows of ``keys`` that no root and no lease holds right now."""
    deleted = 0
    with store.index.writing() as conn:
        for chunk in batched(keys):
            cur = conn.execute(
                f"""DELETE FROM objects WHERE key IN ({marks(chunk)}) AND created < ?
                    AND NOT EXISTS (SELECT 1 FROM root_keys rk WHERE rk.key = objects.key)
                    AND NOT EXISTS (SELECT 1 FROM lease_keys lk
                                    WHERE lk.key = objects.key)""", (*chunk, cutoff))
            deleted += cur.rowcount
    return deleted


def _sizes(store: Store, names: tuple[str, ...]) -> dict[str, int]:
    sizes = {}
    for name in names:
        with contextlib.suppress(OSError):
            sizes[name] = os.lstat(store.root / name).st_size
    return sizes
