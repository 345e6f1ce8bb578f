"""The store's single writer lock.

Every reader of ``meta.json`` that is about to decide something (which keys are missing,
which objects to check) holds this lock first; otherwise two builds could both see a key as
missing and write it twice, or verify could judge a half-published append.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import StoreError
from ..io.locks import file_lock
from .layout import LOCK_NAME


def store_lock(root: Path, timeout: float):
    """Hold ``<root>/meta.json.lock`` exclusively (negative timeout: wait forever)."""
    return file_lock(root / LOCK_NAME, timeout, StoreError, "store")
