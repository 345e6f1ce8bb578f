"""Recognizing FileConstant nodes and reading their attributes, from metadata alone.

A FileConstant node names a weight held in a file (GE's form; weightstore writes its own
in the ``weightstore`` domain). Which nodes are FileConstants and what their attributes
say is metadata every reader needs (``inspect``, scenario resolution, the load); writing
and rewriting them is :mod:`weightstore.convert.file_constant`'s.
"""

from __future__ import annotations

from ..io.onnx_proto import NodeProto, TensorProto, attribute_value
from .payload import external_entries

DOMAIN = "weightstore"
OP_TYPE = "FileConstant"
OPSET_VERSION = 1


def is_file_constant(node: NodeProto) -> bool:
    return node.op_type == OP_TYPE and node.domain == DOMAIN


def is_any_file_constant(node: NodeProto) -> bool:
    """Ours, or one another tool wrote (GE's are ``FileConstant`` in its own domain or
    the default one): the reverse conversion takes every one of them."""
    return node.op_type == OP_TYPE


def attribute_text(value: object) -> str:
    """An attribute's string value (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def file_constant_attributes(node: NodeProto) -> dict[str, object]:
    """A FileConstant node's attributes, with GE's ONNX form folded in: GE's parser takes
    ``dtype``, ``shape`` and ``location``/``offset``/``length`` from a ``value`` tensor
    with external data; attributes set on the node itself win."""
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    value = attrs.get("value")
    if isinstance(value, TensorProto):
        attrs.setdefault("dtype", value.data_type)
        attrs.setdefault("shape", list(value.dims))
        if len(value.external_data):
            info = external_entries(value, f"FileConstant {node.name!r}")
            for key, field in (("location", info.location), ("offset", info.offset),
                               ("length", info.length)):
                if field is not None:
                    attrs.setdefault(key, field)
    return attrs
