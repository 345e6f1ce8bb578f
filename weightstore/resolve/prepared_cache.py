"""Prepared records: which packed payloads a package's device has, under which keys.

``weightstore prepare`` writes, per device, ``prepared/<device>/<model>.json`` in the
package folder (the record) and ``prepared/<device>/<model>.onnx`` (the graph onnxruntime
optimized and annotated with its ``prepacked_N`` entries, payloads omitted). The packed
blobs themselves, and any initializer the runtime created, go into the weight store by
digest; portable weights are referenced by their digest, never copied.

Lookups are metadata only: a record entry answers a :class:`PreparedKey` when the keys are
equal (same lineage, runtime version, CPU features, ...) and the store holds the blob. The
record also says whether that runtime uses a packed blob as it is or packs the source
again (``packing_reused``, probed by ``weightstore prepare``), and which runtime, CPU
features and optimization level its companion graph was optimized for.

A record is trusted only under its MAC: ``prepare`` signs it with the user's private key
(:mod:`weightstore.caches.mac`), binding every field, the companion graph's digest
among them, to the record's place (``<target>/<model>``). A record whose MAC does not
hold (edited, written by another user or machine, or by an earlier version) is
unproven: resolution does not use it and says why on stderr, and ``verify`` reports it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..caches.mac import entry_mac, verify_mac
from ..catalogue.sites import iter_tensor_sites
from ..errors import IntegrityError, PackageError
from ..io.digests import ALGORITHMS, digest_bytes
from ..io.files import parse_json, read_regular
from .closure import WeightSource
from .locator import StoreLocator
from .manifest import PayloadSource
from .prepared import PreparedKey

FORMAT_VERSION = 2  # 2: the record carries a MAC; 1 (unsigned) is read as unproven
READABLE_VERSIONS = (1, FORMAT_VERSION)
PREPARED = "prepared"
DEFAULT_TARGET = "default"


def record_paths(package: Path, target: str | None, model: str) -> tuple[Path, Path]:
    folder = package / PREPARED / (target or DEFAULT_TARGET)
    return folder / f"{model}.json", folder / f"{model}.onnx"


def _signed(target: str, model: str, doc: dict[str, Any]) -> dict[str, Any]:
    """What a record's MAC covers: every field but the MAC, and where the record is."""
    return {"prepared_record": f"{target}/{model}",
            "doc": {k: v for k, v in doc.items() if k != "mac"}}


def sign_record(target: str | None, model: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its MAC under this user's key (none when no private key is
    available: the record is then unproven wherever it is read)."""
    mac = entry_mac(_signed(target or DEFAULT_TARGET, model, doc))
    return {**doc, "mac": mac} if mac is not None else dict(doc)


def record_unproven(target: str, model: str, doc: dict[str, Any]) -> str | None:
    """Why the record ``doc`` at ``<target>/<model>`` is not proven, None when its MAC
    holds under this user's key."""
    if doc.get("format_version") != FORMAT_VERSION:
        return (f"format_version {doc.get('format_version')} records carry no MAC; "
                "run weightstore prepare again")
    if "mac" not in doc:
        return "it carries no MAC (no private key when it was prepared)"
    if not verify_mac(_signed(target, model, doc), doc["mac"]):
        return ("its MAC does not hold under this user's key (edited, or prepared by "
                "another user or machine); run weightstore prepare again")
    return None


def record_proof(folder: Path, name: str) -> str | None:
    """:func:`record_unproven` for the record at ``name`` (``prepared/<target>/<m>.json``)
    in the package ``folder``."""
    _, target, file = name.split("/")
    try:
        doc = parse_json(read_regular(folder / name))
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    if not isinstance(doc, dict):
        return "not a JSON object"
    return record_unproven(target, file.removesuffix(".json"), doc)


PROVEN_SIGNED = "signed"  # a prepared record's MAC holds under this user's key


def prepared_proof(folder: Path, record: str, companion: str) -> dict[str, Any]:
    """What ``verify`` reports of one prepared record: ``{"record", "companion", "proven",
    "detail"}``, ``proven`` being ``"signed"`` when its MAC holds (so its companion's digest
    is the one ``prepare`` wrote) and None otherwise, ``detail`` saying why."""
    why = record_proof(folder, record)
    return {"record": record, "companion": companion,
            "proven": PROVEN_SIGNED if why is None else None,
            "detail": why or "its MAC holds under this user's key"}


def companion_contents(names: Collection[str], folder: Path,
                       ) -> tuple[list[str], list[dict[str, Any]]]:
    """What ``weightstore verify`` checks among the files of a package its summary does
    not list (``names``, relative POSIX paths): the readable prepared records, and each
    one's companion graph as ``{"path", "size", "digest"}`` from the record."""
    records: list[str] = []
    graphs: list[dict[str, Any]] = []
    for name in sorted(names):
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != PREPARED or not parts[2].endswith(".json"):
            continue
        try:
            doc = parse_json(read_regular(folder / name))
            graph = doc["companion"]
            entry = {"path": f"{PREPARED}/{parts[1]}/{graph['file']}",
                     "size": int(graph["size"]), "digest": str(graph["digest"])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a readable record: verify reports it as unlisted
        if (doc.get("format_version") in READABLE_VERSIONS and ":" in entry["digest"]
                and "/" not in graph["file"] and str(graph["file"]).endswith(".onnx")):
            records.append(name)
            graphs.append(entry)
    return records, graphs


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

    def companion(self, packed: Collection[str] | None = None) -> onnx.ModelProto:
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
        model = onnx.load_from_string(data)
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
        doc = parse_json(read_regular(path))
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
                            onnx.TensorProto.UINT8, (int(obj["length"]),),
                            f"prepared {obj['identity']}")
