"""``meta.json``: the store index in Ascend GE's shape.

Format 1 stores kept their whole index here (three parallel maps keyed by digest, replaced
whole on every write). Format 2 keeps the index in SQLite (:mod:`weightstore.store.index`)
and ``meta.json`` becomes a marker that older weightstore versions refuse ("written by a
newer weightstore"), so they never write into a store they cannot index. GE's form stays
available: :func:`export_meta` writes the three maps, streamed from the index in key order,
for GE or any tool that reads them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from ..errors import IntegrityError, StoreError
from ..io.digests import split_key
from ..io.files import atomic_write_bytes, atomic_writer, parse_json, read_regular
from .layout import FORMAT_VERSION, is_safe_component
from .objects import MAX_INT, StoredObject

LEGACY_VERSION = 1
MAPS = ("hash_to_weight_file", "hash_to_weight_offset", "hash_to_weight_size")


def read_legacy(path: Path) -> dict[str, StoredObject] | None:
    """The objects of a format 1 ``meta.json``; None when the file is absent or is a format
    2 marker; anything odd is a StoreError (never a traceback, whatever the bytes)."""
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read the store index: {exc.strerror}", path=str(path)) from exc
    try:
        doc = parse_json(raw)
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deep
        raise StoreError(f"store index is not valid JSON: {type(exc).__name__}",
                         path=str(path)) from exc
    if not isinstance(doc, dict):
        raise StoreError("store index must be a JSON object", path=str(path))
    version = doc.get("format_version")
    if type(version) is not int:
        raise StoreError("store index lacks an integer format_version", path=str(path))

    if version == FORMAT_VERSION:
        return None
    if version > FORMAT_VERSION:
        raise StoreError("store index was written by a newer weightstore; upgrade to read it",
                         path=str(path), format_version=version, supported=FORMAT_VERSION)
    if version != LEGACY_VERSION:
        raise StoreError("store index has an unknown format_version", path=str(path),
                         format_version=version, supported=FORMAT_VERSION)
    files, offsets, sizes = (_map(doc, name, path) for name in MAPS)
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
            raise StoreError("store index offset and size must be integers in [0, 2**63)",
                             path=str(path), key=key, offset=str(offset)[:40],
                             size=str(size)[:40])
        index[key] = StoredObject(key=key, file=file, offset=offset, size=size)
    return index


def encode_legacy(index: dict[str, StoredObject]) -> bytes:
    """Format 1 bytes (what stores written before the SQLite index hold); used by tests
    and tools that build such stores."""
    objs = sorted(index.values(), key=lambda o: o.key)
    doc = {
        "format_version": LEGACY_VERSION,
        "hash_to_weight_file": {o.key: o.file for o in objs},
        "hash_to_weight_offset": {o.key: o.offset for o in objs},
        "hash_to_weight_size": {o.key: o.size for o in objs},
    }
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


CURRENT_HEAD = b'{"format_version":2,'  # marker and export alike, whitespace aside


def _head(path: Path) -> bytes | None:
    """The first bytes of ``meta.json`` (b"" when there is none); None when it cannot be
    read: not damage, and never replaced."""
    try:
        with open(path, "rb") as f:
            return f.read(64)
    except FileNotFoundError:
        return b""
    except OSError:
        return None


def is_current(path: Path) -> bool | None:
    """Does ``meta.json`` start as this format's marker or export does (None: it cannot
    be read)? Judged on its first bytes only: an export of a large store is large, and
    this runs whenever the index is opened. Anything else (missing, empty, format 1,
    garbage, a document of another shape) an older weightstore could take for its own
    index."""
    head = _head(path)
    return None if head is None else b"".join(head.split()).startswith(CURRENT_HEAD)


def restore_marker(path: Path, index_name: str, *, keep: bool = True) -> bool:
    """Write the marker over a ``meta.json`` that is not current (:func:`is_current`); with
    ``keep``, a non-empty one is kept first as ``meta.json.broken`` (a hard link: no copy,
    and ``meta.json`` is never missing meanwhile; a migration, which has just imported the
    format 1 maps, keeps nothing). True when it was written."""
    if is_current(path) is not False:
        return False
    with contextlib.suppress(FileNotFoundError):
        if keep and path.stat().st_size:
            broken = path.with_name(path.name + ".broken")
            with contextlib.suppress(FileNotFoundError):
                broken.unlink()
            os.link(path, broken)
    write_marker(path, index_name)
    return True


def is_marker(path: Path) -> bool:
    """Is ``path`` exactly the marker :func:`write_marker` writes (nothing else in it: no
    maps, which ``export-meta`` would have added and a lost index may need)?"""
    try:
        doc = parse_json(read_regular(path))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and set(doc) == {"format_version", "index", "note"}


def write_marker(path: Path, index_name: str) -> None:
    """The ``meta.json`` of a format 2 store: no maps, so that nothing mistakes it for the
    index; ``export-meta`` replaces it with the maps on request."""

    doc = {"format_version": FORMAT_VERSION, "index": index_name,
           "note": "the index is in SQLite; run 'weightstore store export-meta' for "
                   "GE's hash_to_weight_* maps"}
    atomic_write_bytes(path, (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode())


def export_meta(path: Path, rows: Callable[[], Iterable[tuple[str, str, int, int]]],
                index_name: str) -> int:
    """Write GE's ``meta.json`` to ``path`` atomically; returns the number of objects.

    ``rows()`` yields every object's ``(key, file, offset, size)`` in key order and is
    called once per map, so memory stays flat however large the store is. The bytes are
    deterministic for a given content.
    """

    count = 0
    with atomic_writer(path, "w") as f:
        out: IO[str] = f  # type: ignore[assignment]
        out.write(f'{{\n "format_version": {FORMAT_VERSION},\n')
        for n, name in enumerate(MAPS):
            out.write(f' "{name}": {{')
            count = _write_map(out, rows(), n)
            out.write("\n }," if count else "},")
            out.write("\n")
        out.write(f' "index": {json.dumps(index_name)}\n}}\n')
    return count



def _write_map(out: IO[str], rows: Iterable[tuple[str, str, int, int]], field: int) -> int:
    """One map's entries, written a few thousand lines at a time."""
    quote = json.encoder.encode_basestring  # what json.dumps does to a str, in C
    count = 0
    lines: list[str] = []
    for row in rows:
        value = quote(row[1]) if field == 0 else str(row[field + 1])
        lines.append(f"  {quote(row[0])}: {value}")
        count += 1
        if len(lines) >= 4096:
            out.write(("\n" if count == len(lines) else ",\n") + ",\n".join(lines))
            lines = []
    if lines:
        out.write(("\n" if count == len(lines) else ",\n") + ",\n".join(lines))
    return count


def _map(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = doc.get(name)
    if not isinstance(value, dict):
        raise StoreError(f"store index field {name} must be a JSON object", path=str(path))
    return value


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_INT
