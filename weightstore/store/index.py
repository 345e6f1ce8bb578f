"""``meta.json``: the map from digest key to the byte range that holds the payload.

The format mirrors the external weight directory of Ascend GE (three parallel maps keyed by
digest) with an explicit ``format_version`` so that a newer layout is refused instead of
misread. File names are relative to the store root, which keeps the store relocatable.
The file is only ever replaced whole (temp + fsync + rename), so lock-free readers see
either the old index or the new one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, StoreError
from ..fsio import atomic_write_bytes
from ..hashing import split_key
from .layout import Kind, is_safe_component, kind_of

FORMAT_VERSION = 1
_MAPS = ("hash_to_weight_file", "hash_to_weight_offset", "hash_to_weight_size")


@dataclass(frozen=True)
class StoredObject:
    """Where the bytes of one payload live: ``size`` bytes of ``file`` at ``offset``."""

    key: str
    file: str
    offset: int
    size: int

    @property
    def kind(self) -> Kind:
        return kind_of(self.file)

    @property
    def end(self) -> int:
        return self.offset + self.size


def read_index(path: Path) -> dict[str, StoredObject]:
    """Parse ``meta.json``; a missing file is an empty store, anything odd is a StoreError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreError(f"cannot read the store index: {exc.strerror}", path=str(path)) from exc
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"store index is not valid JSON: {exc}", path=str(path)) from exc
    if not isinstance(doc, dict):
        raise StoreError("store index must be a JSON object", path=str(path))
    version = doc.get("format_version")
    if type(version) is not int:
        raise StoreError("store index lacks an integer format_version", path=str(path))
    if version > FORMAT_VERSION:
        raise StoreError("store index was written by a newer weightstore; upgrade to read it",
                         path=str(path), format_version=version, supported=FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise StoreError("store index has an unknown format_version", path=str(path),
                         format_version=version, supported=FORMAT_VERSION)
    files, offsets, sizes = (_map(doc, name, path) for name in _MAPS)
    if not files.keys() == offsets.keys() == sizes.keys():
        raise StoreError("store index maps do not list the same keys", path=str(path))
    index: dict[str, StoredObject] = {}
    for key, file in files.items():
        try:
            split_key(key)
        except IntegrityError as exc:
            raise StoreError("store index holds a malformed digest key", path=str(path),
                             key=key) from exc
        offset, size = offsets[key], sizes[key]
        if not isinstance(file, str) or not is_safe_component(file):
            raise StoreError("store index names a file outside the store root",
                             path=str(path), key=key, file=file)
        if not _is_count(offset) or not _is_count(size):
            raise StoreError("store index offset and size must be non-negative integers",
                             path=str(path), key=key, offset=offset, size=size)
        index[key] = StoredObject(key=key, file=file, offset=offset, size=size)
    return index


def write_index(path: Path, index: dict[str, StoredObject]) -> None:
    """Replace ``meta.json`` atomically with deterministic bytes (sorted keys)."""
    atomic_write_bytes(path, encode_index(index))


def encode_index(index: dict[str, StoredObject]) -> bytes:
    objs = sorted(index.values(), key=lambda o: o.key)
    doc = {
        "format_version": FORMAT_VERSION,
        "hash_to_weight_file": {o.key: o.file for o in objs},
        "hash_to_weight_offset": {o.key: o.offset for o in objs},
        "hash_to_weight_size": {o.key: o.size for o in objs},
    }
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def _map(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = doc.get(name)
    if not isinstance(value, dict):
        raise StoreError(f"store index field {name} must be a JSON object", path=str(path))
    return value


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0
