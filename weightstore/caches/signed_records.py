"""Records one user's processes keep for later ones, each signed with that user's key.

A later process trusts what such a record says without redoing the work (a resolution,
the verification of a package's files) only because the user's own key
(:mod:`weightstore.store.mac`) signed it. Records sit in the user's cache folder, one
file each, under a folder per kind::

    <user cache folder>/<kind>/<key>

Each file is one line of JSON (``format_version``, ``kind``, ``key``, the body's
``length`` and blake3 ``digest``, and the ``mac`` over all of them) followed by the body.
A record that fails any check (another user's, edited, truncated, swapped for another
key's) is ignored as absent; so is everything when the key cannot be had. Writes are
atomic (temp file and rename) and never fail their caller: a record is only a cache.
Each kind keeps at most ``limit`` records, the least recently written dropped first. A
file larger than :data:`~weightstore.io.files.RECORD_LIMIT` is a miss before any byte of it
is read; so is anything but a regular file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import blake3

from ..io.files import atomic_writer, parse_json, read_record_bytes
from ..store.location import user_cache_dir
from ..store.mac import entry_mac, verify_mac

FORMAT_VERSION = 1
LIMIT = 256
HEADER_LIMIT = 4096  # bytes: a header line longer than this is no record of ours
_KEY = re.compile(r"[0-9a-f]{64}")


class SignedRecords:
    """The records of one ``kind`` (a folder name), keyed by 64 hex digits."""

    def __init__(self, kind: str, *, limit: int = LIMIT) -> None:
        self.kind = kind
        self.limit = limit

    @property
    def folder(self) -> Path:
        return user_cache_dir() / self.kind

    def _signed(self, key: str, length: int, digest: str) -> dict[str, object]:
        return {"format_version": FORMAT_VERSION, "kind": self.kind, "key": key,
                "length": length, "digest": digest}

    def get(self, key: str) -> bytes | None:
        """The body recorded under ``key``, or None (absent, or failing any check)."""
        if not _KEY.fullmatch(key):
            return None
        try:
            header, _, body = read_record_bytes(self.folder / key).partition(b"\n")
            doc = parse_json(header) if len(header) < HEADER_LIMIT else None
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("length") != len(body):
            return None
        signed = self._signed(key, len(body), blake3.blake3(body).hexdigest())
        if any(doc.get(k) != v for k, v in signed.items()):
            return None
        return body if verify_mac(signed, doc.get("mac")) else None

    def put(self, key: str, body: bytes) -> bool:
        """Record ``body`` under ``key``; False when it could not be (no key, no room)."""
        if not _KEY.fullmatch(key):
            return False
        signed = self._signed(key, len(body), blake3.blake3(body).hexdigest())
        mac = entry_mac(signed)
        if mac is None:
            return False
        header = json.dumps({**signed, "mac": mac}, sort_keys=True).encode() + b"\n"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_writer(self.folder / key, durable=False) as f:
                f.write(header)
                f.write(body)
        except OSError:
            return False
        self._prune()
        return True

    def drop(self, key: str) -> None:
        if _KEY.fullmatch(key):
            with contextlib.suppress(OSError):
                os.unlink(self.folder / key)

    def _prune(self) -> None:
        """Keep the newest ``limit`` records."""
        with contextlib.suppress(OSError):
            entries = [e for e in os.scandir(self.folder) if _KEY.fullmatch(e.name)]
            if len(entries) <= self.limit:
                return
            entries.sort(key=lambda e: e.stat().st_mtime_ns)
            for e in entries[:len(entries) - self.limit]:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
