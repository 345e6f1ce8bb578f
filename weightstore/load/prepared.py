"""A session from a prepared companion: onnxruntime maps packed weights from files.

onnxruntime uses serialized pre-packed weights only when it reads external data from
files itself (from memory, it packs again), so the verified bytes are written to one
private, 4096-aligned data file in a temporary folder, next to the companion graph whose
``location`` and ``prepacked_N`` entries are pointed at it. The folder is removed once the
session exists (onnxruntime has mapped what it needs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from ..catalogue.payload import external_info
from ..catalogue.sites import iter_tensor_sites
from ..errors import LoadError
from ..fsio import align_up, write_all
from ..resolve.model import ResolvedModel
from ..resolve.prepare import VALUE_PREFIX

ALIGN = 4096
DATA = "prepared.data"


def prepared_session(ort: Any, resolved: ResolvedModel, data: Mapping[str, memoryview],
                     providers: Sequence[str], session_options: Any) -> Any:
    assert resolved.prepared_graph is not None
    companion = onnx.load_from_string(resolved.prepared_graph)
    by_value: dict[str, memoryview] = {}
    by_key: dict[str, memoryview] = {}
    for e in resolved.payload_manifest.active:
        if e.id not in data:
            continue
        if e.source.store_key:
            by_key[e.source.store_key] = data[e.id]
        if e.origin == "prepared":
            continue  # a packed form, not the value itself
        for v in e.values:
            by_value.setdefault(v, data[e.id])
    tmp = Path(tempfile.mkdtemp(prefix="weightstore-load-"))
    try:
        fd = os.open(tmp / DATA, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            end = 0

            def put(view: memoryview) -> tuple[int, int]:
                nonlocal end
                offset = align_up(end, ALIGN)
                write_all(fd, view, offset)
                end = offset + len(view)
                return offset, len(view)

            for site in iter_tensor_sites(companion):
                t = site.tensor
                if t.data_location != onnx.TensorProto.EXTERNAL:
                    continue
                info = external_info(t)
                value = info.get("location", "").removeprefix(VALUE_PREFIX)
                own = by_value.get(value)
                if own is None:
                    raise LoadError("the prepared graph needs a weight the manifest lacks",
                                    initializer=value)
                offset, length = put(own)
                entries = [("location", DATA), ("offset", str(offset)),
                           ("length", str(length))]
                for k, v in info.items():
                    if k.startswith("prepacked"):
                        identity, _, key = v.partition("|")
                        if key not in by_key:
                            raise LoadError("a packed weight is not in the manifest",
                                            initializer=value, store_key=key)
                        p_off, p_len = put(by_key[key])
                        entries.append((k, f"{identity}|{p_off};{p_len};0"))
                del t.external_data[:]
                for k, v in entries:
                    item = t.external_data.add()
                    item.key, item.value = k, v
        finally:
            os.close(fd)
        (tmp / "prepared.onnx").write_bytes(companion.SerializeToString())
        options = session_options or ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        return ort.InferenceSession(str(tmp / "prepared.onnx"), options,
                                    providers=list(providers))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
