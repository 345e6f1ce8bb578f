"""The direct load: onnxruntime reads the package's own files, verified as it goes.

When the live payloads that are no plain (``raw``) byte range of a regular file in the
model's folder are small (at most :data:`INLINE_LIMIT` bytes in all: Constant values in
typed fields, shape inputs, a few weights only the store holds), the model handed to
onnxruntime points its tensors at those ranges, where onnxruntime maps or reads them
itself, and carries the few others inline. Nothing is copied into a data file of the
load's own.

Every range of a package file the load uses is verified against its digest, read
through the descriptors the load opened, on a second thread while onnxruntime creates the
session, and the session is handed over only when each range matched and each path still
names the file the load opened (:mod:`.pinned`). A range that fails, a file that cannot
be read or that changed while the load ran, or a model onnxruntime refuses gives the
direct load up (the session, if any, is dropped unused): the load through private data
files (:mod:`.session`) then reads everything again and fails, or falls back to dormant
payloads, naming what failed. A load that succeeds records its session plan
(:mod:`.plans`): every later load of it verifies the same ranges again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..catalogue.shape_inputs import shape_input_names
from ..errors import LoadError, WeightstoreError
from ..resolve.files import folder_file
from ..resolve.manifest import STORE_ONLY
from .manager import WeightManager
from .pinned import Range, file_ranges
from .plans import SessionPlan, keep_plan, plan_session
from .reader import Reader
from .runtime import LoadReport

if TYPE_CHECKING:
    from ..io.onnx_proto import ModelProto
    from ..resolve.model import ResolvedModel

INLINE_LIMIT = 8 << 20  # bytes of live payloads carried inline in the model handed over


def direct_ranges(resolved: ResolvedModel) -> dict[str, tuple[str, int]] | None:
    """Active entry id -> (file relative to the model's folder, offset) for every entry
    that is a plain range of a regular file there; None when the load cannot be direct
    (no folder, or more than :data:`INLINE_LIMIT` bytes that are no such range)."""
    src = resolved.source
    if src.folder is None:
        return None
    root = src.folder.resolve()
    where: dict[str, tuple[str, int]] = {}
    rest = 0
    for e in resolved.payload_manifest.active:
        path = None
        if e.source.file and e.source.encoding == "raw" and e.origin not in STORE_ONLY:
            try:
                path = folder_file(src.folder, e.source.file, where=e.values[0],
                                   package=src.package is not None)
            except (WeightstoreError, OSError, ValueError):
                path = None  # the load through data files names the problem
        if path is None:
            rest += e.source.length
            continue
        try:
            where[e.id] = (path.relative_to(root).as_posix(), e.source.offset)
        except ValueError:
            rest += e.source.length
    return None if rest > INLINE_LIMIT else where


def direct_session(ort: Any, resolved: ResolvedModel, model: ModelProto, *,
                   reader: Reader | None, jobs: int, providers: Sequence[str],
                   session_options: Any, report: LoadReport,
                   plan_key: str | None) -> Any | None:
    """The session of ``resolved`` (``model``: its frozen graph, ours to change) reading
    the package's files in place; None when the load cannot be or was not direct."""
    from .session import bind_payloads, declared_file_sha1, read_active

    where = direct_ranges(resolved)
    if where is None:
        return None
    manifest = resolved.payload_manifest
    root = resolved.source.folder.resolve()  # type: ignore[union-attr]
    sha1 = declared_file_sha1(model, root)
    needed = shape_input_names(model) | {s for d in manifest.derivations for s in d.sources}
    in_memory = {e.id for e in manifest.active if e.id not in where or needed & set(e.values)}
    # every range of a package file the load uses, with its digest: verified on this load
    # and on every load of the plan kept for later processes, inlined ones included
    checked = {e.id: Range(where[e.id][0], e.source.offset, e.source.length,
                           e.source.checksum)
               for e in manifest.active if e.id in where and e.source.checksum}
    ranges = list(checked.values())
    inline = {checked[i] for i in in_memory if i in checked}  # read and verified below
    ranges += file_ranges({name: digest for name, digest in sha1.items()
                           if name in {f for f, _ in where.values()}})
    files = sorted({name for name, _ in where.values()})
    mine = LoadReport()  # the caller's report learns of this load only if it succeeds
    try:
        active = read_active(resolved, buffers={}, reader=reader, jobs=jobs,
                             manager=WeightManager(), report=mine, only=in_memory)
        bind_payloads(model, resolved, active.data, {}, where, inline=True)
        plan = SessionPlan(model.SerializeToString(), str(root), tuple(files), tuple(ranges),
                           manifest.active_bytes)
        try:
            session = plan_session(ort, plan, session_options, providers, mine,
                                   model=str(resolved.source.path), reader=reader,
                                   verified=inline)
        except LoadError:
            session = None
    except (OSError, WeightstoreError):
        return None
    if session is None:
        report.not_in_place = mine.not_in_place
        return None
    report.read_bytes += mine.read_bytes
    report.verified_bytes += mine.verified_bytes
    report.entries_read += mine.entries_read + len(ranges)
    report.live_bytes = manifest.active_bytes
    report.runtime_seconds += mine.runtime_seconds
    keep_plan(plan_key, plan)
    return session
