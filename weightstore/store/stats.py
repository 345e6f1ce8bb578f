"""How much the store holds and how much of the disk it spends holding it.

Deduplication is the point of the store, so the numbers that matter are the unique payload
bytes against the bytes on disk; the difference is alignment padding plus bytes nothing
references (tails of interrupted appends, orphan files).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from .index import StoredObject
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


def compute_stats(root: Path, index: dict[str, StoredObject]) -> StoreStats:
    """Padding = bytes before or between indexed ranges of a file; unreferenced = the rest."""
    by_file: dict[str, list[StoredObject]] = defaultdict(list)
    for obj in index.values():
        by_file[obj.file].append(obj)
    sizes = dict(scan(root).objects)
    orphans = [name for name in sizes if name not in by_file]
    missing = 0
    for file in by_file:
        if file not in sizes:
            try:
                sizes[file] = os.stat(root / file).st_size
            except FileNotFoundError:
                missing += 1
    padding = 0
    unreferenced = sum(sizes[name] for name in orphans)
    for file, objs in by_file.items():
        size = sizes.get(file)
        if size is None:
            continue
        pos = 0
        for obj in sorted(objs, key=lambda o: (o.offset, o.end)):
            start, end = min(obj.offset, size), min(obj.end, size)
            padding += max(0, start - pos)
            pos = max(pos, end)
        unreferenced += size - pos
    kinds = [kind_of(obj.file) for obj in index.values()]
    file_kinds = [kind_of(name) for name in sizes]
    return StoreStats(
        root=str(root),
        objects=len(index),
        separate_objects=kinds.count("separate"),
        combined_objects=kinds.count("combined"),
        payload_bytes=sum(obj.size for obj in index.values()),
        bytes_on_disk=sum(sizes.values()),
        padding_bytes=padding,
        unreferenced_bytes=unreferenced,
        files=len(sizes),
        separate_files=file_kinds.count("separate"),
        combined_files=file_kinds.count("combined"),
        orphan_files=len(orphans),
        missing_files=missing,
    )
