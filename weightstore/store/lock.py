"""The store's single writer lock.

Every reader of ``meta.json`` that is about to decide something (which keys are missing,
which objects to check) holds this lock first; otherwise two builds could both see a key as
missing and write it twice, or verify could judge a half-published append.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import StoreError
from ..fsio import file_mode
from .layout import LOCK_NAME


@contextlib.contextmanager
def store_lock(root: Path, timeout: float) -> Iterator[Path]:
    """Hold ``<root>/meta.json.lock`` exclusively (negative timeout: wait forever).

    The lock file gets the mode of any other store file (0666 less the umask), so every
    user who may write a shared store can also lock it.
    """
    from filelock import FileLock, Timeout  # imported on first use: it costs ~35 ms

    path = root / LOCK_NAME
    lock = FileLock(path, timeout=timeout, mode=file_mode())
    try:
        lock.acquire()
    except Timeout as exc:
        raise StoreError("timed out waiting for the store lock; another build is writing",
                         lock=str(path), timeout=timeout) from exc
    except OSError as exc:
        raise StoreError(f"cannot open the store lock: {exc.strerror}", lock=str(path)) from exc
    try:
        yield path
    finally:
        lock.release()
