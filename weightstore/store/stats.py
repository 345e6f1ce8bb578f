"""How much the store holds and how much of the disk it spends holding it.

Deduplication is the point of the store, so the numbers that matter are the unique payload
bytes against the bytes on disk; the difference is alignment padding plus bytes nothing
references (tails of interrupted appends, orphan files).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .layout import kind_of, scan


@dataclass(frozen=True)
class StoreStats:
    """A snapshot; for a healthy store ``bytes_on_disk == payload_bytes + padding_bytes +
    unreferenced_bytes``."""

    root: str
    objects: int
    separate_objects: int
    combined_objects: int
    payload_bytes: int
    bytes_on_disk: int
    padding_bytes: int
    unreferenced_bytes: int
    files: int
    separate_files: int
    combined_files: int
    orphan_files: int
    missing_files: int

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)


def compute_stats(root: Path, files: list[tuple[str, int, int, int]]) -> StoreStats:
    """``files``: ``(file, objects, payload bytes, end of the last range)`` per indexed file,
    aggregated by the index, so memory does not grow with the number of objects.

    Padding = bytes before or between indexed ranges of a file; unreferenced = the rest
    (tails past the last range, orphan files).
    """
    sizes = dict(scan(root).objects)
    indexed = {f[0] for f in files}
    orphans = [name for name in sizes if name not in indexed]
    missing = 0
    padding = 0
    unreferenced = sum(sizes[name] for name in orphans)
    for file, _, payload, end in files:
        if file not in sizes:
            try:
                sizes[file] = os.stat(root / file).st_size
            except OSError:
                missing += 1
                continue
        size = sizes[file]
        reach = min(end, size)
        padding += max(0, reach - min(payload, reach))
        unreferenced += size - reach
    separate = sum(n for f, n, _, _ in files if kind_of(f) == "separate")
    combined = sum(n for f, n, _, _ in files if kind_of(f) == "combined")
    file_kinds = [kind_of(name) for name in sizes]
    return StoreStats(
        root=str(root),
        objects=separate + combined,
        separate_objects=separate,
        combined_objects=combined,
        payload_bytes=sum(payload for _, _, payload, _ in files),
        bytes_on_disk=sum(sizes.values()),
        padding_bytes=padding,
        unreferenced_bytes=unreferenced,
        files=len(sizes),
        separate_files=file_kinds.count("separate"),
        combined_files=file_kinds.count("combined"),
        orphan_files=len(orphans),
        missing_files=missing,
    )
