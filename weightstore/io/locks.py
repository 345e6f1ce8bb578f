"""Exclusive file locks (filelock's ``flock``), with timeouts that become typed errors.

The store's index and each package folder have one: a lock is taken before reading what
it protects, and correctness still comes from temp + rename, so a lock that silently
fails on an exotic filesystem costs duplicate work, never a torn file.

Lock files are taken through ``filelock``; a pull's partial file is flocked itself
(:func:`partial_file_lock`), as every temp file of the store is held by its writer
(:mod:`weightstore.store.temps`), since filelock empties the file it locks. Both wait
through one loop, :func:`_wait_for`: polled, the holder named on stderr while waiting, a
typed error past the timeout, and taken only once the file locked is the one at the path.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PackageError, WeightstoreError
from .files import atomic_write_bytes, file_mode, parse_json, read_regular

PACKAGE_LOCK_TIMEOUT = 3600.0
LOCKS_DIR = "locks"


WAIT_REPORT_SECONDS = 10.0
POLL_SECONDS = 0.05
# a file system that has no flock: no lock, correctness from temp + rename (module doc)
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

_T = TypeVar("_T")


def _wait_for(attempt: Callable[[], _T | None], path: Path, timeout: float,
              error: type[WeightstoreError], what: str, key: str,
              holder: Callable[[], str]) -> _T:
    """``attempt()`` every :data:`POLL_SECONDS` until it holds the lock (its answer is
    not None); past ``timeout`` (negative: never) ``error`` names the file (under
    ``key``) and ``holder()``, which a waiter also prints on stderr every
    :data:`WAIT_REPORT_SECONDS`. The one waiting loop of every lock here."""
    start = last_report = time.monotonic()
    while True:
        held = attempt()
        if held is not None:
            return held
        now = time.monotonic()
        if 0 <= timeout <= now - start:
            raise error(f"timed out waiting for the {what}; {holder()}",
                        **{key: str(path)}, timeout=timeout)
        if now - last_report >= WAIT_REPORT_SECONDS:
            last_report = now
            print(f"weightstore: waiting {now - start:.0f} s for the {what} {path}: "
                  f"{holder()}", file=sys.stderr, flush=True)
        time.sleep(POLL_SECONDS)


class _Replaced(Exception):
    """The lock was taken on a file no longer at the lock's path (its holder removed it)."""


def _same_file(path: Path, fd: int, *, follow: bool = True) -> bool:
    """Is the open file ``fd`` still the file at ``path``?"""
    try:
        here = os.stat(path, follow_symlinks=follow)
    except FileNotFoundError:
        return False
    return os.path.samestat(here, os.fstat(fd))


@contextlib.contextmanager
def file_lock(path: Path, timeout: float, error: type[WeightstoreError], what: str,
              *, removable: bool = False,
              remove_if: Callable[[], bool] | None = None) -> Iterator[Path]:
    """Hold ``path`` exclusively (negative timeout: wait forever), through ``filelock``:
    one lock object per holder, so two holders in one process exclude each other as two
    processes do.

    The lock file gets an ordinary file's mode (0666 less the umask), so every user who may
    write a shared store or output folder can also lock it. The holder writes its pid, host
    and start time to ``<path>.holder``; a waiter prints them on stderr every
    :data:`WAIT_REPORT_SECONDS` instead of waiting silently.

    ``removable``: for locks named after something transient (an upload session), so
    that their files do not pile up. The holder unlinks the lock file before it unlocks;
    every taker checks, once it holds the lock, that the file it locked is still the one at
    the path, and otherwise takes the lock again (a waiter that had opened the removed file
    would else hold a lock nobody else sees). flock locks the file, not its name, so this
    check is what makes removal safe; filelock hands the locked descriptor to it through
    ``on_acquired``. With a filelock before that (:func:`lock_files_removable`), the file
    is kept.

    ``remove_if``: for locks named after something that may go away (a combined store
    file): the lock file is removed on release, while still held, when ``remove_if()``
    says so (the thing it protects is gone), and every taker makes the same check as for
    ``removable``. Removal is safe whatever ``remove_if`` answers; it only decides when.
    """
    from filelock import Timeout  # imported on first use

    lock, checked = _new_lock(path, removable or remove_if is not None)

    def attempt() -> Any:
        try:
            lock.acquire(timeout=0)
        except (Timeout, _Replaced):  # held, or its holder removed it: the one there now
            return None
        except NotImplementedError:  # filelock's word for a file system without flock
            return False
        except OSError as exc:
            if exc.errno in _NO_FLOCK:  # no flock, and no soft lock with on_acquired
                return False
            raise
        return True

    try:
        locked = _wait_for(attempt, path, timeout, error, f"{what} lock", "lock",
                           lambda: holder_text(path))
    except OSError as exc:
        raise error(f"cannot open the {what} lock: {exc.strerror}",
                    lock=str(path)) from exc
    holder = _holder_path(path)
    try:
        with contextlib.suppress(OSError):
            atomic_write_bytes(holder, json.dumps({
                "pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode(),
                durable=False)  # a note for waiters: no fsync, a crash makes it moot
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(holder)
        if checked and locked and (removable or _asks_removal(remove_if)):
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still held: see the docstring
        if locked:
            lock.release()


def _new_lock(path: Path, removable: bool) -> tuple[Any, bool]:
    """A FileLock, and whether its file may be removed on release (every acquisition then
    checks that it locked the file at the path)."""
    from filelock import FileLock

    if not removable or not lock_files_removable():  # no locked descriptor: keep the file
        return FileLock(path, mode=file_mode()), False

    def same_file(fd: int) -> None:
        if not _same_file(path, fd):
            raise _Replaced

    return FileLock(path, mode=file_mode(), on_acquired=same_file), True


@functools.cache
def lock_files_removable() -> bool:
    """Whether removable lock files are removed: filelock hands the locked descriptor to
    an ``on_acquired`` check, as its signature says.

    The signature is read, not tried: on filelock 3.12, ``FileLock(..., on_acquired=...)``
    builds the object in ``__new__`` before ``__init__`` refuses the keyword, and that
    half-made lock's ``__del__`` prints an ignored-exception traceback, one per lock taken.
    """
    from filelock import FileLock

    try:
        return "on_acquired" in inspect.signature(FileLock).parameters
    except (TypeError, ValueError):  # no signature to read: keep the files
        return False


@contextlib.contextmanager
def partial_file_lock(path: Path, timeout: float, error: type[WeightstoreError],
                      what: str) -> Iterator[None]:
    """Hold the partial file ``path`` (a download in progress, kept to be resumed) by
    flocking the file itself: no lock file beside it, no holder note, one open.

    The file itself, not a lock file, because every temp file of the store is held by a
    flock on itself (a sweep removes the ones nobody holds: :mod:`weightstore.store.temps`)
    and filelock empties the file it locks (at open before 3.30, once held after), which
    would lose what a resumed download kept. Made for many small transient locks (one per
    blob of a pull). The file is created empty when absent. While holding it, the holder
    may write it, remove it or rename it away (into the store); a taker that waited
    checks, once it holds the lock, that the file it locked is still the one at the path,
    and otherwise takes the one there now (as :func:`file_lock` does for ``removable``
    locks). A symbolic link at the path is refused. A waiter says on stderr every
    :data:`WAIT_REPORT_SECONDS` what it waits for (:func:`_wait_for`).
    """
    import fcntl

    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

    def attempt() -> int | None:
        fd = os.open(path, flags, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                os.close(fd)
                raise
        if _same_file(path, fd, follow=False):
            return fd
        os.close(fd)  # replaced meanwhile: the file at the path now
        return None

    try:
        fd = _wait_for(attempt, path, timeout, error, what, "file",
                       lambda: "another process holds it")
    except OSError as exc:
        raise error(f"cannot open the {what}: {exc.strerror}", file=str(path)) from exc
    try:
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _asks_removal(remove_if: Callable[[], bool] | None) -> bool:
    """``remove_if()``; False when there is none or it cannot tell (an OSError)."""
    if remove_if is None:
        return False
    try:
        return remove_if()
    except OSError:
        return False


def _holder_path(path: Path) -> Path:
    return path.with_name(path.name + ".holder")


def holder_text(path: Path) -> str:
    """Who holds the lock, as its holder wrote it down."""
    try:
        doc = parse_json(read_regular(_holder_path(path)))
        return f"held by pid {doc['pid']} on {doc['host']} since {doc['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process holds it"


def target_lock(target: Path, store_root: Path, timeout: float = PACKAGE_LOCK_TIMEOUT):
    """The lock of one package folder, kept in the store, out of the output tree:
    ``<store>/locks/<blake3 of the folder's absolute path>.lock``.

    Builds of one folder through different stores are not serialized with each other;
    publishing stays atomic for them (temp folder + rename), so neither sees a torn folder.
    A store this user may only read (a read-only mount, or permissions) cannot hold the
    lock: a build served by it (every payload present) goes on without it, as a build
    through another store would.
    """
    from .digests import digest_bytes

    folder = store_root / LOCKS_DIR
    name = digest_bytes("blake3", os.fsencode(target.absolute()))
    path = folder / f"{name}.lock"
    if _read_only(store_root) and not _can_create(folder, path):
        return contextlib.nullcontext(path)
    folder.mkdir(parents=True, exist_ok=True)
    return file_lock(path, timeout, PackageError, "package folder")


def _read_only(root: Path) -> bool:
    """``root`` is on a read-only mount, or this user may not write it."""
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return True
    except (OSError, AttributeError):
        pass
    return root.is_dir() and not os.access(root, os.W_OK)


def _can_create(folder: Path, path: Path) -> bool:
    """Whether the lock file can be opened (created) for writing."""
    try:
        folder.mkdir(exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, file_mode()))
    except OSError:
        return False
    return True
