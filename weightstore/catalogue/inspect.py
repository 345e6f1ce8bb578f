"""``weightstore inspect``: every weight of a model, from metadata only."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from ..errors import ModelError
from ..io.onnx_proto import FunctionProto, ModelProto, TensorProto
from ..lazy import make_callable
from .descriptors import weight_descriptors
from .element_types import expected_nbytes
from .graphs import iter_containers
from .reader import read_catalogue


def inspect_model(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Descriptors and totals of the model at ``path``; no payload byte is read.

    Weights held by ``FileConstant`` nodes (ours, or GE's in any domain) are listed too,
    with role ``file-constant``: in a GE package they are the model's weights."""
    with read_catalogue(path) as catalogue:
        weights = [w.to_dict() for w in weight_descriptors(catalogue)]
        weights += _file_constants(catalogue.model)
        file_size = catalogue.file_size
        ir_version = catalogue.model.ir_version
        opsets = {o.domain or "ai.onnx": o.version for o in catalogue.model.opset_import}
    return {
        "model": os.fspath(path),
        "file_bytes": file_size,
        "ir_version": ir_version,
        "opsets": dict(sorted(opsets.items())),
        "weights": weights,
        "totals": _totals(weights),
    }


def _file_constants(model: ModelProto) -> list[dict[str, Any]]:
    """One entry per FileConstant node, from its attributes (a node holding GE's
    ``value`` tensor is listed by that tensor)."""
    from .file_constants import (
        attribute_text,
        file_constant_attributes,
        is_any_file_constant,
    )

    out = []
    for container, scope in iter_containers(model):
        for index, node in enumerate(container.node):
            if not is_any_file_constant(node):
                continue
            if any(a.name == "value" and a.HasField("t") for a in node.attribute):
                continue  # GE's value tensor: listed with the tensors already
            where = f"{scope} node {index} (FileConstant '{node.name}')"
            attrs = file_constant_attributes(node)
            try:
                dtype = int(attrs.get("dtype", 0))
                shape = [int(d) for d in attrs.get("shape", [])]
                offset = int(attrs.get("offset", 0))
                length = int(attrs["length"]) if "length" in attrs \
                    else expected_nbytes(dtype, shape) or 0
            except (TypeError, ValueError):
                raise ModelError("FileConstant offset, length, dtype or shape is not "
                                 "usable", where=where) from None
            location = attrs.get("location", attrs.get("file_path"))
            file_id = attrs.get("file_id")
            name = TensorProto.DataType.Name(dtype) \
                if dtype in TensorProto.DataType.values() else str(dtype)
            out.append({
                "name": node.output[0] if node.output else node.name, "dtype": name,
                "shape": shape, "bytes": length, "origin": "portable",
                "role": "file-constant", "where": where, "scope": [scope],
                "function": (f"{container.domain}:{container.name}"
                             if isinstance(container, FunctionProto) else None),
                "path": None,
                "payload": {
                    "file": attribute_text(location) if location is not None else None,
                    "offset": offset, "length": length, "encoding": "raw",
                    "location": attribute_text(location) if location is not None else "",
                    "checksum": attribute_text(file_id) if file_id is not None else None},
            })
    return out


def _totals(weights: list[dict[str, Any]]) -> dict[str, Any]:
    roles = Counter(w["role"] for w in weights)
    external = [w for w in weights if (w.get("payload") or {}).get("location") is not None]
    return {
        "tensors": len(weights),
        "bytes": sum(w["bytes"] for w in weights),
        "inline_bytes": sum(w["bytes"] for w in weights) - sum(w["bytes"] for w in external),
        "external_bytes": sum(w["bytes"] for w in external),
        "external_tensors": len(external),
        "empty_tensors": sum(1 for w in weights if w["bytes"] == 0 and w.get("payload")
                             and w["payload"]["encoding"] != "string_data"),
        "by_role": dict(sorted(roles.items())),
    }


def render_table(report: dict[str, Any]) -> str:
    rows = [("name", "dtype", "shape", "bytes", "role", "stored at", "where")]
    for w in report["weights"]:
        p = w.get("payload")
        if p is None:
            stored = "metadata"
        elif p["location"] is not None:
            stored = f"{_printable(p['location'])}@{p['offset']}+{p['length']}"
        elif p["offset"] is None:
            stored = f"inline {p['encoding']}"
        else:
            stored = f"inline {p['encoding']}@{p['offset']}+{p['length']}"
        rows.append((_printable(w["name"]), w["dtype"],
                     "x".join(map(str, w["shape"])) or "scalar", str(w["bytes"]), w["role"],
                     stored, _printable(w["where"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(r))
             for r in rows]
    t = report["totals"]
    lines.append(f"{t['tensors']} tensors, {t['bytes']} bytes ({t['inline_bytes']} inline, "
                 f"{t['external_bytes']} external in {t['external_tensors']} tensors, "
                 f"{t['empty_tensors']} empty); file {report['file_bytes']} bytes")
    return "\n".join(lines)


def _printable(text: str) -> str:
    """``text`` with control characters escaped, so a name holding a tab or a newline
    keeps to its cell of the table."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                   for c in text)


make_callable(__name__, "inspect_model")  # weightstore.inspect(path) is inspect_model
