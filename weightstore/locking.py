"""Exclusive file locks (filelock), with timeouts that become typed errors.

The store's index and each package folder have one: a lock is taken before reading what
it protects, and correctness still comes from temp + rename, so a lock that silently
fails on an exotic filesystem costs duplicate work, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import PackageError, WeightstoreError
from .fsio import file_mode

PACKAGE_LOCK_TIMEOUT = 3600.0
LOCKS_DIR = "locks"


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


def target_lock(target: Path, store_root: Path, timeout: float = PACKAGE_LOCK_TIMEOUT):
    """The lock of one package folder, kept in the store, out of the output tree:
    ``<store>/locks/<blake3 of the folder's absolute path>.lock``.

    Builds of one folder through different stores are not serialized with each other;
    publishing stays atomic for them (temp folder + rename), so neither sees a torn folder.
    """
    from .hashing import digest_bytes

    folder = store_root / LOCKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    name = digest_bytes("blake3", os.fsencode(target.absolute()))
    return file_lock(folder / f"{name}.lock", timeout, PackageError, "package folder")
