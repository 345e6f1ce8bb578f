"""The load through private data files: a frozen ResolvedModel -> an onnxruntime session,
where :func:`weightstore.load` (:mod:`.ready`) cannot hand over the package's own files
(:mod:`.direct`): weights held only by the store, large typed payloads, caller buffers.

Only active manifest entries are read, each once (or taken from the process's weight
manager when another session already holds the same digest), verified as they are read,
into a private data file that onnxruntime maps (:mod:`.mapped`): it copies weights handed
to it from memory, so handing them over that way would hold them twice. Caller buffers
(GE's user memory by file name) do go from memory
(``add_external_initializers_from_files_in_memory``), and then every weight does:
onnxruntime takes weights from memory only when all come from there. Load-time
derivations are computed from their sources' bytes, which are read once. A resolution
bound to prepared weights loads through :mod:`.prepared` instead."""

from __future__ import annotations

import posixpath
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..catalogue.descriptors import DerivedWeightRecipe
from ..catalogue.payload import external_entries
from ..catalogue.shape_inputs import shape_input_names
from ..catalogue.sites import ambiguous_names, iter_tensor_sites
from ..convert.encoding import has_payload
from ..convert.file_constant import (
    as_external_constants,
    is_any_file_constant,
    is_file_constant,
)
from ..errors import IntegrityError, LoadError
from ..io.digests import FILE_CHECKSUM, digest_file
from ..io.onnx_arrays import np_dtype
from ..io.onnx_proto import AttributeProto, ModelProto, TensorProto
from ..passes.analysis import is_constant, iter_scopes
from ..resolve.manifest import ACTIVE, STORE_ONLY, ManifestEntry
from ..resolve.model import ResolvedModel
from ..scenarios.derive import resolver
from .executor import execute, reading_store
from .manager import WeightManager
from .mapped import MappedData, SpillFile, layout
from .plan import plan_reads
from .reader import FileReader, Reader
from .runtime import LoadReport, create_session, point_at

MEMORY_PREFIX = "weightstore-memory-"


def _array(entry: ManifestEntry, value: str, data: memoryview) -> np.ndarray:
    """The bytes as ``value`` holds them (an entry's values may differ in type)."""
    dtype, dims = entry.value_type(value)
    return np.frombuffer(data, dtype=np_dtype(dtype)).reshape(dims)


def _constants_to_initializers(model: ModelProto) -> None:
    """onnxruntime's checker wants a Constant node's external data in a real file: a main
    graph Constant whose payload is omitted becomes an initializer (same value name)."""
    g = model.graph
    kept = []
    for node in g.node:
        t = next((a.t for a in node.attribute if a.name == "value"
                  and a.type == AttributeProto.TENSOR), None)
        if is_constant(node) and t is not None and not has_payload(t) and len(node.output) == 1:
            init = g.initializer.add()
            init.CopyFrom(t)
            init.name = node.output[0]
            continue
        kept.append(node)
    if len(kept) != len(g.node):
        del g.node[:]
        g.node.extend(kept)


@dataclass
class ActiveBytes:
    """The verified bytes of a load's active entries (entry id -> bytes), the digests it
    holds in the weight manager, and, when read into a mapped data file, each entry's
    offset there and the file."""

    data: dict[str, memoryview]
    held: list[str]
    where: dict[str, tuple[int, int]] = field(default_factory=dict)  # -> (file, offset)
    files: list[MappedData] = field(default_factory=list)


def packed_only(resolved: ResolvedModel, model: ModelProto) -> set[str]:
    """Values every consumer of which pre-packs them (per the kernel catalogue):
    onnxruntime drops such a weight once packed, so holding it for later loads would keep
    a second copy for the session's lifetime."""
    wanted: dict[str, set[str]] = {}
    for r in resolved.prepared_requirements:
        wanted.setdefault(r.value, set()).update(r.consumers)
    readers: dict[str, set[str]] = {}
    for scope in iter_scopes(model):
        for i, node in enumerate(scope.container.node):
            label = node.name or (node.output[0] if node.output else f"#{i}")
            for name in node.input:
                if name in wanted:
                    readers.setdefault(name, set()).add(label)
    outputs = {o.name for o in model.graph.output}
    return {v for v, labels in readers.items() if labels <= wanted[v] and v not in outputs}


def read_active(resolved: ResolvedModel, *, buffers: Mapping[str, memoryview],
                reader: Reader | None, jobs: int, manager: WeightManager,
                report: LoadReport, mapped: bool = False,
                unshared: Collection[str] = (),
                only: Collection[str] | None = None) -> ActiveBytes:
    """The bytes of every active entry, verified. Entries the manager already holds are
    not read. With ``mapped``, entries are read into mapped data files (see
    :mod:`.mapped`): one for what the manager holds, one for ``unshared`` values' entries
    (not held: released once the session exists). ``only``: these entries alone. Reads
    of store objects a compaction moved meanwhile are planned and made again
    (:func:`.executor.reading_store`)."""
    return reading_store(resolved.source.store, lambda: _read_active(
        resolved, buffers=buffers, reader=reader, jobs=jobs, manager=manager,
        report=report, mapped=mapped, unshared=unshared, only=only))


def _read_active(resolved: ResolvedModel, *, buffers: Mapping[str, memoryview],
                 reader: Reader | None, jobs: int, manager: WeightManager,
                 report: LoadReport, mapped: bool, unshared: Collection[str],
                 only: Collection[str] | None) -> ActiveBytes:
    manifest = resolved.payload_manifest
    entries = {e.id: e for e in manifest.entries}
    out = ActiveBytes({}, [])
    to_read = []
    shared: list[tuple[ManifestEntry, memoryview]] = []
    for e in manifest.active:
        if only is not None and e.id not in only:
            continue
        view = manager.acquire(e.source.checksum) if e.source.checksum else None
        if view is not None:
            shared.append((e, view))
            out.held.append(e.source.checksum)  # type: ignore[arg-type]
            report.entries_shared += 1
        else:
            to_read.append(e)
    keep = set(unshared)
    groups = ([[e for e in to_read if not keep & set(e.values)],
               [e for e in to_read if keep & set(e.values)]] if mapped else [to_read])
    own_reader = reader is None
    reader = reader or FileReader()
    package = resolved.source.package is not None  # its files: regular files only
    try:
        def fallback(entry: ManifestEntry) -> memoryview | None:
            for dormant in manifest.fallbacks_of(entry.id):
                sub = plan_reads([dormant], resolved.source.folder, resolved.source.path,
                                 store=resolved.source.store, package=package)
                got = execute(sub, entries, reader, jobs=jobs,
                              scenario=resolved.selected_scenario)
                report.read_bytes += sub.read_bytes
                if dormant.id in got.data:
                    return got.data[dormant.id]
            return None

        plans = [plan_reads(group, resolved.source.folder, resolved.source.path,
                            buffers={k: len(v) for k, v in buffers.items()},
                            store=resolved.source.store, package=package) for group in groups]
        layouts = [layout([r.length for r in plan.runs]
                          + ([len(v) for _, v in shared] if n == 0 else []))
                   for n, plan in enumerate(plans)]
        for n, (group, plan) in enumerate(zip(groups, plans, strict=True)):
            sink = None
            if mapped:
                slots, end = layouts[n]
                file = MappedData(end, out.files[0].folder if out.files else None,
                                  f"weights-{n}.data", reserve=sum(e for _, e in layouts))
                out.files.append(file)
                sink = (file, slots)
                for (e, view), s in zip(shared if n == 0 else [], slots[len(plan.runs):],
                                        strict=True):
                    file.write(s, view)  # verified when first read
                    out.where[e.id] = (n, s)
                for i, r in enumerate(plan.runs):
                    for entry_id, offset, _ in r.entries:
                        if entries[entry_id].source.encoding in ("raw", "raw_data"):
                            out.where[entry_id] = (n, slots[i] + offset)
            result = execute(plan, entries, reader, buffers=buffers, jobs=jobs,
                             fallback=fallback, scenario=resolved.selected_scenario,
                             tolerate=resolved.tolerated_failures, sink=sink)
            report.read_bytes += plan.read_bytes
            report.fell_back.update(result.fell_back)
            for e in group:
                if e.id in result.fell_back:
                    out.where.pop(e.id, None)  # its replacement is not in the file
                if e.id not in result.data:
                    continue  # a tolerated failure: the caller falls back
                view = result.data[e.id]
                if e.source.checksum and e.id not in result.fell_back:
                    report.verified_bytes += len(view)  # the executor verified it
                if e.source.checksum and n == 0:
                    out.data[e.id] = manager.publish(e.source.checksum, view)
                    out.held.append(e.source.checksum)
                else:
                    out.data[e.id] = view
    except BaseException:
        for file in out.files:
            file.remove_folder()
        manager.release(out.held)  # nothing will use them: a retry acquires its own
        raise
    finally:
        if own_reader:
            reader.close()  # type: ignore[union-attr]
    for e, view in shared:
        out.data[e.id] = view
    report.entries_read += len(to_read)
    report.live_bytes = manifest.active_bytes
    return out


def runnable_model(resolved: ResolvedModel) -> ModelProto:
    """The resolved graph as onnxruntime runs it: our FileConstant nodes as the Constant
    nodes they stand for (payloads still to bind); a FileConstant node of another tool
    (GE) is refused."""
    model = resolved.frozen_model()
    foreign = next((n for s in iter_scopes(model) for n in s.container.node
                    if is_any_file_constant(n) and not is_file_constant(n)), None)
    if foreign is not None:
        raise LoadError("a FileConstant node of another tool (GE) does not run in "
                        "onnxruntime: bring its weights inline first (weightstore convert "
                        "to-inline, with --value-bins for file_id nodes)",
                        model=resolved.source.name, node=foreign.name)
    as_external_constants(model)
    return model


def declared_file_sha1(model: ModelProto, folder: Path | None) -> dict[str, str]:
    """onnx.proto's external-data ``checksum`` each file of ``model`` is declared to have
    (the SHA-1 of the whole file), by its location relative to the model's folder; two
    tensors declaring different ones for one file are refused. A model of a package
    declares none (its digests are in ``summary.json``)."""
    out: dict[str, str] = {}
    for site in iter_tensor_sites(model):
        t = site.tensor
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = external_entries(t, site.where)
        if info.file_sha1 is None:
            continue
        name = posixpath.normpath(info.location)
        if out.setdefault(name, info.file_sha1) != info.file_sha1:
            raise IntegrityError("two tensors declare different SHA-1 checksums for one "
                                 "external data file (onnx.proto's checksum)",
                                 location=name, tensor=site.where)
    if out and folder is None:
        raise LoadError("external data with a declared checksum has no folder")
    return out


def check_file_sha1(model: ModelProto, folder: Path | None, where: str) -> int:
    """Refuse a file whose SHA-1 is not the one ``model`` declares for it
    (:func:`declared_file_sha1`); the bytes read."""
    read = 0
    for name, expected in declared_file_sha1(model, folder).items():
        path = folder / name  # type: ignore[operator]
        actual = digest_file(FILE_CHECKSUM, path)
        read += path.stat().st_size
        if actual != expected:
            raise IntegrityError("external data file does not match the SHA-1 checksum its "
                                 "model declares (onnx.proto's checksum)", model=where,
                                 location=name, expected=expected, actual=actual)
    return read


def copied_session(ort: Any, resolved: ResolvedModel, model: ModelProto, *,
                   buffers: Mapping[str, Any] | None, reader: Reader | None, jobs: int,
                   manager: WeightManager, providers: Sequence[str], session_options: Any,
                   report: LoadReport) -> Any:
    """The session of ``resolved`` (``model``: :func:`runnable_model`, ours to change)
    through the load's private data files (see the module's text)."""
    views = {k: memoryview(v).cast("B") for k, v in (buffers or {}).items()}
    packed = packed_only(resolved, model)
    checked = check_file_sha1(model, resolved.source.folder, str(resolved.source.path))
    report.read_bytes += checked
    report.verified_bytes += checked
    active = read_active(resolved, buffers=views, reader=reader, jobs=jobs,
                         manager=manager, report=report, mapped=True, unshared=packed)
    handed: dict[str, np.ndarray] = {}
    try:
        # weights read here are mapped by onnxruntime from the load's data files. Weights
        # in caller buffers that onnxruntime packs are handed over as they are: it packs
        # them from the caller's memory, no copy. It would copy the others (embeddings,
        # norms, biases) into memory of its own: they join the data files instead, which
        # it maps, so the bytes it keeps using are a copy nobody else writes to
        where = {k: (active.files[n].path.name, offset) for k, (n, offset)
                 in active.where.items()}
        spill = SpillFile(active.files[0].folder)
        try:
            bind_payloads(model, resolved, active.data, views, where, spill.append,
                          handed=handed, hand=packed)
        finally:
            spill.close()
        for file in active.files:
            file.release()  # onnxruntime maps the pages; ours would count them twice
        options = session_options or ort.SessionOptions()
        values = [ort.OrtValue.ortvalue_from_numpy(handed[n]) for n in sorted(handed)]
        if values:
            options.add_external_initializers(sorted(handed), values)
        path = active.files[0].folder / "model.onnx"
        path.write_bytes(model.SerializeToString())
        session = create_session(ort, path, options, providers, report,
                                 model=str(resolved.source.path))
    finally:
        for file in reversed(active.files):  # the first owns the folder
            file.remove_folder()
    # the session uses the handed-over memory for its lifetime: keep it until then
    weakref.finalize(session, _release, manager, list(active.held), values)
    return session


def _release(manager: WeightManager, held: list[str], values: list[Any]) -> None:
    manager.release(held)
    values.clear()


def bind_payloads(model: ModelProto, resolved: ResolvedModel,
                  data: Mapping[str, memoryview], views: Mapping[str, memoryview],
                  where: Mapping[str, tuple[str, int]] | None = None,
                  spill: Callable[[memoryview], tuple[str, int]] | None = None, *,
                  handed: dict[str, np.ndarray] | None = None,
                  hand: Collection[str] = (), inline: bool = False) -> dict[str, memoryview]:
    """Point every live tensor of ``model`` whose payload is omitted at its bytes: its
    slot in a mapped data file (``where``: entry id -> file name and offset), else an
    in-memory file per manifest entry (main graph; written to a file through ``spill``
    when given) or inline (subgraphs, functions). Returns the in-memory files by name
    (caller buffers included, unless ``handed`` is given: then each main-graph tensor
    of a value in ``hand`` held by a caller buffer is put there, by name, as an array over
    that buffer, and the others are bound like bytes read here). ``inline``: what has no
    slot in ``where`` goes inline, in the main graph too (the model then needs no file
    but those ``where`` names)."""
    where = where or {}
    manifest = resolved.payload_manifest
    by_value = {v: e for e in manifest.entries if e.status == ACTIVE
                and e.origin not in STORE_ONLY for v in e.values}  # values, not packed forms
    files: dict[str, memoryview] = {}

    def value(name: str) -> np.ndarray:
        e = by_value.get(name)
        if e is None:
            raise LoadError("a derivation source is not in the manifest", source=name)
        return _array(e, name, data[e.id])

    recipes = {d.value: DerivedWeightRecipe(d.operation, d.sources, d.attributes)
               for d in manifest.derivations}
    derived = resolver(recipes, value)
    # onnxruntime's shape inference reads these while loading and refuses external data
    # (a package of another tool, or of an older weightstore, may hold them outside)
    shape_inputs = shape_input_names(model)
    _constants_to_initializers(model)
    sites = list(iter_tensor_sites(model))
    ambiguous = ambiguous_names(model, sites)  # as the closure keyed the manifest
    for site in sites:
        t = site.tensor
        name = site.value_key(ambiguous)
        if has_payload(t) or t.data_type == TensorProto.STRING:
            continue
        e = by_value.get(name)
        if e is not None and (site.value_name or t.name) in shape_inputs:
            _inline(t, data[e.id])
            continue
        if (e is not None and e.source.file in views and site.container is model.graph
                and (handed is None or name in hand)):
            if handed is not None:  # aligned as onnxruntime reads it (copied only if not)
                handed[t.name] = np.require(_array(e, name, data[e.id]), requirements="A")
            continue  # the caller's buffer under the model's own file name
        if e is not None and e.id in where:
            point_at(t, where[e.id][0], where[e.id][1], e.source.length)
            continue
        if e is not None:
            file, payload = MEMORY_PREFIX + e.id, data[e.id]
        elif name in recipes:
            array = np.ascontiguousarray(derived(name))
            file, payload = f"{MEMORY_PREFIX}derived-{len(files)}", memoryview(array).cast("B")
        elif t.data_location == TensorProto.EXTERNAL or any(t.dims):
            raise LoadError("a live weight has no manifest entry", initializer=name)
        else:
            continue
        if site.container is model.graph and spill is not None:
            point_at(t, *spill(payload), len(payload))
        elif site.container is model.graph and not inline:
            files[file] = payload
            point_at(t, file, 0, len(payload))
        else:  # onnxruntime takes in-memory external data for main-graph tensors only
            _inline(t, payload)
    if handed is None:
        files.update(views)
    return files


def _inline(tensor: TensorProto, payload: memoryview) -> None:
    tensor.ClearField("external_data")
    tensor.data_location = TensorProto.DEFAULT
    tensor.raw_data = bytes(payload)
