"""``weightstore.load``: a frozen ResolvedModel -> an onnxruntime InferenceSession.

Only active manifest entries are read, each once (or taken from the process's weight
manager when another session already holds the same digest). The bytes reach onnxruntime
from memory by file name (``add_external_initializers_from_files_in_memory``): every live
tensor whose payload the resolved graph omits is pointed at an in-memory file named after
its manifest entry, so onnxruntime opens no file itself. Load-time derivations are
computed from their sources' bytes, which are read once. A resolution bound to prepared
weights loads through :mod:`.prepared` instead (onnxruntime maps packed weights only from
files).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ..catalogue.descriptors import DerivedWeightRecipe
from ..catalogue.sites import iter_tensor_sites
from ..convert.encoding import has_payload
from ..convert.file_constant import is_file_constant
from ..errors import LoadError
from ..passes.analysis import is_constant, iter_scopes
from ..resolve.manifest import ACTIVE, STORE_ONLY, ManifestEntry
from ..resolve.model import ResolvedModel
from ..scenarios.derive import resolver
from .executor import execute
from .manager import WEIGHTS, WeightManager
from .plan import plan_reads
from .reader import FileReader, Reader

MEMORY_PREFIX = "weightstore-memory-"


@dataclass
class LoadReport:
    """What one load did: bytes read, entries shared from the manager, fallbacks."""

    read_bytes: int = 0
    live_bytes: int = 0
    entries_read: int = 0
    entries_shared: int = 0
    fell_back: dict[str, str] = field(default_factory=dict)


def _array(entry: ManifestEntry, data: memoryview) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(entry.dtype)
    return np.frombuffer(data, dtype=dtype).reshape(entry.dims)


def point_at(tensor: onnx.TensorProto, name: str, offset: int, length: int,
             extra: Sequence[tuple[str, str]] = ()) -> None:
    """Make ``tensor``'s payload ``length`` bytes of file ``name`` at ``offset``."""
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", name), ("offset", str(offset)), ("length", str(length)),
                       *extra):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """onnxruntime's checker wants a Constant node's external data in a real file: a main
    graph Constant whose payload is omitted becomes an initializer (same value name)."""
    g = model.graph
    kept = []
    for node in g.node:
        t = next((a.t for a in node.attribute if a.name == "value"
                  and a.type == onnx.AttributeProto.TENSOR), None)
        if is_constant(node) and t is not None and not has_payload(t) and len(node.output) == 1:
            init = g.initializer.add()
            init.CopyFrom(t)
            init.name = node.output[0]
            continue
        kept.append(node)
    if len(kept) != len(g.node):
        del g.node[:]
        g.node.extend(kept)


def read_active(resolved: ResolvedModel, *, buffers: Mapping[str, memoryview],
                reader: Reader | None, jobs: int, manager: WeightManager,
                report: LoadReport) -> tuple[dict[str, memoryview], list[str]]:
    """The bytes of every active entry (entry id -> bytes), verified, and the digests this
    load holds in the weight manager. Entries the manager already holds are not read."""
    manifest = resolved.payload_manifest
    entries = {e.id: e for e in manifest.entries}
    data: dict[str, memoryview] = {}
    held: list[str] = []
    to_read = []
    for e in manifest.active:
        shared = manager.acquire(e.source.checksum) if e.source.checksum else None
        if shared is not None:
            data[e.id] = shared
            held.append(e.source.checksum)  # type: ignore[arg-type]
            report.entries_shared += 1
        else:
            to_read.append(e)
    own_reader = reader is None
    reader = reader or FileReader()
    try:
        plan = plan_reads(to_read, resolved.source.folder, resolved.source.path,
                          buffers={k: len(v) for k, v in buffers.items()},
                          store=resolved.source.store)

        def fallback(entry: ManifestEntry) -> memoryview | None:
            for dormant in manifest.fallbacks_of(entry.id):
                sub = plan_reads([dormant], resolved.source.folder, resolved.source.path,
                                 store=resolved.source.store)
                got = execute(sub, entries, reader, jobs=jobs,
                              scenario=resolved.selected_scenario)
                report.read_bytes += sub.read_bytes
                if dormant.id in got.data:
                    return got.data[dormant.id]
            return None

        result = execute(plan, entries, reader, buffers=buffers, jobs=jobs,
                         fallback=fallback, scenario=resolved.selected_scenario,
                         tolerate=resolved.tolerated_failures)
    finally:
        if own_reader:
            reader.close()  # type: ignore[union-attr]
    report.read_bytes += plan.read_bytes
    report.entries_read += len(to_read)
    report.live_bytes = manifest.active_bytes
    report.fell_back.update(result.fell_back)
    for e in to_read:
        if e.id not in result.data:
            continue  # a tolerated failure: the caller falls back
        view = result.data[e.id]
        if e.source.checksum:
            data[e.id] = manager.publish(e.source.checksum, view)
            held.append(e.source.checksum)
        else:
            data[e.id] = view
    return data, held


def load(resolved: ResolvedModel, *, buffers: Mapping[str, Any] | None = None,
         reader: Reader | None = None, jobs: int = 4, manager: WeightManager = WEIGHTS,
         providers: Sequence[str] = ("CPUExecutionProvider",),
         session_options: Any = None, report: LoadReport | None = None) -> Any:
    """An onnxruntime session of ``resolved``, reading exactly its active payloads.

    With prepared weights bound (``weightstore prepare``), the session is created from the
    prepared companion; a packed payload failing its checksum makes it fall back to the
    portable weights (read anyway: onnxruntime checks packed weights against them).
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise LoadError("loading needs onnxruntime: pip install 'weightstore[runtime]'",
                        model=resolved.source.name) from None

    model = resolved.frozen_model()
    if any(is_file_constant(n) for s in iter_scopes(model) for n in s.container.node):
        raise LoadError("FileConstant nodes do not run in onnxruntime: load an "
                        "external-data layout", model=resolved.source.name)
    report = report if report is not None else LoadReport()
    if resolved.prepared_graph is not None and not buffers:
        from .prepared import prepared_session

        session = prepared_session(ort, resolved, reader=reader, jobs=jobs, report=report,
                                   providers=providers, session_options=session_options)
        if session is not None:
            return session
        resolved = resolved.without_prepared()  # a packed payload failed: portable weights
    views = {k: memoryview(v).cast("B") for k, v in (buffers or {}).items()}
    data, held = read_active(resolved, buffers=views, reader=reader, jobs=jobs,
                             manager=manager, report=report)
    files = bind_payloads(model, resolved, data, views)
    options = session_options or ort.SessionOptions()
    names = sorted(files)
    options.add_external_initializers_from_files_in_memory(
        names, [files[n] for n in names], [len(files[n]) for n in names])
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=list(providers))
    weakref.finalize(session, manager.release, list(held))
    return session


def bind_payloads(model: onnx.ModelProto, resolved: ResolvedModel,
                  data: Mapping[str, memoryview], views: Mapping[str, memoryview],
                  ) -> dict[str, memoryview]:
    """Point every live tensor of ``model`` whose payload is omitted at its bytes: an
    in-memory file per manifest entry (main graph) or inline (subgraphs, functions).
    Returns the in-memory files by name (caller buffers included)."""
    manifest = resolved.payload_manifest
    by_value = {v: e for e in manifest.entries if e.status == ACTIVE
                and e.origin not in STORE_ONLY for v in e.values}  # values, not packed forms
    files: dict[str, memoryview] = {}

    def value(name: str) -> np.ndarray:
        e = by_value.get(name)
        if e is None:
            raise LoadError("a derivation source is not in the manifest", source=name)
        return _array(e, data[e.id])

    recipes = {d.value: DerivedWeightRecipe(d.operation, d.sources, d.attributes)
               for d in manifest.derivations}
    derived = resolver(recipes, value)
    _constants_to_initializers(model)
    for site in iter_tensor_sites(model):
        t = site.tensor
        name = site.value_name or t.name
        if has_payload(t) or t.data_type == onnx.TensorProto.STRING:
            continue
        e = by_value.get(name)
        if e is not None and e.source.file in views and site.container is model.graph:
            continue  # the caller's buffer under the model's own file name
        if e is not None:
            file, payload = MEMORY_PREFIX + e.id, data[e.id]
        elif name in recipes:
            array = np.ascontiguousarray(derived(name))
            file, payload = f"{MEMORY_PREFIX}derived-{len(files)}", memoryview(array).cast("B")
        elif t.data_location == onnx.TensorProto.EXTERNAL or any(t.dims):
            raise LoadError("a live weight has no manifest entry", initializer=name)
        else:
            continue
        if site.container is model.graph:
            files[file] = payload
            point_at(t, file, 0, len(payload))
        else:  # onnxruntime takes in-memory external data for main-graph tensors only
            t.ClearField("external_data")
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = bytes(payload)
    for name, view in views.items():
        files[name] = view
    return files
