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

from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import Message

from ..catalogue.graphs import iter_nodes
from ..catalogue.reader import Catalogue
from ..catalogue.schema import CHILDREN, Kind, path_str
from ..catalogue.schema import Path as TensorPath
from ..io.digests import ALGORITHMS
from ..io.onnx_proto import NodeProto, TensorProto
from .encoding import set_external
from .file_constant import (
    OP_TYPE,
    attribute_text,
    drop_unused_domain,
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
    if not any(node.op_type == OP_TYPE for node in iter_nodes(model)):
        return 0  # the common case, told by the quicker walk
    found = [(node, path, where) for node, path, where in _nodes(model, Kind.MODEL, (), "")
             if node.op_type == OP_TYPE]
    for node, path, where in found:
        where = f"{where} node {path[-1][1]} ({OP_TYPE} '{node.name}')"
        attrs = file_constant_attributes(node)
        value = attrs.get("value")
        held = None  # a GE value tensor holding its bytes: they stay where they are
        if isinstance(value, TensorProto) and value.data_location != value.EXTERNAL:
            index = next(i for i, a in enumerate(node.attribute) if a.name == "value")
            held = (*path, (5, index), (5, 0))
            tensor = TensorProto()
            tensor.CopyFrom(value)
        else:
            tensor = tensor_of(attrs, node, where)
            _point_at_file(tensor, attrs, base_dir, where)
        to_constant(node, attrs, tensor)
        value_path = (*path, (5, 0), (5, 0))  # the Constant's only attribute is its value
        if held is not None and held in catalogue.payloads:
            catalogue.payloads[value_path] = catalogue.payloads.pop(held)
        encoding = attribute_text(attrs.get("encoding", b"raw_data"))
        if encoding != "raw_data":
            encodings[path_str(value_path)] = encoding
    if found:
        drop_unused_domain(model)
    return len(found)


def _nodes(msg: Message, kind: Kind, path: TensorPath, where: str,
           ) -> Iterator[tuple[NodeProto, TensorPath, str]]:
    """Every node below ``msg`` with its structural path and its graph or function."""
    for number, (child_kind, repeated) in CHILDREN[kind].items():
        if child_kind in (Kind.TENSOR, Kind.SPARSE):
            continue
        field = msg.DESCRIPTOR.fields_by_number[number].name
        values = list(getattr(msg, field)) if repeated else \
            [getattr(msg, field)] if msg.HasField(field) else []
        for i, value in enumerate(values):
            sub = (*path, (number, i))
            inner = where
            if child_kind is Kind.GRAPH:
                inner = f"graph '{value.name}'"
            elif child_kind is Kind.FUNCTION:
                inner = f"function {value.domain}:{value.name}"
            if child_kind is Kind.NODE:
                yield value, sub, where
            yield from _nodes(value, child_kind, sub, inner)


def _point_at_file(tensor: TensorProto, attrs: dict[str, object], base_dir: Path,
                   where: str) -> None:
    """Make ``tensor`` external data at the FileConstant's file range (GE's order of
    attributes naming the file; a ``file_id`` digest becomes the checksum to verify)."""
    _, named = file_constant_file(attrs, base_dir, None, where)
    offset, length = file_constant_range(attrs, where)
    file_id = attribute_text(attrs.get("file_id") or "")
    algo, sep, _ = file_id.partition(":")
    location = named.get("location") or named["file_path"]
    set_external(tensor, location, offset, length)
    if sep and algo in ALGORITHMS:  # in memory only: the folded tensor is written anew
        tensor.external_data.add(key="checksum", value=file_id)
