"""Build fingerprints: a digest of everything that determines a package's bytes.

Covers the tool version, the package identity, the layout, the hash algorithm and the
content of every source file (models and their external data, companion files). Paths, the
store and time are deliberately left out: they never change what a package holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import WeightstoreError
from ..io.digests import digest_bytes, digest_file, make_key
from ..io.files import atomic_write_bytes, parse_json, read_record_bytes
from ..io.identity import settled
from ..store.mac import entry_mac, verify_mac
from ..version import __version__

if TYPE_CHECKING:
    from ..recipe.schema import Layout

FINGERPRINT_ALGO = "blake3"
CACHE_NAME = "source-digests.json"
CACHE_FORMAT_VERSION = 2
CACHE_LIMIT = 10_000


class FileDigests:
    """Content digests of source files (and of package files, for up-to-date checks), each
    hashed at most once per build while unchanged.

    With a cache file, a digest is reused across builds while the file's size, inode,
    mtime and ctime are unchanged (ctime cannot be set back by users, so any rewrite is
    seen). As git does for its index, a file modified within the last
    :data:`RACY_SECONDS` is not cached: timestamps are too coarse to trust for it.

    The cache file sits in the store, which a group may share, and a digest cannot be
    checked without reading the whole file; so every entry carries a MAC under the user's
    own key (:mod:`weightstore.store.mac`) binding path, stamp and digest. An entry that
    fails it, however it was damaged, is hashed again.
    """

    def __init__(self, cache_file: Path | None = None) -> None:
        self._cache: dict[tuple[Path, str], dict[str, Any]] = {}
        self._file = cache_file
        self._saved: dict[str, dict[str, Any]] = _load_cache(cache_file)
        self._fresh: dict[str, dict[str, Any]] = {}
        self._prefetch: threading.Thread | None = None

    def prefetch(self, paths: Iterable[Path]) -> None:
        """Start taking the digests of ``paths`` on a background thread, so that they are
        ready by the time they are asked for: blake3 releases the GIL, so a cold build
        hashes its sources on the second CPU while it imports onnx and parses. Errors are
        left for :meth:`of` to raise. Any later call waits for it first."""
        todo = [Path(p) for p in paths]
        if self._prefetch is not None or not todo:
            return

        def run() -> None:
            for path in todo:
                with contextlib.suppress(OSError, ValueError, WeightstoreError):
                    self._of(path, FINGERPRINT_ALGO)

        self._prefetch = threading.Thread(target=run, name="weightstore-digests", daemon=True)
        self._prefetch.start()

    def _settle(self) -> None:
        if self._prefetch is not None:
            self._prefetch.join()
            self._prefetch = None

    @property
    def cache_file(self) -> Path | None:
        return self._file

    def of(self, path: Path, algo: str = FINGERPRINT_ALGO) -> str:
        """``"<algo>:<hex>"`` of the file's content; a file changed since it was last
        hashed (size, inode, mtime or ctime differ) is hashed again."""
        self._settle()
        return self._of(path, algo)

    def _of(self, path: Path, algo: str) -> str:
        path = Path(path).resolve()
        st = os.stat(path)
        stamp = {"size": st.st_size, "ino": st.st_ino, "dev": st.st_dev,
                 "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
        known = self._cache.get((path, algo))
        if known is not None and all(known.get(k) == v for k, v in stamp.items()):
            return known["digest"]
        entry = self._saved.get(str(path))
        if _trusted(str(path), entry, stamp) and entry["digest"].startswith(f"{algo}:"):
            digest = entry["digest"]
        else:
            digest = make_key(algo, digest_file(algo, path))
            if settled(st):
                self._fresh[str(path)] = {**stamp, "digest": digest}  # signed when saved
        self._cache[(path, algo)] = {**stamp, "digest": digest}
        return digest

    def save(self) -> None:
        """Write new entries to the cache file (last writer wins: it is only a cache)."""
        self._settle()
        if self._file is None or not self._fresh or not self._file.parent.is_dir():
            return
        fresh = {}
        for path, entry in self._fresh.items():
            stamp = {k: v for k, v in entry.items() if k != "digest"}
            mac = entry_mac(_signed(path, stamp, entry["digest"]))
            if mac is None:
                return  # no private key: nothing is trusted, so nothing is written
            fresh[path] = {**entry, "mac": mac}
        entries = {**_load_cache(self._file), **fresh}
        if len(entries) > CACHE_LIMIT:
            entries = {k: v for k, v in entries.items() if os.path.exists(k)}
        doc = {"format_version": CACHE_FORMAT_VERSION, "entries": entries}
        with contextlib.suppress(OSError):
            atomic_write_bytes(self._file, json.dumps(doc, sort_keys=True).encode())


def _signed(path: str, stamp: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """What an entry's MAC covers: moving, swapping or editing any part breaks it."""
    return {"path": path, "stamp": dict(stamp), "digest": digest}


def _trusted(path: str, entry: object, stamp: Mapping[str, Any]) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
        return False
    if any(entry.get(k) != v for k, v in stamp.items()):
        return False
    return verify_mac(_signed(path, stamp, entry["digest"]), entry.get("mac"))


def _load_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    try:
        doc = parse_json(read_record_bytes(path))
        if doc.get("format_version") == CACHE_FORMAT_VERSION and isinstance(
                doc.get("entries"), dict):
            return doc["entries"]
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def layout_fingerprint(*, package: str, version: str, hash_algo: str, layout: Layout,
                       models: Sequence[Mapping[str, Any]],
                       devices: Sequence[Mapping[str, Any]] = (),
                       companions: Sequence[Mapping[str, Any]] = ()) -> str:
    """``models``: ``{"name", "source_digest", "external": {location: digest}}`` each;
    ``companions``: ``{"path", "kind", "digest"}`` each, a key of the digest only when
    there are some (a package without keeps its fingerprint)."""
    doc = {
        "generator": __version__,
        "package": package,
        "version": version,
        "hash": hash_algo,
        "layout": layout.record(),
        "models": list(models),
        "devices": list(devices),
    }
    if companions:
        doc["companions"] = list(companions)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return make_key(FINGERPRINT_ALGO, digest_bytes(FINGERPRINT_ALGO, text))
