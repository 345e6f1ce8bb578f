"""Executes a :class:`~weightstore.layout.plan.LayoutPlan`: writes weight files, verified.

Bytes are copied in the kernel (``os.copy_file_range``) from wherever the caller says a
payload lives, then every written range is re-hashed and compared with its key, so a
corrupt source never reaches a package. Each file is published by temp + fsync + rename.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError
from ..fsio import atomic_writer, copy_range, write_all
from ..hashing import digest_fd, split_key
from .plan import LayoutPlan, PlannedFile


@dataclass(frozen=True)
class FileRange:
    """Payload bytes sitting in a file."""

    path: Path
    offset: int


PayloadLocator = Callable[[str], "FileRange | bytes"]


def write_plan(plan: LayoutPlan, folder: Path, locate: PayloadLocator, *, jobs: int = 4,
               progress: Callable[[int], None] | None = None) -> None:
    """Write every file of ``plan`` into ``folder``; ``locate(key)`` finds each payload."""
    def one(planned: PlannedFile) -> None:
        _write_file(planned, folder / planned.name, locate)
        if progress is not None:
            progress(sum(p.size for p in planned.payloads))

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, plan.files))


def _write_file(planned: PlannedFile, path: Path, locate: PayloadLocator) -> None:
    with atomic_writer(path, "w+b") as f:
        fd = f.fileno()
        for p in planned.payloads:
            source = locate(p.key)
            if isinstance(source, FileRange):
                src = os.open(source.path, os.O_RDONLY)
                try:
                    copy_range(src, source.offset, fd, p.offset, p.size)
                except EOFError as exc:
                    raise IntegrityError(f"payload source is short: {exc}", key=p.key,
                                         file=str(source.path)) from None
                finally:
                    os.close(src)
            else:
                if len(source) != p.size:
                    raise IntegrityError("payload has the wrong size", key=p.key,
                                         size=len(source), expected=p.size)
                write_all(fd, source, p.offset)
        os.ftruncate(fd, planned.size)
        for p in planned.payloads:
            _verify(fd, p.key, p.offset, p.size, path)


def _verify(fd: int, key: str, offset: int, size: int, path: Path) -> None:
    algo, expected = split_key(key)
    actual = digest_fd(algo, fd, offset, size, name=path.name)
    if actual != expected:
        raise IntegrityError("written payload does not match its digest", key=key,
                             actual=f"{algo}:{actual}", file=path.name, offset=offset)
