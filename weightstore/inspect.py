"""``weightstore inspect``: every weight of a model, from metadata only."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from .catalogue.descriptors import WeightDescriptor, weight_descriptors
from .catalogue.reader import read_catalogue
from .lazy import make_callable


def inspect_model(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Descriptors and totals of the model at ``path``; no payload byte is read."""
    with read_catalogue(path) as catalogue:
        weights = weight_descriptors(catalogue)
        file_size = catalogue.file_size
        ir_version = catalogue.model.ir_version
        opsets = {o.domain or "ai.onnx": o.version for o in catalogue.model.opset_import}
    return {
        "model": os.fspath(path),
        "file_bytes": file_size,
        "ir_version": ir_version,
        "opsets": dict(sorted(opsets.items())),
        "weights": [w.to_dict() for w in weights],
        "totals": _totals(weights),
    }


def _totals(weights: list[WeightDescriptor]) -> dict[str, Any]:
    roles = Counter(w.role for w in weights)
    return {
        "tensors": len(weights),
        "bytes": sum(w.nbytes for w in weights),
        "inline_bytes": sum(w.nbytes for w in weights if not w.is_external),
        "external_bytes": sum(w.nbytes for w in weights if w.is_external),
        "external_tensors": sum(1 for w in weights if w.is_external),
        "empty_tensors": sum(1 for w in weights if w.is_empty),
        "by_role": dict(sorted(roles.items())),
    }


def render_table(report: dict[str, Any]) -> str:
    rows = [("name", "dtype", "shape", "bytes", "role", "stored at", "where")]
    for w in report["weights"]:
        p = w.get("payload")
        if p is None:
            stored = "metadata"
        elif p["location"] is not None:
            stored = f"{p['location']}@{p['offset']}+{p['length']}"
        else:
            stored = f"inline {p['encoding']}@{p['offset']}+{p['length']}"
        rows.append((w["name"], w["dtype"], "x".join(map(str, w["shape"])) or "scalar",
                     str(w["bytes"]), w["role"], stored, w["where"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(r))
             for r in rows]
    t = report["totals"]
    lines.append(f"{t['tensors']} tensors, {t['bytes']} bytes ({t['inline_bytes']} inline, "
                 f"{t['external_bytes']} external in {t['external_tensors']} tensors, "
                 f"{t['empty_tensors']} empty); file {report['file_bytes']} bytes")
    return "\n".join(lines)


make_callable(__name__, "inspect_model")  # weightstore.inspect(path) is inspect_model
