"""A source model's weights in the one shape the writers take: tensors, inline or external.

Two things a source can hold make it differ from a plain model; ``ModelWeights.open``
folds both into the catalogued metadata before any weight is selected:

* the typed encodings an earlier conversion recorded in ``metadata_props``
  (:func:`~.external_data.recorded_encodings`): its external tensors keep them, whichever
  form they are written in next, and the entry is rewritten for the output;
* ``FileConstant`` nodes (ours, or GE's; here): each becomes, in place, a ``Constant`` node whose
  value is external data at the node's file range, so its payload is hashed, verified
  against a ``file_id`` digest, placed or inlined like any other, and never left pointing
  at a file outside the output's folder. The node keeps its index, so no other tensor's
  structural path moves; a weight that was an initializer before it became a
  FileConstant comes back as a Constant node, which runtimes treat alike.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ..catalogue.graphs import iter_containers
from ..catalogue.reader import Catalogue
from ..catalogue.sites import iter_tensor_sites
from ..hashing import ALGORITHMS
from .encoding import set_external
from .file_constant import (
    OP_TYPE,
    attribute_text,
    drop_domain,
    file_constant_attributes,
    tensor_of,
    to_constant,
)
from .inline import file_constant_file, file_constant_range


def file_constants_as_external(catalogue: Catalogue, base_dir: Path,
                               encodings: dict[str, str]) -> int:
    """Turn every FileConstant node of the catalogued model into a Constant node holding
    external data (mutates the metadata model, records typed encodings in
    ``encodings``); returns how many were turned."""
    model = catalogue.model
    # a GE value tensor held inline: its payload moves from attribute k to attribute 0
    inline_values = {id(site.tensor): site.path for site in iter_tensor_sites(model)
                     if site.node is not None and site.node.op_type == OP_TYPE
                     and site.path in catalogue.payloads}
    made: list[tuple[onnx.TensorProto, str]] = []
    for container, scope in iter_containers(model):
        for index, node in enumerate(container.node):
            if node.op_type != OP_TYPE:
                continue
            where = f"{scope} node {index} ({OP_TYPE} '{node.name}')"
            attrs = file_constant_attributes(node)
            value = attrs.get("value")
            moved = None
            if isinstance(value, onnx.TensorProto) and value.data_location != value.EXTERNAL:
                attribute = next(a for a in node.attribute if a.name == "value")
                moved = inline_values.get(id(attribute.t))
                tensor = onnx.TensorProto()
                tensor.CopyFrom(attribute.t)
            else:
                tensor = tensor_of(attrs, node, where)
                _point_at_file(tensor, attrs, base_dir, where)
            encoding = attribute_text(attrs.get("encoding", b"raw_data"))
            made.append((to_constant(node, attrs, tensor), encoding))
            if moved is not None:
                new = (*moved[:-2], (5, 0), (5, 0))
                catalogue.payloads[new] = catalogue.payloads.pop(moved)
    if made:
        drop_domain(model.opset_import)
        for function in model.functions:
            drop_domain(function.opset_import)
        typed = {id(t): e for t, e in made if e != "raw_data"}
        for site in iter_tensor_sites(model):
            if id(site.tensor) in typed:
                encodings[site.key] = typed[id(site.tensor)]
    return len(made)


def _point_at_file(tensor: onnx.TensorProto, attrs: dict[str, object], base_dir: Path,
                   where: str) -> None:
    """Make ``tensor`` external data at the FileConstant's file range (GE's order of
    attributes naming the file; a ``file_id`` digest becomes the checksum to verify)."""
    _, named = file_constant_file(attrs, base_dir, {}, where)
    offset, length = file_constant_range(attrs, where)
    file_id = attribute_text(attrs.get("file_id") or "")
    algo, sep, _ = file_id.partition(":")
    checksum = file_id if sep and algo in ALGORITHMS else ""
    location = named.get("location") or named["file_path"]
    set_external(tensor, location, offset, length, checksum)
