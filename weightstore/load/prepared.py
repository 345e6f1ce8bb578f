"""A session from a prepared companion: onnxruntime maps packed weights from a file.

onnxruntime uses serialized pre-packed weights only when it reads external data from
files itself (from memory, it packs again). So the active entries are read straight into
one private file, memory-mapped, in a temporary folder (on ``/dev/shm`` where there is
one): each coalesced run lands at a 4096-aligned slot, checksums are verified from the
mapping, and the companion graph's ``location`` and ``prepacked_N`` entries are pointed at
the slots. onnxruntime then maps the same pages: the bytes are in memory once. The folder
is removed once the session exists.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from ..catalogue.payload import external_info
from ..catalogue.sites import iter_tensor_sites
from ..errors import LoadError
from ..fsio import align_up
from ..resolve.model import ResolvedModel
from ..resolve.prepare import VALUE_PREFIX
from .executor import execute
from .plan import plan_reads
from .reader import FileReader, Reader
from .session import point_at

ALIGN = 4096
DATA = "prepared.data"
SHM = Path("/dev/shm")


def _temp_dir() -> Path:
    parent = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="weightstore-load-", dir=parent))


def prepared_session(ort: Any, resolved: ResolvedModel, *, reader: Reader | None, jobs: int,
                     report: Any, providers: Sequence[str], session_options: Any) -> Any:
    """The session, or None when a packed payload failed its checksum (the caller then
    loads the portable weights)."""
    assert resolved.prepared_graph is not None
    manifest = resolved.payload_manifest
    entries = {e.id: e for e in manifest.entries}
    active = list(manifest.active)
    plan = plan_reads(active, resolved.source.folder, resolved.source.path,
                      store=resolved.source.store)
    slots, end = [], 0
    for run in plan.runs:
        slots.append(align_up(end, ALIGN))
        end = slots[-1] + run.length
    tmp = _temp_dir()
    own_reader = reader is None
    reader = reader or FileReader()
    try:
        fd = os.open(tmp / DATA, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(end, 1))
            if hasattr(os, "posix_fallocate"):  # pages allocated in one call, not per fault
                os.posix_fallocate(fd, 0, max(end, 1))
            mapped = mmap.mmap(fd, max(end, 1))
        finally:
            os.close(fd)
        try:
            view = memoryview(mapped)
            result = execute(plan, entries, reader, jobs=jobs, scenario=resolved.selected_scenario,
                             tolerate=resolved.tolerated_failures,
                             run_buffers=[view[s:s + r.length] for s, r in zip(
                                 slots, plan.runs, strict=True)])
            report.read_bytes += plan.read_bytes
            report.entries_read += len(active)
            report.live_bytes = manifest.active_bytes
            report.fell_back.update(result.fell_back)
            del result
            view.release()
        finally:
            mapped.close()
        if any(e.id in report.fell_back for e in active):
            return None
        where = {e: slots[i] + off for i, run in enumerate(plan.runs)
                 for e, off, _ in run.entries}
        companion = _point(onnx.load_from_string(resolved.prepared_graph), manifest, where)
        (tmp / "prepared.onnx").write_bytes(companion.SerializeToString())
        options = session_options or ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        return ort.InferenceSession(str(tmp / "prepared.onnx"), options,
                                    providers=list(providers))
    finally:
        if own_reader:
            reader.close()  # type: ignore[union-attr]
        shutil.rmtree(tmp, ignore_errors=True)


def _point(companion: onnx.ModelProto, manifest: Any, where: dict[str, int],
           ) -> onnx.ModelProto:
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
        if t.data_location != onnx.TensorProto.EXTERNAL:
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
        point_at(t, DATA, offset, length, packed)
    return companion
