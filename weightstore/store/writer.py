"""Writing payload bytes into the store, crash-safely.

Layout of a store root::

    <store root>/
      index.sqlite (+ -wal, -shm)   the index (format_version 2, :mod:`.index`)
      meta.json                 format 2 marker, or GE's maps after ``store export-meta``
      meta.json.lock            format 1's lock, taken while the index is created or migrated
      locks/<file>.lock         the lock of one combined file (+ ``.holder``: who holds it)
      weight_<hex>              per-weight object ("separate" kind): exactly the payload bytes
      <name>_weight_combined    combined file: payloads appended, each starting at a multiple
                                of the alignment, zero-padded between
      .<final name>.<random>.tmp    temp file of a write in progress, held by its writer
                                (a leftover of a killed one otherwise: :mod:`.temps`)

Neither writer holds the store-wide lock (the index's write transaction) while bytes move:
per-weight objects are written to verified, fsynced temp files that the caller renames
into place in the transaction that records their rows, and combined files are appended to
under their own file lock. Every object is re-hashed from the file it was written to and
compared with its key before it counts as complete: a source that changed after the caller
hashed it (same size, other bytes) is an :class:`IntegrityError`, never an index entry. A
combined file only grows at its end, past every byte that is already there, so a crashed
append leaves garbage that nothing references, the next append skips and compaction
reclaims.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..errors import REPAIR_HINT, IntegrityError, StoreError
from ..io.digests import digest_fd, make_key, split_key
from ..io.files import (
    WRITEBACK_MIN,
    align_up,
    copy_range,
    file_mode,
    fsync_dir,
    locked_temp,
    name_path,
    start_writeback,
    write_all,
)
from .layout import separate_file_name
from .objects import StoredObject
from .payload import PayloadSource

_O_BINARY = getattr(os, "O_BINARY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@dataclass(frozen=True)
class WriteOutcome:
    """Objects now complete on disk (input order), and the error that stopped the rest.

    ``staged`` holds, for per-weight objects, the verified temp file of each object: the
    caller renames them into place while it records their rows (:func:`publish_staged`).
    """

    objects: tuple[StoredObject, ...]
    written_bytes: int
    padding_bytes: int
    error: BaseException | None = None
    staged: tuple[Path, ...] = ()


def write_separate(root: Path, sources: Sequence[PayloadSource], jobs: int) -> WriteOutcome:
    """Write each source to a verified, fsynced temp file on a thread pool (file I/O
    releases the GIL); nothing appears under a final name yet."""
    done: dict[str, tuple[StoredObject, Path]] = {}
    error: BaseException | None = None
    if sources:
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as pool:
            futures: list[Future[tuple[StoredObject, Path]]] = [
                pool.submit(_stage_one, root, src) for src in sources]
            try:
                for fut in as_completed(futures):
                    try:
                        obj, tmp = fut.result()
                    except BaseException as exc:
                        if error is None:
                            error = exc
                            for other in futures:
                                other.cancel()
                        continue
                    done[obj.key] = (obj, tmp)
            except BaseException:
                for other in futures:
                    other.cancel()
                discard([tmp for _, tmp in done.values()])
                raise
    # Input order, so the result never depends on which thread finished first.
    staged = [done[src.key] for src in sources if src.key in done]
    return WriteOutcome(objects=tuple(o for o, _ in staged),
                        written_bytes=sum(o.size for o, _ in staged), padding_bytes=0,
                        error=error, staged=tuple(t for _, t in staged))


_STAGED: dict[Path, int] = {}  # a staged temp file -> the descriptor that holds it


def _stage_one(root: Path, src: PayloadSource) -> tuple[StoredObject, Path]:
    """Write ``src`` to a held temp file (:func:`locked_temp`), kept open, and so held,
    until :func:`publish_staged` renames it or :func:`discard` removes it: a sweep never
    takes a staged object waiting for its row."""
    name = separate_file_name(src.key)
    fd, tmp = locked_temp(root, f".{name}.")
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, file_mode())
        copy_payload(src, fd, 0, root / name)
        start_writeback(fd)  # the disk works while the object is re-hashed
        check_written(src, fd, 0)
        os.fsync(fd)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.close(fd)
        if isinstance(exc, OSError):  # a full disk names the store file it was writing
            raise name_path(exc, root / name) from None
        raise
    _STAGED[Path(tmp)] = fd
    return StoredObject(key=src.key, file=name, offset=0, size=src.size), Path(tmp)


def _let_go(path: Path) -> None:
    fd = _STAGED.pop(path, None)
    if fd is not None:
        os.close(fd)


def publish_staged(root: Path, objects: Sequence[StoredObject], staged: Sequence[Path],
                   renamed: list[Path] | None = None) -> None:
    """Rename verified temp files to their final names (the caller records the rows in the
    same transaction, so gc never sees a final name without its row). ``renamed`` gets
    each temp path as it is renamed away: the caller discards only the others, since a
    name renamed away may be taken again meanwhile (a pull's partial file, by the next
    pull of the blob)."""
    for obj, tmp in zip(objects, staged, strict=True):
        try:
            os.replace(tmp, root / obj.file)
        except IsADirectoryError:
            clear_folder_object(root / obj.file)
            os.replace(tmp, root / obj.file)
        _let_go(tmp)
        if renamed is not None:
            renamed.append(tmp)
    if objects:
        fsync_dir(root)


def clear_folder_object(path: Path) -> bool:
    """A folder standing where a per-weight object belongs is damage (objects are files):
    an empty one is removed; one that holds anything is never deleted, and is an error
    naming it. False when ``path`` is no folder."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        os.rmdir(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError("a folder that is not empty stands where a store object belongs; "
                         "move it out of the store", path=str(path),
                         reason=exc.strerror) from None
    return True


def discard(paths: Sequence[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _let_go(path)


def append_combined(root: Path, file: str, sources: Sequence[PayloadSource], alignment: int,
                    jobs: int = 1) -> WriteOutcome:
    """Append sources to ``file`` in order, each at an aligned offset past the current end.

    The caller holds the file's own lock. The current end is the file's actual size, so
    bytes from an interrupted append are skipped, never reused; an index row that claims
    more than the file holds is damage for verify to report, never a reason to write past
    the end (a damaged offset of 2**40 must not create a 1 TiB sparse file).
    Each range is re-hashed on a pool of ``jobs`` threads while the next ones are copied.
    On error (a failed copy or a range whose bytes do not match its key) the file is cut
    back to the end of the last object before the first failure and fsynced, so the objects
    returned are durable and verified, and nothing unverified remains past them.
    """
    path = root / file
    existed = path.exists()
    # never through a symbolic link, never waiting on a FIFO: only a regular file grows
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_BINARY | _O_NOFOLLOW | _O_NONBLOCK,
                 file_mode())
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError("combined store file is not a regular file (damage)",
                             path=str(path), hint=REPAIR_HINT)
    try:
        start = os.fstat(fd).st_size
        base_end = end = start
        placed: list[StoredObject] = []
        checks: list[Future[None]] = []
        failed = threading.Event()
        error: BaseException | None = None
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            try:
                for src in sources:
                    if failed.is_set():
                        break  # a range already failed its check: everything after is cut
                    offset = align_up(end, alignment)
                    copy_payload(src, fd, offset, path)
                    if src.size >= WRITEBACK_MIN:
                        start_writeback(fd, offset, src.size)  # the disk works meanwhile
                    if src.size == 0 and os.fstat(fd).st_size < offset:
                        os.ftruncate(fd, offset)  # the empty object still lies inside the file
                    checks.append(pool.submit(_check_flagged, failed, src, fd, offset))
                    placed.append(StoredObject(key=src.key, file=file, offset=offset,
                                               size=src.size))
                    end = offset + src.size
                start_writeback(fd)  # the disk works while the last ranges are re-hashed
            except BaseException as exc:
                error = name_path(exc, path) if isinstance(exc, OSError) else exc
        # Every check has finished; keep the objects before the first one that failed.
        objects: list[StoredObject] = []
        for obj, check in zip(placed, checks, strict=True):
            exc = check.exception()
            if exc is not None:
                # the earliest failure, whatever stopped the copying later
                error = name_path(exc, path) if isinstance(exc, OSError) else exc
                break
            objects.append(obj)
        if error is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, objects[-1].end if objects else start)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise name_path(exc, path) from None
    finally:
        os.close(fd)
    if not existed and not objects:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    fsync_dir(root)
    written = sum(o.size for o in objects)
    padding = objects[-1].end - base_end - written if objects else 0
    return WriteOutcome(objects=tuple(objects), written_bytes=written, padding_bytes=padding,
                        error=error)


def _check_flagged(failed: threading.Event, src: PayloadSource, fd: int, offset: int) -> None:
    try:
        check_written(src, fd, offset)
    except BaseException:
        failed.set()
        raise


def check_written(src: PayloadSource, fd: int, offset: int) -> None:
    """Re-hash the ``src.size`` bytes just written at ``offset`` of ``fd`` against the key."""
    algo, expected = split_key(src.key)
    actual = digest_fd(algo, fd, offset, src.size)
    if actual != expected:
        raise IntegrityError("payload bytes do not match their key (did the source change "
                             "after it was hashed?)", key=src.key, source=src.describe(),
                             got=make_key(algo, actual))


def copy_payload(src: PayloadSource, fd: int, offset: int, dest: Path) -> None:
    """Put exactly ``src.size`` bytes at ``offset`` of ``fd`` (the store file ``dest``), in
    the kernel when possible. An error that names no file names ``dest`` when it is about
    writing (a full disk), else the source it was reading."""
    where = src.file_range()
    if where is not None:
        src_path, src_offset = where
        src_fd = os.open(src_path, os.O_RDONLY | _O_BINARY)
        try:
            copy_range(src_fd, src_offset, fd, offset, src.size)
        except EOFError as exc:
            raise IntegrityError("payload file ends before the payload does", key=src.key,
                                 path=src_path, offset=src_offset, size=src.size) from exc
        except OSError as exc:
            raise name_path(exc, dest, src_path) from None
        finally:
            os.close(src_fd)
        return
    data = src.read()
    got = memoryview(data).nbytes
    if got != src.size:
        raise IntegrityError("payload source returned the wrong number of bytes",
                             key=src.key, expected=src.size, got=got)
    try:
        write_all(fd, data, offset)
    except OSError as exc:
        raise name_path(exc, dest) from None
