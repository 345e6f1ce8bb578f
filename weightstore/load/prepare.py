"""``weightstore prepare``: build a device's prepared (prepacked) weights once.

Run where the target machine class runs (in CI, say): the device's model is resolved,
its live weights are read and verified, and onnxruntime creates a session that saves its
CPU kernels' pre-packed weights beside an optimized copy of the graph
(``session.save_external_prepacked_constant_initializers``). From what onnxruntime wrote:

* each packed blob goes into the weight store by digest, recorded under the
  :class:`~.prepared.PreparedKey` of the requirement it satisfies;
* an initializer onnxruntime created while optimizing goes into the store too;
* a portable weight is referenced by its digest, never copied;
* the optimized graph (payloads omitted) and the record go to
  ``prepared/<device>/<model>.onnx`` and ``.json`` in the package folder.

Resolution then binds each requirement to its packed payload when the keys match (same
runtime version, CPU features, lineage, ...), and falls back to the portable weights when
they do not. The record also says whether the runtime uses a packed payload as it is
(:mod:`.packing_probe`): when it packs the source again anyway, resolution prefers the
portable weights and keeps only the companion's optimized graph.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalogue.graphs import iter_containers, iter_nodes
from ..catalogue.payload import external_entries
from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..catalogue.sites import iter_tensor_sites
from ..errors import PackageError
from ..io.digests import digest_bytes, make_key
from ..io.files import atomic_write_bytes
from ..io.models import save_model
from ..io.onnx_proto import GraphProto, ModelProto, TensorProto, read_model
from ..resolve.packing_probe import packing_reused
from ..resolve.prepared import PreparedOptions
from ..resolve.prepared_record import FORMAT_VERSION, VALUE_PREFIX, record_paths, sign_record


@dataclass(frozen=True)
class PrepareResult:
    record: Path
    objects: int
    packed_bytes: int
    runtime_values: int
    runtime: str
    cpu_features: tuple[str, ...]
    packing_reused: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"record": str(self.record), "objects": self.objects,
                "packed_bytes": self.packed_bytes, "runtime_values": self.runtime_values,
                "runtime": self.runtime, "cpu_features": list(self.cpu_features),
                "packing_reused": self.packing_reused}

    def describe(self) -> str:
        note = ("" if self.packing_reused is not False else
                f" ({self.runtime} packs the sources even with packed objects: loads "
                "use the portable weights with the optimized graph)")
        return (f"prepared {self.objects} packed objects ({self.packed_bytes} bytes) for "
                f"{self.runtime}; record {self.record}{note}")


def _requirement(candidates: list, kernel: str) -> Any:
    """The requirement a packed blob of ``kernel`` satisfies: the one of that kernel, else
    the weight's only one (onnxruntime may fuse, e.g. MatMul + Add into Gemm, and pack
    for the fused kernel)."""
    same = [r for r in candidates if r.kernel == kernel]
    if len(same) == 1:
        return same[0]
    return candidates[0] if len(candidates) == 1 and not same else None


def _ort_optimize(source: Path, out: Path, level: str) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }[level]
    so.optimized_model_filepath = str(out)
    so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                out.stem + ".data")
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])


def _keep_last_duplicates(model: ModelProto) -> None:
    """Keep one initializer of each name in every graph, the last, as onnxruntime reads
    them: onnxruntime before 1.31 saves each initializer of a subgraph twice (in an If's
    branch, say: the first copy without its prepacked entries), and refuses to load what
    it saved ("initializer name is not unique")."""
    for graph, _ in iter_containers(model):
        if not isinstance(graph, GraphProto):
            continue
        last = {t.name: i for i, t in enumerate(graph.initializer)}
        if len(last) == len(graph.initializer):
            continue
        kept = [t for i, t in enumerate(graph.initializer) if last[t.name] == i]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _root(store: Any, package: Path, keys: set[str]) -> None:
    """Keep the stored blobs alive as long as the package: its root in the store names
    them too (a root is made for a package this store has none for)."""
    if not store.add_root_keys(package, keys):
        from ..packaging.inventory import read_summary
        from ..packaging.materialize import register_root

        register_root(store, package, read_summary(package), extra=keys)


def prepare(package: str | os.PathLike[str], *, model: str | None = None,
            device: str | None = None, scenario: str | None = None,
            store: str | os.PathLike[str], algo: str = "blake3",
            optimization_level: str = "extended") -> PrepareResult:
    """Build and record the prepared companion of one model of ``package``."""
    from ..resolve.api import resolve
    from ..resolve.binding import cpu_features, prepared_key, runtime_version
    from ..store import BytesPayload, WeightStore
    from .manager import WeightManager
    from .runtime import LoadReport
    from .session import bind_payloads, read_active

    package = Path(package)
    options = PreparedOptions(records=False, optimization_level=optimization_level)
    with resolve(package, model=model, device=device, scenario=scenario, store=store,
                 prepared=options) as resolved:
        if not resolved.prepared_requirements:
            from ..convert.file_constant import is_any_file_constant

            ge_form = any(is_any_file_constant(n) for n in iter_nodes(resolved.frozen_model()))
            raise PackageError(
                "nothing to prepare: " + ("FileConstant weights (GE's form) take no "
                                          "onnxruntime prepared weights; prepare an "
                                          "external-data layout" if ge_form else
                                          "no kernel of this device takes prepared weights"),
                package=str(package), device=device)
        graph = resolved.frozen_model()
        data = read_active(resolved, buffers={}, reader=None, jobs=4,
                           manager=WeightManager(), report=LoadReport()).data
        files = bind_payloads(graph, resolved, data, {})
        digest_of = {v: e.source.checksum or make_key(algo, digest_bytes(algo, data[e.id]))
                     for e in resolved.payload_manifest.active for v in e.values}
        requirements: dict[str, list] = {}
        for r in resolved.prepared_requirements:
            requirements.setdefault(r.value, []).append(r)
        tmp = Path(tempfile.mkdtemp(prefix="weightstore-prepare-"))
        try:
            for name, view in files.items():
                (tmp / name).write_bytes(view)
            save_model(graph, tmp / "source.onnx")
            _ort_optimize(tmp / "source.onnx", tmp / "prepared.onnx", optimization_level)
            companion = read_model(tmp / "prepared.onnx")
            _keep_last_duplicates(companion)
            blob = (tmp / "prepared.data").read_bytes() if (
                tmp / "prepared.data").exists() else b""
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        payloads, objects, runtime_values = [], [], {}
        for site in iter_tensor_sites(companion):
            t = site.tensor
            if t.data_location != TensorProto.EXTERNAL:
                continue
            name = site.value_name or t.name
            parsed = external_entries(t, name)
            offset, length = parsed.offset, parsed.length or 0
            own = blob[offset:offset + length]
            key = make_key(algo, digest_bytes(algo, own))
            entries = list(parsed.prepacked)
            if digest_of.get(name) != key and length <= SMALL_VALUE_LIMIT and not entries:
                del t.external_data[:]  # a small value: part of the companion's metadata
                t.data_location = TensorProto.DEFAULT
                t.raw_data = own
                continue
            if digest_of.get(name) != key:  # not a portable weight: the runtime made it
                payloads.append(BytesPayload(key, own))
                runtime_values[name] = {"store_key": key, "length": length,
                                          "dtype": t.data_type, "dims": list(t.dims)}
            del t.external_data[:]
            for k, v in (("location", VALUE_PREFIX + name), ("length", str(length))):
                e = t.external_data.add()
                e.key, e.value = k, v
            for k, v in entries:
                identity, _, where = v.partition("|")
                p_off, p_len = (int(x) for x in where.split(";")[:2])
                packed = blob[p_off:p_off + p_len]
                packed_key = make_key(algo, digest_bytes(algo, packed))
                payloads.append(BytesPayload(packed_key, packed))
                kernel = identity.split("+", 1)[0]
                req = _requirement(requirements.get(name, []), kernel)
                if req is None or name not in digest_of:
                    continue  # a packing the catalogue does not ask for: not recorded
                pkey = prepared_key(req, (digest_of[name],), options)
                objects.append({"key": pkey.to_dict(), "key_digest": pkey.digest,
                                "value": name, "kernel": kernel, "identity": identity,
                                "store_key": packed_key, "length": p_len})
                e = t.external_data.add()
                e.key, e.value = k, f"{identity}|{packed_key}"
        if not objects:
            raise PackageError("onnxruntime packed none of the requested weights",
                               package=str(package), runtime=runtime_version())
        with WeightStore(store).leased() as ws:  # no gc takes them before they are rooted
            ws.put(payloads, kind="separate")
            _root(ws, package, {p.key for p in payloads})
        record_path, graph_path = record_paths(package, device, resolved.source.name)
        record_path.parent.mkdir(parents=True, exist_ok=True)
        graph_bytes = companion.SerializeToString()
        atomic_write_bytes(graph_path, graph_bytes)
        doc = {"format_version": FORMAT_VERSION, "model": resolved.source.name,
               "companion": {"file": graph_path.name, "size": len(graph_bytes),
                             "digest": make_key(algo, digest_bytes(algo, graph_bytes))},
               "scenario": resolved.selected_scenario, "device": device,
               "graph_digest": resolved.graph_digest, "runtime": runtime_version(),
               "cpu_features": list(cpu_features()), "optimization_level": optimization_level,
               "packing_reused": packing_reused(),
               "objects": sorted(objects, key=lambda o: (o["value"], o["kernel"])),
               "runtime_values": runtime_values}
        doc = sign_record(device, resolved.source.name, doc)
        atomic_write_bytes(record_path, (json.dumps(doc, indent=2, sort_keys=True) + "\n")
                           .encode())
    return PrepareResult(record_path, len(objects), sum(o["length"] for o in objects),
                         len(runtime_values), runtime_version(), cpu_features(),
                         packing_reused())
