"""Payload digest keys remembered per source model, so unchanged models are not re-hashed.

A source model is identified by the content digests of its file and of its external data
files (see :mod:`weightstore.package.fingerprint`); the digest keys of its payloads are a pure
function of that content. The cache lives in the store, beside ``meta.json``::

    <store root>/payload-keys/<blake3 of the identity>.<algo>.json
        {"format_version": 1, "keys": {"<tensor path>": "<algo>:<hex>", ...}}

The file sits in a store a group may share, so nothing in it is believed unchecked. A
cached key is used only when the store holds an object of the payload's exact size under
it whose sampled bytes (:func:`sample_ranges`) equal the source's at the same place: one
page per tensor, against a full read for hashing (payloads held in typed fields are
decoded for it, as the package writer decodes them anyway). One
mismatch drops the whole entry and the source is hashed again. That check is cheap, not
complete, so the package writer copies every payload whose key came from here out of the
source itself (not the store) and re-hashes what it wrote, as it re-hashes every copy:
each cached key is proven against the source's bytes at no extra read. Tensors sharing a
cached key are hashed (only duplicates cost a read). A key that fails there raises
:class:`StaleKeyError`; the build drops the entry and starts over with every key hashed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..io.digests import digest_bytes, split_key
from ..io.files import atomic_write_bytes, open_regular, parse_json, read_record_bytes

FOLDER = "payload-keys"
FORMAT_VERSION = 1
SAMPLE = 4096  # bytes per sampled page


class StaleKeyError(IntegrityError):
    """A cached payload key does not match the source bytes it was cached for."""


class PayloadKeyCache:
    def __init__(self, store_root: Path) -> None:
        self.folder = Path(store_root) / FOLDER

    def _path(self, identity: Mapping[str, Any], algo: str) -> Path:
        content = {k: identity[k] for k in ("source_digest", "external") if k in identity}
        text = json.dumps(content, sort_keys=True).encode()
        return self.folder / f"{digest_bytes('blake3', text)}.{algo}.json"

    def load(self, identity: Mapping[str, Any], algo: str) -> dict[str, str]:
        """``tensor path -> key`` for this source, empty when unknown or unreadable."""
        try:
            doc = parse_json(read_record_bytes(self._path(identity, algo)))
            keys = doc["keys"] if doc.get("format_version") == FORMAT_VERSION else {}
            return {p: k for p, k in keys.items() if split_key(k)[0] == algo}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
            return {}

    def drop(self, identity: Mapping[str, Any], algo: str) -> None:
        """Forget a source's entry (it proved wrong)."""
        with contextlib.suppress(OSError):
            self._path(identity, algo).unlink()

    def save(self, identity: Mapping[str, Any], algo: str, keys: Mapping[str, str]) -> None:
        """Merge ``keys`` into the entry (a cache: failures to write are ignored)."""
        merged = {**self.load(identity, algo), **keys}
        doc = {"format_version": FORMAT_VERSION, "keys": dict(sorted(merged.items()))}
        with contextlib.suppress(OSError):
            self.folder.mkdir(exist_ok=True)
            atomic_write_bytes(self._path(identity, algo),
                               json.dumps(doc, indent=0, sort_keys=True).encode())


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of what is compared before a cached key is believed: the
    payload's middle page (one read a side per tensor; the whole payload when smaller)."""
    if size <= SAMPLE:
        return [(0, size)]
    return [((size - SAMPLE) // 2, SAMPLE)]


class RangeReader:
    """Positional reads of byte ranges, one open descriptor per file."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read(self, path: str | os.PathLike[str], offset: int, length: int, *,
             follow: bool = True) -> bytes:
        """``follow=False``: a store object, refused unless a regular file (never a
        symbolic link, and never a FIFO, whose open would wait for a writer)."""
        name = os.fspath(path)
        fd = self._fds.get(name)
        if fd is None:
            if follow:
                fd = os.open(name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            else:
                fd = open_regular(name, nofollow=True)
            self._fds[name] = fd
        return os.pread(fd, length, offset)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def samples_agree(files: RangeReader, source: tuple[str, int] | bytes,
                  stored: tuple[str, int], size: int) -> bool:
    """Do ``size`` bytes at ``source`` (``(path, offset)``, or the payload itself) and at
    ``stored`` (a store object) hold the same bytes at every sampled page? Unreadable, or
    a store object reached through a symbolic link, counts as no."""
    b, b_off = stored
    try:
        for off, n in sample_ranges(size):
            if isinstance(source, bytes):
                mine = source[off:off + n]
            else:
                mine = files.read(source[0], source[1] + off, n)
            if mine != files.read(b, b_off + off, n, follow=False):
                return False
        return True
    except OSError:
        return False
