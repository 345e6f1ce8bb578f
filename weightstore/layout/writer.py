"""Executes a :class:`~weightstore.layout.plan.LayoutPlan`: writes weight files, verified.

Bytes are copied in the kernel (``os.copy_file_range``) from wherever the caller says a
payload lives, then every file is read back once: each written range is re-hashed and
compared with its key, so a corrupt source never reaches a package, and the same read
gives the whole file's digest for the package's inventory. Each file is published by
temp + fsync + rename: the worker that read a file back fsyncs it, so the fsyncs of many
small files run side by side, and the folder is fsynced once per batch. The padding
between payloads is written as zero bytes wherever it could span a whole file-system
block: a written file has no sparse holes, which copies and archives would inflate.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import REPAIR_HINT, IntegrityError
from ..io.digests import CHUNK, make_key, new_hasher, split_key
from ..io.files import (
    WRITEBACK_MIN,
    NotRegularFileError,
    atomic_writer,
    copy_range,
    fsync_dir,
    name_path,
    open_regular,
    start_writeback,
    write_all,
)
from .plan import LayoutPlan, PlannedFile, PlannedPayload

OPEN_FILES = 64  # weight files written at once, at most


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
               progress: Callable[[int], None] | None = None,
               file_digest: str | None = None, sync_dir: bool = True) -> dict[str, str]:
    """Write every file of ``plan`` into ``folder``; ``locate(key)`` finds each payload.

    Copies are spread by payload, not by file, so one big combined file keeps every worker
    busy as well as many separate files do. Each file is then read back once, in order:
    that one read verifies its payloads and, with ``file_digest`` (an algorithm), also
    digests the whole file, padding included. Returns ``{file name: "<algo>:<hex>"}``
    (empty without ``file_digest``), so callers never read a written byte again to list
    it. Files are opened a batch at a time. ``sync_dir`` False: ``folder`` is a temp
    folder its caller publishes with :func:`~weightstore.io.files.publish_dir` (one fsync of
    the folder for every file, instead of one per file).
    """
    for parent in sorted({(folder / f.name).parent for f in plan.files}):
        parent.mkdir(parents=True, exist_ok=True)  # split separate layouts: group folders
    batch = files_per_batch()
    digests: dict[str, str] = {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for i in range(0, len(plan.files), batch):
            digests.update(_write_batch(plan.files[i:i + batch], folder, locate, pool,
                                        progress, file_digest, sync_dir))
    return digests


def _write_batch(files: Sequence[PlannedFile], folder: Path, locate: PayloadLocator,
                 pool: ThreadPoolExecutor, progress: Callable[[int], None] | None,
                 file_digest: str | None, sync_dir: bool) -> dict[str, str]:
    with contextlib.ExitStack() as stack:
        # durable here: _check_and_sync fsyncs each file before it is renamed
        handles = [stack.enter_context(atomic_writer(folder / f.name, "w+b", durable=False))
                   for f in files]
        copies = {(f.name, p.offset): pool.submit(_copy_payload, h.fileno(), p, locate,
                                                  folder / f.name)
                  for f, h in zip(files, handles, strict=True) for p in f.payloads}
        _results(copies.values())  # every copy is done before any file is read back
        sources = {where: future.result() for where, future in copies.items()}
        for f, h in zip(files, handles, strict=True):
            _fill_gaps(h.fileno(), f, folder / f.name)
            os.ftruncate(h.fileno(), f.size)
            start_writeback(h.fileno())  # the disk works while the files are read back
        checks = [pool.submit(_check_and_sync, h.fileno(), f, sources, file_digest, progress,
                              folder / f.name)
                  for f, h in zip(files, handles, strict=True)]
        _results(checks)  # every worker is done with the files before any can be closed
    if sync_dir:  # the renames, once per folder
        for parent in sorted({(folder / f.name).parent for f in files}):
            fsync_dir(parent)
    return {f.name: digest for f, future in zip(files, checks, strict=True)
            if (digest := future.result()) is not None}


HOLE_BLOCK = 4096  # the largest block a gap is judged against (ext4, XFS, btrfs, tmpfs)
_ZEROS = bytes(1 << 20)


def hole_block(fd: int) -> int:
    """The block size a hole in ``fd``'s file system would span: its fundamental block
    (``f_frsize``: 1 KiB on a small ext4, 512 bytes on some), at most :data:`HOLE_BLOCK`
    (a larger block only leaves fewer gaps that could be holes)."""
    try:
        found = os.fstatvfs(fd).f_frsize
    except OSError:
        found = 0
    return min(found, HOLE_BLOCK) if found > 0 else 512


def spans_block(start: int, end: int, block: int) -> bool:
    """Does the gap ``[start, end)`` hold a whole ``block``-aligned block, which the file
    system would leave a hole unless it is written?"""
    return -(-start // block) * block + block <= end


def _fill_gaps(fd: int, f: PlannedFile, path: Path) -> None:
    """Write zeros into the gaps of ``f`` (between its payloads and after the last) that
    could leave a hole; the others share each of their blocks with a payload's bytes."""
    block = hole_block(fd)
    pos = 0
    for start, end in [*((p.offset, p.offset + p.size)
                         for p in sorted(f.payloads, key=lambda p: p.offset)),
                       (f.size, f.size)]:
        if spans_block(pos, start, block):
            for at in range(pos, start, len(_ZEROS)):
                try:
                    write_all(fd, memoryview(_ZEROS)[:min(start - at, len(_ZEROS))], at)
                except OSError as exc:
                    raise name_path(exc, path) from None
        pos = max(pos, end)


def _check_and_sync(fd: int, f: PlannedFile, sources: Mapping[tuple[str, int], FileRange | None],
                    file_digest: str | None, progress: Callable[[int], None] | None,
                    path: Path) -> str | None:
    """:func:`_check_file`, then the file's fsync (its temp file is renamed to ``path``
    once every file of the batch is checked and durable)."""
    digest = _check_file(fd, f, sources, file_digest, progress)
    try:
        os.fsync(fd)
    except OSError as exc:
        raise name_path(exc, path) from None
    return digest


def _results(futures: Iterable[Future[Any]]) -> None:
    """Wait for all of ``futures``, then raise the first error in submission order."""
    futures = list(futures)
    wait(futures)
    for future in futures:
        future.result()


def _copy_payload(fd: int, p: PlannedPayload, locate: PayloadLocator,
                  dest: Path) -> FileRange | None:
    """Copy one payload to its offset; returns where it came from (None: from memory)."""
    source = locate(p.key)
    if isinstance(source, FileRange):
        hint = REPAIR_HINT if source.stored else None
        try:
            # a store object that is not a regular file (a FIFO would block this open
            # forever) is damage; a source the caller names is opened as it is
            src = (open_regular(source.path, nofollow=True) if source.stored
                   else os.open(source.path, os.O_RDONLY))
        except NotRegularFileError as exc:
            raise IntegrityError(f"store object is {exc} (damage)", key=p.key,
                                 file=str(source.path), hint=hint) from None
        except OSError as exc:
            if source.stored and exc.errno == errno.ELOOP:
                raise IntegrityError("store object is a symbolic link (damage)", key=p.key,
                                     file=str(source.path), hint=hint) from None
            raise OSError(exc.errno, exc.strerror, str(source.path)) from None
        try:
            copy_range(src, source.offset, fd, p.offset, p.size)
            if p.size >= WRITEBACK_MIN:
                start_writeback(fd, p.offset, p.size)  # the disk works meanwhile
        except EOFError as exc:
            raise IntegrityError(f"payload source is short: {exc}", key=p.key,
                                 file=str(source.path), hint=hint) from None
        except OSError as exc:
            raise _name_path(exc, dest, source.path) from None
        finally:
            os.close(src)
        return source
    if len(source) != p.size:
        raise IntegrityError("payload has the wrong size", key=p.key, size=len(source),
                             expected=p.size)
    try:
        write_all(fd, source, p.offset)
    except OSError as exc:
        raise _name_path(exc, dest, dest) from None
    return None


def _name_path(exc: OSError, dest: Path, src: Path) -> OSError:
    """The error with the file it concerns: the written one for a full or read-only
    disk, else the one read from."""
    return name_path(exc, dest, src)


def _check_file(fd: int, f: PlannedFile, sources: Mapping[tuple[str, int], FileRange | None],
                file_digest: str | None, progress: Callable[[int], None] | None,
                ) -> str | None:
    """Read ``f`` back once, in order: each payload's bytes feed its own hasher (checked
    against its key), every byte feeds the file's (when ``file_digest`` is given).

    A file that is one payload and nothing else (separate layouts) is hashed once: its
    digest in the payload's algorithm is the payload's, checked against the key."""
    payloads = sorted(f.payloads, key=lambda p: p.offset)
    hashers = [new_hasher(split_key(p.key)[0]) for p in payloads]
    if (len(payloads) == 1 and payloads[0].size == f.size
            and split_key(payloads[0].key)[0] == file_digest):
        file_digest = None
        only = payloads[0].key  # verified below, or this raises
    else:
        only = None
    whole = new_hasher(file_digest) if file_digest else None
    buf = bytearray(min(CHUNK, f.size))
    view = memoryview(buf)
    pos, i = 0, 0  # i: the first payload not yet fully read
    try:
        while pos < f.size:
            n = os.preadv(fd, [view[:min(CHUNK, f.size - pos)]], pos)
            if n <= 0:
                raise IntegrityError("written file became shorter while it was read back",
                                     file=f.name, offset=pos, size=f.size)
            chunk, end = view[:n], pos + n
            if whole is not None:
                whole.update(chunk)
            j = i
            while j < len(payloads) and payloads[j].offset < end:
                p = payloads[j]
                lo, hi = max(p.offset, pos), min(p.offset + p.size, end)
                if lo < hi:
                    hashers[j].update(chunk[lo - pos:hi - pos])
                if p.offset + p.size <= end:
                    _verify(p, hashers[j].hexdigest(), f.name, sources[(f.name, p.offset)])
                    i = j + 1
                j += 1
            if progress is not None:
                progress(n)
            pos = end
    finally:
        view.release()
    for p, h in zip(payloads[i:], hashers[i:], strict=True):  # empty payloads at the end
        _verify(p, h.hexdigest(), f.name, sources[(f.name, p.offset)])
    if only is not None:
        return only
    return make_key(file_digest, whole.hexdigest()) if whole is not None else None


def _verify(p: PlannedPayload, actual: str, name: str, source: FileRange | None) -> None:
    algo, expected = split_key(p.key)
    if actual != expected:
        where = {}
        if source is not None:
            where = {"source": str(source.path), "source_offset": source.offset}
            if source.stored:
                where["hint"] = REPAIR_HINT
        raise IntegrityError("written payload does not match its digest", key=p.key,
                             actual=f"{algo}:{actual}", file=name, offset=p.offset, **where)
