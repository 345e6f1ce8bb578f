"""A session from a prepared companion: the optimized graph, and any packed weights bound.

onnxruntime uses serialized pre-packed weights only when it reads external data from
files itself (from memory, it packs again). So the active entries are read straight into
one private mapped data file (:mod:`.mapped`): each coalesced run lands at a 4096-aligned
slot, checksums are verified from the mapping, and the companion graph's ``location`` and
``prepacked_N`` entries are pointed at the slots. onnxruntime then maps the same pages:
the bytes are in memory once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..catalogue.payload import external_info
from ..catalogue.sites import iter_tensor_sites
from ..errors import LoadError
from ..io.onnx_proto import ModelProto, TensorProto, parse_model
from ..resolve.model import ResolvedModel
from ..resolve.prepared_record import VALUE_PREFIX
from .executor import execute, reading_store
from .mapped import MappedData, layout
from .plan import plan_reads
from .reader import FileReader, Reader
from .runtime import create_session, point_at


def prepared_session(ort: Any, resolved: ResolvedModel, *, reader: Reader | None, jobs: int,
                     report: Any, providers: Sequence[str], session_options: Any) -> Any:
    """The session, or None when a packed payload failed its checksum (the caller then
    loads the portable weights). Reads of store objects a compaction moved meanwhile
    are planned and made again (:func:`.executor.reading_store`)."""
    return reading_store(resolved.source.store, lambda: _prepared_session(
        ort, resolved, reader=reader, jobs=jobs, report=report, providers=providers,
        session_options=session_options))


def _prepared_session(ort: Any, resolved: ResolvedModel, *, reader: Reader | None,
                      jobs: int, report: Any, providers: Sequence[str],
                      session_options: Any) -> Any:
    assert resolved.prepared_graph is not None
    manifest = resolved.payload_manifest
    entries = {e.id: e for e in manifest.entries}
    active = list(manifest.active)
    plan = plan_reads(active, resolved.source.folder, resolved.source.path,
                      store=resolved.source.store, package=resolved.source.package is not None)
    slots, end = layout([run.length for run in plan.runs])
    own_reader = reader is None
    reader = reader or FileReader()
    try:
        with MappedData(end) as mapped:
            result = execute(plan, entries, reader, jobs=jobs, scenario=resolved.selected_scenario,
                             tolerate=resolved.tolerated_failures,
                             sink=(mapped, slots))
            report.read_bytes += plan.read_bytes
            report.entries_read += len(active)
            report.live_bytes = manifest.active_bytes
            report.fell_back.update(result.fell_back)
            del result
            if any(e.id in report.fell_back for e in active):
                return None
            where = {e: slots[i] + off for i, run in enumerate(plan.runs)
                     for e, off, _ in run.entries}
            companion = _point(parse_model(resolved.prepared_graph), manifest,
                               where, mapped.path.name)
            mapped.release()  # onnxruntime maps the pages; ours would count them twice
            model_path = mapped.folder / "prepared.onnx"
            model_path.write_bytes(companion.SerializeToString())
            options = session_options or ort.SessionOptions()
            # the companion is the graph as onnxruntime optimized it when it was prepared:
            # optimizing it again would redo that work and find nothing more to do
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return create_session(ort, model_path, options, providers, report,
                                  model=str(resolved.source.path))
    finally:
        if own_reader:
            reader.close()  # type: ignore[union-attr]


def _point(companion: ModelProto, manifest: Any, where: dict[str, int],
           data: str) -> ModelProto:
    """Point the companion's tensors and packed entries at their slots in the data file."""
    by_value: dict[str, tuple[int, int]] = {}
    by_key: dict[str, tuple[int, int]] = {}
    for e in manifest.active:
        place = (where[e.id], e.source.length)
        if e.source.store_key:
            by_key[e.source.store_key] = place
        if e.origin != "prepared":  # a packed form is not the value itself
            for v in e.values:
                by_value.setdefault(v, place)
    for site in iter_tensor_sites(companion):
        t = site.tensor
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = external_info(t)
        value = info.get("location", "").removeprefix(VALUE_PREFIX)
        if value not in by_value:
            raise LoadError("the prepared graph needs a weight the manifest lacks",
                            initializer=value)
        offset, length = by_value[value]
        packed = []
        for k, v in info.items():
            if k.startswith("prepacked"):
                identity, _, key = v.partition("|")
                if key not in by_key:
                    raise LoadError("a packed weight is not in the manifest",
                                    initializer=value, store_key=key)
                p_off, p_len = by_key[key]
                packed.append((k, f"{identity}|{p_off};{p_len};0"))
        point_at(t, data, offset, length, packed)
    return companion
