"""Exclusive file locks (filelock), with timeouts that become typed errors.

The store's index and each package folder have one: a lock is taken before reading what
it protects, and correctness still comes from temp + rename, so a lock that silently
fails on an exotic filesystem costs duplicate work, never a torn file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .errors import PackageError, WeightstoreError
from .fsio import file_mode

PACKAGE_LOCK_TIMEOUT = 3600.0


@contextlib.contextmanager
def file_lock(path: Path, timeout: float, error: type[WeightstoreError], what: str,
              ) -> Iterator[Path]:
    """Hold ``path`` exclusively (negative timeout: wait forever).

    The lock file gets an ordinary file's mode (0666 less the umask), so every user who may
    write a shared store or output folder can also lock it.
    """
    from filelock import FileLock, Timeout  # imported on first use: it costs ~35 ms

    lock = FileLock(path, timeout=timeout, mode=file_mode())
    try:
        lock.acquire()
    except Timeout as exc:
        raise error(f"timed out waiting for the {what} lock; another build holds it",
                    lock=str(path), timeout=timeout) from exc
    except OSError as exc:
        raise error(f"cannot open the {what} lock: {exc.strerror}", lock=str(path)) from exc
    try:
        yield path
    finally:
        lock.release()


def target_lock(target: Path, timeout: float = PACKAGE_LOCK_TIMEOUT):
    """The lock of one package folder: ``.<name>.lock`` beside it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(target.parent / f".{target.name}.lock", timeout, PackageError,
                     "package folder")
