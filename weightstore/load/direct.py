"""The direct load: onnxruntime reads the package's own files, verified as it goes.

When the live payloads that are no plain (``raw``) byte range of a regular file in the
model's folder are small (at most :data:`INLINE_LIMIT` bytes in all: Constant values in
typed fields, shape inputs, a few weights only the store holds), the model handed to
onnxruntime points its tensors at those ranges, where onnxruntime maps or reads them
itself, and carries the few others inline. Nothing is copied into a data file of the
load's own.

Every range is verified against its checksum on a second thread while onnxruntime
creates the session; the session is handed over only when both are done. A range that
fails, a file that cannot be read or that changed while the load ran (its identity
before and after differ), or a model onnxruntime refuses gives the direct load up (the
session, if any, is dropped unused): the load through private data files
(:mod:`.session`) then reads everything again and fails, or falls back to dormant
payloads, naming what failed. A load that succeeds records its session plan
(:mod:`.plans`) when its files are settled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..catalogue.shape_inputs import shape_input_names
from ..errors import LoadError, WeightstoreError
from ..io.digests import ALGORITHMS, new_hasher
from ..io.identity import identity_of, settled
from ..resolve.files import folder_file
from ..resolve.manifest import STORE_ONLY, ManifestEntry
from .manager import WeightManager
from .plans import SessionPlan, keep_plan, plan_session
from .reader import FileReader, Reader
from .runtime import LoadReport

if TYPE_CHECKING:
    import onnx

    from ..resolve.model import ResolvedModel

INLINE_LIMIT = 8 << 20  # bytes of live payloads carried inline in the model handed over
BLOCK = 4 << 20  # bytes: each range is read and hashed through a buffer this big


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


class _Verifier(threading.Thread):
    """Verifies ranges of files in the background; ``failed`` says whether any did not
    match its checksum or could not be read."""

    def __init__(self, entries: Sequence[ManifestEntry], paths: Sequence[Path],
                 reader: Reader) -> None:
        super().__init__(name="weightstore-verify", daemon=True)
        self.entries, self.paths, self.reader = entries, paths, reader
        self.failed = False
        self.read = 0

    def run(self) -> None:
        buffer = memoryview(bytearray(BLOCK))
        try:
            for entry, path in zip(self.entries, self.paths, strict=True):
                if not self._check(entry, path, buffer):
                    self.failed = True
                    return
        except (OSError, WeightstoreError):
            self.failed = True

    def _check(self, entry: ManifestEntry, path: Path, buffer: memoryview) -> bool:
        algo, _, expected = (entry.source.checksum or "").partition(":")
        hasher = new_hasher(algo, threads=False) if algo in ALGORITHMS else None
        offset, left = entry.source.offset, entry.source.length
        while left:
            view = buffer[:min(left, BLOCK)]
            self.reader.read_into(path, offset, view)
            if hasher is not None:
                hasher.update(view)
            offset += len(view)
            left -= len(view)
            self.read += len(view)
        return hasher is None or hasher.hexdigest() == expected


def direct_session(ort: Any, resolved: ResolvedModel, model: onnx.ModelProto, *,
                   reader: Reader | None, jobs: int, providers: Sequence[str],
                   session_options: Any, report: LoadReport,
                   plan_key: str | None) -> Any | None:
    """The session of ``resolved`` (``model``: its frozen graph, ours to change) reading
    the package's files in place; None when the load cannot be or was not direct."""
    from .session import bind_payloads, read_active

    where = direct_ranges(resolved)
    if where is None:
        return None
    manifest = resolved.payload_manifest
    root = resolved.source.folder.resolve()  # type: ignore[union-attr]
    needed = shape_input_names(model) | {s for d in manifest.derivations for s in d.sources}
    in_memory = {e.id for e in manifest.active if e.id not in where or needed & set(e.values)}
    files = sorted({name for name, _ in where.values()})
    own_reader = reader is None
    reader = reader or FileReader()
    mine = LoadReport()  # the caller's report learns of this load only if it succeeds
    try:
        before = {name: os.stat(root / name) for name in files}
        active = read_active(resolved, buffers={}, reader=reader, jobs=jobs,
                             manager=WeightManager(), report=mine, only=in_memory)
        todo = [e for e in manifest.active if e.id not in in_memory]
        verifier = _Verifier(todo, [root / where[e.id][0] for e in todo], reader)
        verifier.start()
        session = None
        try:
            bind_payloads(model, resolved, active.data, {}, where, inline=True)
            plan = SessionPlan(model.SerializeToString(), str(root), ())
            try:
                session = plan_session(ort, plan, session_options, providers, mine,
                                       model=str(resolved.source.path))
            except LoadError:
                session = None
        finally:
            verifier.join()
        after = {name: os.stat(root / name) for name in files}
        if verifier.failed or session is None or any(
                identity_of(before[n]) != identity_of(after[n]) for n in files):
            return None  # a file changed meanwhile: what onnxruntime read may not be
            # what was verified

    except (OSError, WeightstoreError):
        return None
    finally:
        if own_reader:
            reader.close()  # type: ignore[attr-defined]
    report.read_bytes += mine.read_bytes + verifier.read
    report.verified_bytes += mine.read_bytes + verifier.read
    report.entries_read += mine.entries_read + len(todo)
    report.live_bytes = manifest.active_bytes
    report.runtime_seconds += mine.runtime_seconds
    if all(settled(after[n]) for n in files):
        keep_plan(plan_key, SessionPlan(plan.model, plan.folder, tuple(
            (n, identity_of(after[n])) for n in files), manifest.active_bytes))
    return session
