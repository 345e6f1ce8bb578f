"""Prepared records: which packed payloads a package's device has, under which keys.

The packed blobs ``weightstore prepare`` made, and any initializer the runtime created, go
into the weight store by digest; portable weights are referenced by their digest, never
copied. The record's file, its MAC and what ``verify`` checks of it are in
:mod:`.prepared_record`.

Lookups are metadata only: a record entry answers a :class:`PreparedKey` when the keys are
equal (same lineage, runtime version, CPU features, ...) and the store holds the blob. The
record also says whether that runtime uses a packed blob as it is or packs the source
again (``packing_reused``, probed by ``weightstore prepare``), and which runtime, CPU
features and optimization level its companion graph was optimized for. A record whose MAC
does not hold is unproven: resolution does not use it and says why on stderr.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalogue.sites import iter_tensor_sites
from ..errors import IntegrityError, PackageError
from ..io.digests import ALGORITHMS, digest_bytes
from ..io.files import parse_json, read_record_bytes, read_regular
from ..io.onnx_proto import ModelProto, TensorProto, parse_model
from .closure import WeightSource
from .locator import StoreLocator
from .manifest import PayloadSource
from .prepared import PreparedKey
from .prepared_record import DEFAULT_TARGET, READABLE_VERSIONS, record_paths, record_unproven


@dataclass(frozen=True)
class PreparedRecord:
    """One model's prepared companion for one target."""

    graph_digest: str  # the resolved graph it was prepared from
    graph_path: Path
    objects: dict[str, dict[str, Any]]  # key digest -> object
    runtime_values: dict[str, dict[str, Any]]  # initializer -> {store_key, length, ...}
    runtime: str = ""
    cpu_features: tuple[str, ...] = ()
    optimization_level: str = ""
    packing_reused: bool | None = None  # None: not probed (an older record)
    graph_key: str | None = None  # the companion graph's digest (None: an older record)
    unproven: str | None = None  # why its MAC does not hold; None: proven
    path: Path | None = None  # the record's own file

    def companion(self, packed: Collection[str] | None = None) -> ModelProto:
        """The companion graph, checked against its digest (it is what the runtime runs);
        with ``packed`` (store keys), only the ``prepacked_N`` entries of those packed
        payloads are kept (the others are not read)."""
        data = read_regular(self.graph_path)
        if self.graph_key is not None:
            algo, _, expected = self.graph_key.partition(":")
            if algo not in ALGORITHMS or digest_bytes(algo, data) != expected:
                raise IntegrityError("the prepared companion graph does not match its "
                                     "record; run weightstore prepare again",
                                     file=str(self.graph_path), expected=self.graph_key)
        model = parse_model(data)
        if packed is None:
            return model
        for site in iter_tensor_sites(model):
            t = site.tensor
            kept = [(e.key, e.value) for e in t.external_data
                    if not e.key.startswith("prepacked") or e.value.partition("|")[2] in packed]
            if len(kept) != len(t.external_data):
                del t.external_data[:]
                for key, value in kept:
                    e = t.external_data.add()
                    e.key, e.value = key, value
        return model


def read_record(package: Path, target: str | None, model: str) -> PreparedRecord | None:
    path, graph = record_paths(package, target, model)
    if not path.is_file():
        return None
    try:
        doc = parse_json(read_record_bytes(path))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("format_version") not in READABLE_VERSIONS:
            raise PackageError("unsupported prepared record version", file=str(path),
                               version=doc.get("format_version"))
        reused = doc.get("packing_reused")
        unproven = record_unproven(target or DEFAULT_TARGET, model, doc)
        return PreparedRecord(str(doc["graph_digest"]), graph,
                              {o["key_digest"]: o for o in doc["objects"]},
                              dict(doc.get("runtime_values", {})), str(doc.get("runtime", "")),
                              tuple(doc.get("cpu_features", ())),
                              str(doc.get("optimization_level", "")),
                              None if reused is None else bool(reused),
                              str(doc["companion"]["digest"]) if "companion" in doc else None,
                              unproven, path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PackageError(f"unreadable prepared record: {exc}", file=str(path)) from None


class RecordCache:
    """:class:`~.prepared.PreparedCache` over a prepared record and the store."""

    def __init__(self, record: PreparedRecord, store: StoreLocator | None) -> None:
        self.record = record
        self.store = store

    @property
    def packing_reused(self) -> bool | None:
        return self.record.packing_reused

    def lookup(self, key: PreparedKey) -> WeightSource | None:
        obj = self.record.objects.get(key.digest)
        if obj is None or self.store is None:
            return None
        if obj["store_key"] not in self.store.locate([obj["store_key"]]):
            return None
        return WeightSource(PayloadSource("", 0, int(obj["length"]), checksum=obj["store_key"],
                                          store_key=obj["store_key"]),
                            TensorProto.UINT8, (int(obj["length"]),),
                            f"prepared {obj['identity']}")
