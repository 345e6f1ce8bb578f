"""Digest keys of the weights scenarios derive, remembered per source model.

A derived weight (an fp16 copy, a fused Q/K/V matrix) is computed from the source model's
payloads by its scenario's records, so the source's content and the records determine its
bytes; a rebuild whose source and scenarios did not change need not compute it again.
Nothing cheaper than that computation could check a remembered key, so an entry carries a
MAC under the user's own secret (:mod:`weightstore.store.mac`) binding the source's
identity, the algorithm and the keys: an entry another user wrote, or one edited,
swapped or truncated, is ignored and the weights are computed. The cache lives in the
store::

    <store root>/derived-keys/<blake3 of the source identity>.<algo>.json
        {"format_version": 1, "keys": {"<weight id>": "<algo>:<hex>"}, "mac": "<hex>"}

Weight ids come from :func:`weightstore.scenarios.package.added_weight_ids`. A key is used
only when the store holds an object of it with the weight's exact size; the package
writer re-hashes every byte it copies from the store, as for every payload.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..io.digests import digest_bytes, split_key
from ..io.files import atomic_write_bytes, parse_json, read_record_bytes
from ..store.mac import entry_mac, verify_mac

FOLDER = "derived-keys"
FORMAT_VERSION = 1


class DerivedKeyCache:
    def __init__(self, store_root: Path) -> None:
        self.folder = Path(store_root) / FOLDER

    def load(self, identity: Mapping[str, Any], algo: str) -> dict[str, str]:
        """``weight id -> key`` for this source, empty unless the entry is authentic."""
        try:
            doc = parse_json(read_record_bytes(self._path(identity, algo)))
            keys = doc["keys"]
            if (doc.get("format_version") != FORMAT_VERSION or not isinstance(keys, dict)
                    or not verify_mac(_signed(identity, algo, keys), doc.get("mac"))):
                return {}
            return {i: k for i, k in keys.items() if split_key(k)[0] == algo}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
            return {}

    def save(self, identity: Mapping[str, Any], algo: str, keys: Mapping[str, str]) -> None:
        """Merge ``keys`` into the entry; nothing is written without the user's secret (a
        cache: failures to write are ignored)."""
        known = self.load(identity, algo)
        merged = dict(sorted({**known, **keys}.items()))
        if merged == known:
            return  # a rebuild of unchanged sources writes nothing
        mac = entry_mac(_signed(identity, algo, merged))
        if mac is None:
            return
        doc = {"format_version": FORMAT_VERSION, "keys": merged, "mac": mac}
        with contextlib.suppress(OSError):
            self.folder.mkdir(exist_ok=True)
            atomic_write_bytes(self._path(identity, algo),
                               json.dumps(doc, indent=0, sort_keys=True).encode())

    def _path(self, identity: Mapping[str, Any], algo: str) -> Path:
        text = json.dumps(_content(identity), sort_keys=True).encode()
        return self.folder / f"{digest_bytes('blake3', text)}.{algo}.json"


def _content(identity: Mapping[str, Any]) -> dict[str, Any]:
    """What names the source's bytes: its content digest and its external files'."""
    return {k: identity[k] for k in ("source_digest", "external") if k in identity}


def _signed(identity: Mapping[str, Any], algo: str, keys: Mapping[str, str]) -> dict:
    return {"source": _content(identity), "algo": algo, "keys": dict(keys)}
