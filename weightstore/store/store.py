"""``WeightStore``: the store's core (:class:`.core.Store`) with its maintenance on top.

The core (objects, index, locks, roots) knows nothing of verify, repair, gc or the
``meta.json`` export; those modules take a core :class:`~.core.Store` and sit above it;
this facade, above both, gives them as methods, so ``WeightStore(path).verify()`` works
and no module of the store imports one that imports it back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import REPAIR_HINT, IntegrityError, StoreError
from .core import PUT_ATTEMPTS, PutReport, Store
from .layout import INDEX_NAME
from .objects import StoredObject

if TYPE_CHECKING:
    from .gc import GcPlan
    from .repair import RepairReport
    from .verify import Problem, VerifyReport

__all__ = ["PutReport", "WeightStore"]


class WeightStore(Store):
    """The store, and its maintenance: verify, repair, gc's plan, GE's ``meta.json``."""

    def verify(self, *, jobs: int = 4, progress: bool | None = False) -> VerifyReport:
        """Re-hash every object of one snapshot without blocking writers.

        A finding is reported only if a fresh look still shows the same row (gc or
        compaction may have moved or removed it meanwhile). ``progress``: a bar with rate
        and ETA (None: only on an interactive terminal).
        """
        from .verify import verify_store

        self._require_root()
        return verify_store(self, jobs, progress=progress)

    def repair(self, *, jobs: int = 4, progress: bool | None = False) -> RepairReport:
        """Verify, then drop every entry whose bytes are damaged (see :mod:`.repair`)."""
        from .repair import repair_store

        self._require_root()
        return repair_store(self, jobs, progress=progress)

    # -- roots and gc ------------------------------------------------------------------

    def plan_gc(self, *, older_than: float = 0.0, compact_ratio: float = 0.5) -> GcPlan:
        """What gc would do (nothing is changed): see :mod:`.gc`."""
        from .gc import gather

        self._require_root()
        return gather(self, older_than=older_than, compact_ratio=compact_ratio)

    def export_meta(self, path: str | os.PathLike[str] | None = None, *,
                    jobs: int = 4) -> tuple[Path, int]:
        """Write GE's ``meta.json`` (default: the store's own); returns (path, objects).

        GE reads weights by the exported offsets without any check of its own, so nothing
        is exported that this process has not proved: every row of the snapshot is checked
        against its file (inside it, not overlapping another range) and its bytes are
        hashed against its key, streamed, before the first byte is written. A row that
        does not hold (a tampered or damaged index, a damaged object, a malformed row that
        every reader would take for an absent key) is an IntegrityError naming the key,
        file and offset, with nothing written. A row that gc or compaction moved while it
        was checked is not damage: the export starts again on a fresh snapshot.
        """
        from .meta import export_meta
        from .verify import check_snapshot, still_current

        self._require_root()
        target = Path(path) if path is not None else self.meta_path
        for _ in range(PUT_ATTEMPTS):
            with self.index.reading() as conn:
                checked = check_snapshot(self, conn, jobs)
                if not checked.problems:
                    return target, export_meta(target, lambda: self.index.rows(conn),
                                               INDEX_NAME)
            held = still_current(self, checked.report(str(self.root)), checked.rows)
            if held.problems:
                raise unproven_export(held.problems, checked.rows)
        raise StoreError("the store's rows kept moving while export-meta checked them (gc "
                         "or compaction running); nothing written", path=str(self.root))


def unproven_export(problems: tuple[Problem, ...],
                    rows: dict[str, StoredObject]) -> IntegrityError:
    """The error of an export-meta that found ``problems`` (the first names the key, file
    and offset; the count says how many more). An overlap is named last: it is reported
    on the later of two ranges, which need not be the damaged one."""
    first = min(problems, key=lambda p: p.kind == "overlap")
    row = rows.get(first.key or "")
    more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
    return IntegrityError(f"store index entry {first.key} does not match its object "
                          f"({first.kind}: {first.detail}){more}; nothing written",
                          key=first.key, file=first.file,
                          offset=row.offset if row is not None else None, hint=REPAIR_HINT)
