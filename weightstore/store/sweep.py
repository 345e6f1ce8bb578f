"""Removing store files that no row refers to, without racing the writers.

A per-weight object gets its final name in the same transaction that records its row
(:meth:`Store.put`), so deleting its file inside a write transaction, after checking
that no row refers to it, can never remove bytes that a committed row needs. Deletions go
in batches, so that each transaction stays short. Combined files are deleted under their
own file lock as well, since appends create them before their rows exist.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..io.files import fsync_dir
from .index import batched, marks
from .layout import is_safe_component, kind_of
from .writer import clear_folder_object

if TYPE_CHECKING:
    from .core import Store

SWEEP_BATCH = 500


def unlink_unreferenced(store: Store, files: Iterable[str]) -> list[str]:
    """Delete each of ``files`` that no row refers to; returns the names deleted."""
    deleted: list[str] = []
    names = [f for f in dict.fromkeys(files) if is_safe_component(f)]
    for chunk in batched(names, SWEEP_BATCH):
        combined = [f for f in chunk if kind_of(f) == "combined"]
        with contextlib.ExitStack() as stack:
            for name in combined:
                stack.enter_context(store.file_lock(name))
            with store.index.writing() as conn:
                used = {row[0] for row in conn.execute(
                    f"SELECT DISTINCT file FROM objects WHERE file IN ({marks(chunk)})", chunk)}
                for name in chunk:
                    if name in used:
                        continue
                    try:
                        if not clear_folder_object(store.root / name):
                            os.unlink(store.root / name)
                    except (OSError, StoreError):
                        continue  # gone already, a folder with content, or for later
                    deleted.append(name)
    if deleted:
        fsync_dir(store.root)
    return deleted


def remove_stale_locks(store: Store) -> list[str]:
    """Remove the lock files of combined files that no longer exist (left by a
    weightstore that kept them, or by a kill between a file's removal and its lock
    file's); returns their names. Each is taken without waiting and removed while held
    (:meth:`Store.file_lock` removes the lock file of an absent combined file on
    release, and every taker checks it locked the file at the path); one another process
    holds or waits for is left for the next sweep. Other locks (gc's, package folders',
    a pull's) are never touched."""
    from ..io.locks import LOCKS_DIR

    folder = store.root / LOCKS_DIR
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in names:
        file = name.removesuffix(".lock")
        if (file == name or not is_safe_component(file) or kind_of(file) != "combined"
                or os.path.lexists(store.root / file)):
            continue
        try:
            with store.file_lock(file, timeout=0):
                pass
        except StoreError:
            continue  # held: its holder removes it, or the next sweep does
        if not os.path.lexists(folder / name):
            removed.append(name)
    return removed
