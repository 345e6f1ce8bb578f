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
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..io.files import fsync_dir
from .index import batched, marks
from .layout import (
    CACHE_FOLDERS,
    cache_temps,
    is_safe_component,
    is_temp_name,
    kind_of,
    open_cache_folder,
    scan,
)
from .writer import clear_folder_object

if TYPE_CHECKING:
    from .core import Store

STALE_TEMP_SECONDS = 15 * 60
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


def stale_temps(store: Store, oldest_writer: float | None) -> list[str]:
    """Temp files no live writer can still be writing: untouched for
    :data:`STALE_TEMP_SECONDS` and older than the oldest live lease; in the store root and
    in the cache folders builds write to (named ``<folder>/<name>``)."""
    cutoff = time.time() - STALE_TEMP_SECONDS
    if oldest_writer is not None:
        cutoff = min(cutoff, oldest_writer)
    stale = []
    for name in [*scan(store.root).temps, *cache_temps(store.root)]:
        try:
            with _folder_of(store.root, name) as (fd, base):
                if os.stat(base, dir_fd=fd, follow_symlinks=False).st_mtime < cutoff:
                    stale.append(name)
        except OSError:
            continue
    return stale


def remove_temps(store: Store, names: Iterable[str]) -> list[str]:
    removed = []
    for name in names:
        folder, _, base = name.rpartition("/")
        if not is_temp_name(base) or (folder and folder not in CACHE_FOLDERS):
            continue  # only what stale_temps lists: never anything else a caller names
        with contextlib.suppress(OSError), _folder_of(store.root, name) as (fd, base):
            os.unlink(base, dir_fd=fd)
            removed.append(name)
    return removed


@contextlib.contextmanager
def _folder_of(root: Path, name: str) -> Iterator[tuple[int, str]]:
    """``(descriptor of its folder, base name)`` for ``name`` (a root file, or ``<cache
    folder>/<file>``), the folder opened without following a symbolic link: a link planted
    in place of a cache folder never leads a cleanup outside the store."""
    folder, _, base = name.rpartition("/")
    fd = open_cache_folder(root, folder) if folder else os.open(
        root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        yield fd, base
    finally:
        os.close(fd)


def oldest_live_lease(store: Store) -> float | None:
    """Creation time of the oldest live lease (None when no build runs)."""
    from .leases import live_leases

    if not store.index.exists():
        return None
    with store.index.reading() as conn:
        live, _ = live_leases(conn)
        if not live:
            return None
        return conn.execute(f"SELECT min(created) FROM leases WHERE id IN ({marks(live)})",
                            live).fetchone()[0]
