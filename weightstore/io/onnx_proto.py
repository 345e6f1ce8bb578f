"""onnx's protobuf message classes, without onnx's package initialiser.

``import onnx`` runs ``onnx/__init__.py``, which loads its C++ extension, numpy and
ml_dtypes: most of a second on some installs, longer than converting a 90 MB model. A build
needs only the message classes (``ModelProto``, ``TensorProto``, ...), which live in the
protoc-generated module ``onnx.onnx_ml_pb2``; that module imports nothing but protobuf.

:func:`messages` loads that very file under its own name, ``onnx.onnx_ml_pb2``, and
registers it in ``sys.modules``. The classes are therefore onnx's own: when ``onnx`` is
imported later (a check, a conversion that needs ``onnx.helper``), its ``onnx_pb`` finds
the module already loaded and re-exports the same classes, so ``onnx.ModelProto is
ModelProto`` either way and the descriptor is registered once. When onnx was imported
first, its module is used as it is. One trace remains when onnx comes second: the package
attribute ``onnx.onnx_ml_pb2`` is not set (the import system binds it only when it loads
the submodule itself); ``from onnx import onnx_ml_pb2`` and every class onnx exports are
unaffected. An onnx built without ONNX-ML types (no
``onnx_ml_pb2.py``, never the case for PyPI wheels) falls back to ``import onnx``.

Modules that only handle messages import the names below, parse a model's bytes with
:func:`parse_model` (``onnx.load_model_from_string``) and a model file's with
:func:`read_model`, and build nodes with
:func:`make_node` (``onnx.helper.make_node``'s messages, byte for byte, without
``onnx.helper``, whose import loads numpy and ml_dtypes); arrays are
:mod:`.onnx_arrays`', the checker and shape inference :mod:`.onnx_native`'s. What else
needs onnx imports it inside the functions that call it.
"""

from __future__ import annotations

import importlib.util
import numbers
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

_NAME = "onnx.onnx_ml_pb2"


def onnx_folders() -> list[Path]:
    """The folders of onnx's package, found without running its initialiser."""
    spec = importlib.util.find_spec("onnx")
    return [Path(f) for f in (spec.submodule_search_locations or [])] if spec else []


def messages() -> ModuleType:
    """The module holding onnx's message classes, loaded once."""
    module = sys.modules.get(_NAME)
    if module is not None:
        return module
    path = next((f / "onnx_ml_pb2.py" for f in onnx_folders()
                 if (f / "onnx_ml_pb2.py").is_file()), None)
    if path is None:
        import onnx

        return sys.modules.get(_NAME) or onnx.onnx_pb
    return load_submodule(_NAME, path)


def load_submodule(name: str, path: Path) -> ModuleType:
    """The module of file ``path`` loaded as onnx's ``name`` and registered in
    ``sys.modules``, without running the package's initialiser."""
    file_spec = importlib.util.spec_from_file_location(name, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[name] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_pb = messages()

AttributeProto = _pb.AttributeProto
FunctionProto = _pb.FunctionProto
GraphProto = _pb.GraphProto
ModelProto = _pb.ModelProto
NodeProto = _pb.NodeProto
OperatorSetIdProto = _pb.OperatorSetIdProto
StringStringEntryProto = _pb.StringStringEntryProto
TensorProto = _pb.TensorProto
TypeProto = _pb.TypeProto
ValueInfoProto = _pb.ValueInfoProto

SparseTensorProto = _pb.SparseTensorProto


def parse_model(data: bytes) -> ModelProto:
    """``onnx.load_model_from_string(data)``: the model the bytes hold, every byte
    consumed."""
    if not isinstance(data, bytes):
        raise TypeError(f"Parameter 'serialized' must be bytes, but got type: {type(data)}")
    model = ModelProto()
    decoded = model.ParseFromString(data)
    if decoded is not None and decoded != len(data):
        from google.protobuf.message import DecodeError

        raise DecodeError(f"Protobuf decoding consumed too few bytes: {decoded} out of "
                          f"{len(data)}")
    return model


def read_model(path: str | Path) -> ModelProto:
    """``onnx.load(path, load_external_data=False)``: the model file parsed, its
    external data left unread."""
    return parse_model(Path(path).read_bytes())


_LISTS = ((numbers.Integral, AttributeProto.INTS, "ints"),
          (numbers.Real, AttributeProto.FLOATS, "floats"),
          ((str, bytes), AttributeProto.STRINGS, "strings"),
          (TensorProto, AttributeProto.TENSORS, "tensors"),
          (SparseTensorProto, AttributeProto.SPARSE_TENSORS, "sparse_tensors"),
          (GraphProto, AttributeProto.GRAPHS, "graphs"),
          (TypeProto, AttributeProto.TYPE_PROTOS, "type_protos"))
_MESSAGES = ((TensorProto, AttributeProto.TENSOR, "t"),
             (SparseTensorProto, AttributeProto.SPARSE_TENSOR, "sparse_tensor"),
             (GraphProto, AttributeProto.GRAPH, "g"),
             (TypeProto, AttributeProto.TYPE_PROTO, "tp"))


def _utf8(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def make_attribute(key: str, value: Any, doc_string: str | None = None,
                   attr_type: int | None = None) -> AttributeProto:
    """``onnx.helper.make_attribute(key, value, doc_string, attr_type)``: the type inferred
    from the value, or ``attr_type`` (which an empty list needs)."""
    attr = AttributeProto(name=key)
    if doc_string:
        attr.doc_string = doc_string
    if isinstance(value, numbers.Integral):
        attr.i, attr.type = int(value), AttributeProto.INT
    elif isinstance(value, numbers.Real):
        attr.f, attr.type = float(value), AttributeProto.FLOAT
    elif isinstance(value, (str, bytes)):
        attr.s, attr.type = _utf8(value), AttributeProto.STRING
    elif message := next((m for m in _MESSAGES if isinstance(value, m[0])), None):
        getattr(attr, message[2]).CopyFrom(value)
        attr.type = message[1]
    elif isinstance(value, Iterable):
        values = list(value)
        kinds = {type(v) for v in values}
        found = next((m for m in _LISTS if (m[1] == attr_type if attr_type is not None else
                                            values and all(issubclass(t, m[0]) for t in kinds))),
                     None)
        if found is None:
            raise ValueError(f"cannot infer the type of attribute '{key}' from its values")
        _, attr.type, field = found
        getattr(attr, field).extend([_utf8(v) for v in values] if field == "strings"
                                    else values)
    else:
        raise TypeError(f"{value!r} is not an accepted attribute value")
    if attr_type is not None and attr.type != attr_type:
        raise TypeError(f"attribute '{key}' is of type {attr.type}, not {attr_type}")
    return attr


def make_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
              name: str | None = None, doc_string: str | None = None,
              domain: str | None = None, overload: str | None = None,
              **attributes: Any) -> NodeProto:
    """``onnx.helper.make_node``, its parameters in its order: attributes sorted by name,
    None values left out."""
    node = NodeProto(op_type=op_type, input=inputs, output=outputs)
    if name:
        node.name = name
    if doc_string:
        node.doc_string = doc_string
    if domain is not None:
        node.domain = domain
    if overload is not None:
        node.overload = overload
    node.attribute.extend(make_attribute(k, v) for k, v in sorted(attributes.items())
                          if v is not None)
    return node


_VALUES = {AttributeProto.FLOAT: "f", AttributeProto.INT: "i", AttributeProto.STRING: "s",
           **{kind: field for _, kind, field in _MESSAGES}}


def attribute_value(attr: AttributeProto) -> Any:
    """``onnx.helper.get_attribute_value``: the value (lists as lists), None when
    undefined."""
    if attr.ref_attr_name:
        raise ValueError(f"cannot get the value of reference attribute '{attr.name}'")
    if attr.type in _VALUES:
        return getattr(attr, _VALUES[attr.type])
    field = next((f for _, kind, f in _LISTS if kind == attr.type), None)
    if field is not None:
        return list(getattr(attr, field))
    if attr.type == AttributeProto.UNDEFINED:
        return None
    raise ValueError(f"unsupported attribute type {attr.type} of '{attr.name}'")


__all__ = ["AttributeProto", "FunctionProto", "GraphProto", "ModelProto", "NodeProto",
           "OperatorSetIdProto", "SparseTensorProto", "StringStringEntryProto", "TensorProto",
           "TypeProto", "ValueInfoProto", "attribute_value", "load_submodule", "make_attribute",
           "make_node", "messages", "onnx_folders", "parse_model", "read_model"]
