"""Temp files in a store, and the one rule that sweeps the ones left by killed writers.

Every temp file weightstore writes in a store (``.<final name>.<random>.tmp``: a staged
per-weight object, a compaction's copy, ``meta.json``, a cache entry, a lock's holder
note, a pinned source being fetched; ``.pull-<sha256>.tmp``: a blob being pulled) is held
by its writer: an exclusive ``flock`` on the file itself, from its creation until it is
renamed into place or removed (:func:`weightstore.io.files.locked_temp`, a pull's
:func:`weightstore.io.locks.partial_file_lock`). The kernel drops the locks of a process
that dies, even by ``kill -9``, so **a temp file that no process holds is a leftover**,
whatever its age, and one that is held is never touched, whoever holds it.

:func:`sweep` removes the leftovers (each locked first and removed while locked), in the
store root, its cache folders (:data:`TEMP_FOLDERS`) and each pinned source's folder
(:data:`NESTED_TEMP_FOLDERS`), never through a symbolic link; and the staging folders of
pinned sources' pulls (``sources/.source.<random>.tmp/``, held by their run the same way:
:func:`weightstore.io.files.make_temp_dir`), whole. It runs at the first write through
each store object (:meth:`.index.Index.writing`: every build, put, pull, prepare and gc),
and in ``store verify --repair``; :func:`leftovers` lists them for ``store verify`` and
``gc --dry-run``. A pull's partial file kept for a later pull to resume is removed by gc
and repair only (``resumable=True``): the next build leaves it to the next pull.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..io.files import is_temp_dir_name, unheld_temp_dir, unlink_unheld
from .layout import CACHE_FOLDERS, is_temp_name

# folders beside the objects where weightstore writes temp files (holder notes in locks/)
TEMP_FOLDERS = (*CACHE_FOLDERS, "locks")
NESTED_TEMP_FOLDERS = ("sources",)  # and one folder in it per pinned source: sources/<id>/
RESUMABLE_PREFIX = ".pull-"  # a blob's download, kept for a later pull to resume
SOURCE_STAGE_PREFIX = ".source."  # sources/.source.<random>.tmp/: a pinned source's pull
STAGING_PARENTS = tuple(f"{folder}/" for folder in NESTED_TEMP_FOLDERS)


def is_resumable(name: str) -> bool:
    return name.startswith(RESUMABLE_PREFIX)


def leftovers(root: Path, *, resumable: bool = True) -> list[str]:
    """The temp files of the store no process holds, as paths relative to ``root``
    (``payload-keys/.<name>.<random>.tmp``); ``resumable``: pulls' partial files too."""
    return _walk(root, resumable, remove=False)


def sweep(root: Path, *, resumable: bool = True,
          names: Iterable[str] | None = None) -> list[str]:
    """Remove the leftovers (or, given ``names``, those of them that are still
    leftovers); returns what was removed."""
    wanted = None if names is None else set(names)
    return _walk(root, resumable, remove=True, wanted=wanted)


def sweep_quietly(root: Path) -> list[str]:
    """:func:`sweep` for a writer: pulls' partial files are left to resume, and a folder
    that cannot be listed or written is left alone (the write goes on)."""
    try:
        return sweep(root, resumable=False)
    except OSError:
        return []


def _walk(root: Path, resumable: bool, *, remove: bool,
          wanted: set[str] | None = None) -> list[str]:
    found: list[str] = []
    for prefix, fd in _folders(root):
        with os.scandir(fd) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it
                             if is_temp_name(e.name))
        for name, folder in entries:
            path = prefix + name + ("/" if folder else "")
            if (not resumable and is_resumable(name)) or (wanted is not None
                                                          and path not in wanted):
                continue
            if folder:  # a pinned source's staging folder (its run holds the folder)
                if prefix in STAGING_PARENTS and is_temp_dir_name(name, SOURCE_STAGE_PREFIX) \
                        and unheld_temp_dir(root / prefix / name, remove=remove):
                    found.append(path)
            elif unlink_unheld(fd, name, remove=remove):
                found.append(path)
    return found


def _folders(root: Path) -> Iterator[tuple[str, int]]:
    """``(prefix of the names in it, open descriptor)`` of every folder temp files are
    looked for in; a folder that is missing, not a folder, or a symbolic link is skipped
    (never followed: a link planted in a shared store leads no cleanup outside it)."""
    with _opened(None, str(root)) as top:
        if top is None:
            return
        yield "", top
        for folder in TEMP_FOLDERS:
            with _opened(top, folder) as fd:
                if fd is not None:
                    yield f"{folder}/", fd
        for folder in NESTED_TEMP_FOLDERS:
            with _opened(top, folder) as outer:
                if outer is None:
                    continue
                yield f"{folder}/", outer  # its listings, its staging folders
                with os.scandir(outer) as it:  # a staging folder is swept whole
                    inner = sorted(e.name for e in it if e.is_dir(follow_symlinks=False)
                                   and not is_temp_name(e.name))
                for name in inner:
                    with _opened(outer, name) as fd:
                        if fd is not None:
                            yield f"{folder}/{name}/", fd


@contextlib.contextmanager
def _opened(parent: int | None, name: str) -> Iterator[int | None]:
    """A descriptor of the folder ``name`` (of the folder open as ``parent``: never
    through a symbolic link), or None."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = (os.open(name, flags) if parent is None
              else os.open(name, flags | getattr(os, "O_NOFOLLOW", 0), dir_fd=parent))
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)
