"""Recovering from objects damaged on disk after they were written.

Verification finds them; repair takes them out of the index, so that the next build sees
their keys as missing and writes them again from its sources. Nothing is rewritten here:
the store holds no other copy of a payload. A per-weight file is deleted once no entry
refers to it; a damaged range of a combined file is only unindexed (the file never shrinks
under ranges that other entries may still hold, and appends always go past its end).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fsio import fsync_dir
from .index import StoredObject, write_index
from .layout import SEPARATE_PREFIX, kind_of
from .verify import VerifyReport, verify_objects


@dataclass(frozen=True)
class RepairReport:
    """``found``: the verification before the repair; ``remaining``: the store after it."""

    root: str
    found: VerifyReport
    dropped: tuple[StoredObject, ...]
    deleted_files: tuple[str, ...]
    remaining: VerifyReport

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
            "remaining": self.remaining.to_dict(),
        }


def drop_damaged(root: Path, meta_path: Path, index: dict[str, StoredObject],
                 jobs: int) -> RepairReport:
    """Verify ``index``, unindex every entry with a problem, delete files nothing refers to.

    The caller holds the store lock. The index is replaced before any file is deleted, so
    a crash in between leaves unindexed files (warnings), never entries without bytes.
    """
    found = verify_objects(root, index, jobs)
    bad = {p.key for p in found.problems if p.key in index}
    kept = {key: obj for key, obj in index.items() if key not in bad}
    dropped = tuple(sorted((index[key] for key in bad), key=lambda o: (o.file, o.key)))
    if dropped:
        write_index(meta_path, kept)
    still_used = {obj.file for obj in kept.values()}
    deleted: list[str] = []
    for file in sorted({obj.file for obj in dropped} - still_used):
        # Only per-weight objects: never a combined file, nor whatever else a damaged
        # index might name (meta.json, the lock, caches).
        if not (file.startswith(SEPARATE_PREFIX) and kind_of(file) == "separate"):
            continue
        try:
            os.unlink(root / file)
        except FileNotFoundError:
            continue
        except OSError:
            continue  # left in place: the next verify reports it as an orphan file
        deleted.append(file)
    if deleted:
        fsync_dir(root)
    remaining = verify_objects(root, kept, jobs, trusted=kept.keys())
    return RepairReport(root=str(root), found=found, dropped=dropped,
                        deleted_files=tuple(deleted), remaining=remaining)
