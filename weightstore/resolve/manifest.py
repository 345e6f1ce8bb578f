"""The RequiredPayloadManifest: exactly the payloads a resolved model needs, and why.

Entries identify bytes without reading them: the file (a location relative to the model's
folder, or the model file itself for inline payloads), offset, length, encoding, checksum
and, when the package summary records it, the store key of the same bytes. Active entries
are read by the loader; dormant ones are fallbacks, read only when the active entry they
stand behind fails its checksum. A weight dead after transformation is in neither set.

Tied and duplicate weights whose bytes are the same range of the same file share one
entry (one read); each entry lists every value it supplies and every reason it is live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ACTIVE = "active"
DORMANT = "dormant"
STORE_ONLY = ("prepared", "runtime")  # origins whose bytes live in the weight store only


@dataclass(frozen=True)
class PayloadSource:
    """Where the bytes of one entry are: a file range, and optionally a store key."""

    file: str  # location relative to the model's folder ("" for the model file itself, or
    #            for a store-only object such as a packed payload: see store_key)
    offset: int
    length: int
    encoding: str = "raw"  # "raw", or the typed field (float_data, ...) of an inline payload
    checksum: str | None = None  # "algo:hex" of the little-endian bytes, when known
    store_key: str | None = None  # the same bytes in the weight store, when known
    spans: tuple[tuple[int, int], ...] = ()  # typed encodings: field spans in the file

    @property
    def range_key(self) -> tuple[str, int, int, str]:
        where = self.file if self.file or not self.store_key else f"store:{self.store_key}"
        return where, self.offset, self.length, self.encoding


@dataclass(frozen=True)
class ManifestEntry:
    """One payload: its source, the values it supplies, and why it is needed."""

    id: str
    status: str  # ACTIVE | DORMANT
    origin: str  # "portable" | "derived-source" | "prepared" (packed) | "runtime" (made by
    #              the runtime in a prepared companion)
    source: PayloadSource
    values: tuple[str, ...]  # graph values whose bytes these are (tied weights: several)
    reasons: tuple[str, ...]  # consuming nodes, requirements, recipes
    dtype: int = 0
    dims: tuple[int, ...] = ()
    fallback_for: str | None = None  # a dormant entry: the active entry it stands behind
    # (dtype, dims) of each value, in the order of ``values``: one byte range may hold
    # tensors of different types (all-zero biases of two dtypes, a tensor and its view)
    types: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def value_type(self, value: str) -> tuple[int, tuple[int, ...]]:
        """``(dtype, dims)`` of one value this entry supplies."""
        if len(self.types) == len(self.values) and value in self.values:
            return self.types[self.values.index(value)]
        return self.dtype, self.dims

    def to_dict(self) -> dict[str, Any]:
        s = self.source
        out: dict[str, Any] = {
            "id": self.id, "status": self.status, "origin": self.origin,
            "values": list(self.values), "reasons": list(self.reasons),
            "file": s.file, "offset": s.offset, "length": s.length, "encoding": s.encoding,
            "checksum": s.checksum, "store_key": s.store_key,
        }
        if self.fallback_for is not None:
            out["fallback_for"] = self.fallback_for
        return out


@dataclass(frozen=True)
class Derivation:
    """A weight computed at load time from manifest entries (a caller transformation's
    recipe, e.g. a fused Q/K/V matrix): its sources are read once, then dropped."""

    value: str
    operation: str
    sources: tuple[str, ...]  # values, each supplied by an entry or another derivation
    attributes: tuple[tuple[str, str], ...]
    dtype: int
    dims: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "operation": self.operation,
                "sources": list(self.sources), "attributes": dict(self.attributes)}


@dataclass(frozen=True)
class RequiredPayloadManifest:
    """Active entries (read at load), dormant fallbacks, and load-time derivations."""

    entries: tuple[ManifestEntry, ...]
    derivations: tuple[Derivation, ...] = ()
    format_version: int = 1

    @property
    def active(self) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.status == ACTIVE)

    @property
    def dormant(self) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.status == DORMANT)

    @property
    def active_bytes(self) -> int:
        return sum(e.source.length for e in self.active)

    def entry(self, entry_id: str) -> ManifestEntry:
        for e in self.entries:
            if e.id == entry_id:
                return e
        raise KeyError(entry_id)

    def fallbacks_of(self, entry_id: str) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.fallback_for == entry_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "active": [e.to_dict() for e in self.active],
            "dormant": [e.to_dict() for e in self.dormant],
            "derivations": [d.to_dict() for d in self.derivations],
            "totals": {"active_entries": len(self.active), "active_bytes": self.active_bytes,
                       "dormant_entries": len(self.dormant),
                       "dormant_bytes": sum(e.source.length for e in self.dormant)},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
