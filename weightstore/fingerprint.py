"""Build fingerprints: a digest of everything that determines a package's bytes.

Covers the tool version, the package identity, the layout, the hash algorithm and the
content of every source file (models and their external data). Paths, the store and time
are deliberately left out: they never change what a package holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import __version__
from .hashing import digest_bytes, digest_file, make_key
from .recipe import Layout

FINGERPRINT_ALGO = "blake3"


def file_digest(path) -> str:
    return make_key(FINGERPRINT_ALGO, digest_file(FINGERPRINT_ALGO, path))


def layout_fingerprint(*, package: str, version: str, hash_algo: str, layout: Layout,
                       models: Sequence[Mapping[str, Any]]) -> str:
    """``models``: ``{"name", "source_digest", "external": {location: digest}}`` each."""
    doc = {
        "generator": __version__,
        "package": package,
        "version": version,
        "hash": hash_algo,
        "layout": layout.model_dump(mode="json"),
        "models": list(models),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return make_key(FINGERPRINT_ALGO, digest_bytes(FINGERPRINT_ALGO, text))
