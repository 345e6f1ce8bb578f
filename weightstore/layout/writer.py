"""Executes a :class:`~weightstore.layout.plan.LayoutPlan`: writes weight files, verified.

Bytes are copied in the kernel (``os.copy_file_range``) from wherever the caller says a
payload lives, then every written range is re-hashed and compared with its key, so a
corrupt source never reaches a package. Each file is published by temp + fsync + rename.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError
from ..fsio import WRITE_ERRNOS, atomic_writer, copy_range, write_all
from ..hashing import digest_fd, split_key
from .plan import LayoutPlan, PlannedFile, PlannedPayload

OPEN_FILES = 64  # weight files written at once, at most
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
REPAIR_HINT = "run `weightstore store verify --repair`"


def files_per_batch() -> int:
    """How many weight files a batch holds open: :data:`OPEN_FILES`, or a quarter of the
    process's open-file limit when that is lower (a build under ``ulimit -n 64`` leaves
    the rest to payload sources, the store, its locks and the interpreter)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return OPEN_FILES
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return OPEN_FILES
    return max(1, min(OPEN_FILES, soft // 4))


@dataclass(frozen=True)
class FileRange:
    """Payload bytes sitting in a file; ``stored``: a store object, which is never reached
    through a symbolic link and whose damage is reported with the way to repair it."""

    path: Path
    offset: int
    stored: bool = False


PayloadLocator = Callable[[str], "FileRange | bytes"]


def write_plan(plan: LayoutPlan, folder: Path, locate: PayloadLocator, *, jobs: int = 4,
               progress: Callable[[int], None] | None = None) -> None:
    """Write every file of ``plan`` into ``folder``; ``locate(key)`` finds each payload.

    Work is spread by payload, not by file, so one big combined file keeps every worker
    busy as well as many separate files do. Files are opened a batch at a time.
    """
    for parent in sorted({(folder / f.name).parent for f in plan.files}):
        parent.mkdir(parents=True, exist_ok=True)  # split separate layouts: group folders
    batch = files_per_batch()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for i in range(0, len(plan.files), batch):
            _write_batch(plan.files[i:i + batch], folder, locate, pool, progress)


def _write_batch(files: Sequence[PlannedFile], folder: Path, locate: PayloadLocator,
                 pool: ThreadPoolExecutor, progress: Callable[[int], None] | None) -> None:
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(atomic_writer(folder / f.name, "w+b")) for f in files]
        futures = [pool.submit(_write_payload, h.fileno(), p, locate, f.name, folder / f.name)
                   for f, h in zip(files, handles, strict=True) for p in f.payloads]
        wait(futures)  # every worker is done with the files before any can be closed
        for future in futures:
            future.result()
            if progress is not None:
                progress(future.result())
        for f, h in zip(files, handles, strict=True):
            os.ftruncate(h.fileno(), f.size)


def _write_payload(fd: int, p: PlannedPayload, locate: PayloadLocator, name: str,
                   dest: Path) -> int:
    """Copy one payload to its offset and verify what landed there; returns its size."""
    source = locate(p.key)
    if isinstance(source, FileRange):
        hint = REPAIR_HINT if source.stored else None
        try:
            src = os.open(source.path, os.O_RDONLY | (_NOFOLLOW if source.stored else 0))
        except OSError as exc:
            if source.stored and exc.errno == errno.ELOOP:
                raise IntegrityError("store object is a symbolic link (damage)", key=p.key,
                                     file=str(source.path), hint=hint) from None
            raise OSError(exc.errno, exc.strerror, str(source.path)) from None
        try:
            copy_range(src, source.offset, fd, p.offset, p.size)
        except EOFError as exc:
            raise IntegrityError(f"payload source is short: {exc}", key=p.key,
                                 file=str(source.path), hint=hint) from None
        except OSError as exc:
            raise _name_path(exc, dest, source.path) from None
        finally:
            os.close(src)
    else:
        if len(source) != p.size:
            raise IntegrityError("payload has the wrong size", key=p.key, size=len(source),
                                 expected=p.size)
        try:
            write_all(fd, source, p.offset)
        except OSError as exc:
            raise _name_path(exc, dest, dest) from None
    _verify(fd, p, name, source if isinstance(source, FileRange) else None)
    return p.size


def _name_path(exc: OSError, dest: Path, src: Path) -> OSError:
    """The error with the file it concerns: the written one for a full or read-only
    disk, else the one read from."""
    if exc.filename:
        return exc
    path = dest if exc.errno in WRITE_ERRNOS else src
    return OSError(exc.errno, exc.strerror, str(path))


def _verify(fd: int, p: PlannedPayload, name: str, source: FileRange | None) -> None:
    algo, expected = split_key(p.key)
    actual = digest_fd(algo, fd, p.offset, p.size, name=name)
    if actual != expected:
        where = {}
        if source is not None:
            where = {"source": str(source.path), "source_offset": source.offset}
            if source.stored:
                where["hint"] = REPAIR_HINT
        raise IntegrityError("written payload does not match its digest", key=p.key,
                             actual=f"{algo}:{actual}", file=name, offset=p.offset, **where)
