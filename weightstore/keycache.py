"""Payload digest keys remembered per source model, so unchanged models are not re-hashed.

A source model is identified by the content digests of its file and of its external data
files (see :mod:`weightstore.fingerprint`); the digest keys of its payloads are a pure
function of that content. The cache lives in the store, beside ``meta.json``::

    <store root>/payload-keys/<blake3 of the identity>.<algo>.json
        {"format_version": 1, "keys": {"<tensor path>": "<algo>:<hex>", ...}}

A cached key is used only when the store holds an object of the payload's exact size under
it; the package writer then re-hashes every byte it copies, so a stale entry cannot
publish a wrong payload of another size or corrupt bytes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import IntegrityError
from .fsio import atomic_write_bytes
from .hashing import digest_bytes, split_key

FOLDER = "payload-keys"
FORMAT_VERSION = 1


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
            doc = json.loads(self._path(identity, algo).read_text())
            keys = doc["keys"] if doc.get("format_version") == FORMAT_VERSION else {}
            return {p: k for p, k in keys.items() if split_key(k)[0] == algo}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
            return {}

    def save(self, identity: Mapping[str, Any], algo: str, keys: Mapping[str, str]) -> None:
        """Merge ``keys`` into the entry (a cache: failures to write are ignored)."""
        merged = {**self.load(identity, algo), **keys}
        doc = {"format_version": FORMAT_VERSION, "keys": dict(sorted(merged.items()))}
        with contextlib.suppress(OSError):
            self.folder.mkdir(exist_ok=True)
            atomic_write_bytes(self._path(identity, algo),
                               json.dumps(doc, indent=0, sort_keys=True).encode())
