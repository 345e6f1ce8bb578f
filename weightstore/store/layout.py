"""Names of the files inside a store root, and what each name means.

The on-disk tree is described in :mod:`weightstore.store.writer`. Names alone tell an object
file from a temp file or an orphan, so :mod:`verify` and :mod:`stats` can classify a folder
listing without opening anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..io.digests import split_key

INDEX_NAME = "index.sqlite"  # the index (weightstore.store.index)
FORMAT_VERSION = 2  # the store's format: the index, and meta.json as its marker
META_NAME = "meta.json"
LOCK_NAME = "meta.json.lock"
# the folders where builds keep their caches (written by temp + rename, like the objects)
CACHE_FOLDERS = ("payload-keys", "derived-keys", "build-actions")
SEPARATE_PREFIX = "weight_"
COMBINED_SUFFIX = "_weight_combined"

Kind = Literal["separate", "combined"]


def is_store(root: Path) -> bool:
    """Is ``root`` a weightstore store: its index or its ``meta.json`` is there?"""
    return (root / INDEX_NAME).is_file() or (root / META_NAME).is_file()

_COMBINED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_UNSAFE_CHARS = frozenset("/\\\0:")


def separate_file_name(key: str) -> str:
    """``weight_<hex>``: the name is the digest, so it can be checked against the key."""
    return SEPARATE_PREFIX + split_key(key)[1]


def combined_file_name(name: str) -> str:
    """``<name>_weight_combined`` after checking ``name`` cannot leave the store root."""
    if not isinstance(name, str) or not _COMBINED_NAME.fullmatch(name):
        raise ValueError(f"combined_name must be a plain file name of letters, digits, '.', "
                         f"'_' or '-' not starting with '.' (got {name!r})")
    return name + COMBINED_SUFFIX


def kind_of(file: str) -> Kind:
    """Combined files are recognised by suffix; everything else holds one payload."""
    return "combined" if file.endswith(COMBINED_SUFFIX) else "separate"


def is_safe_component(name: str) -> bool:
    """True for a single relative path component (keeps the store relocatable and closed)."""
    return (0 < len(name) <= 255 and name not in (".", "..")
            and not any(c in _UNSAFE_CHARS for c in name))


def is_temp_name(name: str) -> bool:
    """Temp files (``.<final>.<random>.tmp``, ``.pull-<sha256>.tmp``): see :mod:`.temps`."""
    return name.startswith(".") and name.endswith(".tmp")


def is_object_name(name: str) -> bool:
    return not name.startswith(".") and (name.startswith(SEPARATE_PREFIX)
                                         or name.endswith(COMBINED_SUFFIX))


@dataclass(frozen=True)
class Listing:
    """Regular files found in a store root, split by role; sizes in bytes."""

    objects: dict[str, int]


def scan(root: Path) -> Listing:
    objects: dict[str, int] = {}
    with os.scandir(root) as it:
        for entry in it:
            if not entry.is_file(follow_symlinks=False):
                continue
            if is_object_name(entry.name):
                try:
                    objects[entry.name] = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # removed since it was listed (gc, a writer's empty sibling)
    return Listing(objects=dict(sorted(objects.items())))
