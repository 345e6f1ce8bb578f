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

Modules that only handle messages import the names below; the rest of onnx (helpers,
checker, shape inference, ``numpy_helper``) is imported inside the functions that call it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "onnx.onnx_ml_pb2"


def messages() -> ModuleType:
    """The module holding onnx's message classes, loaded once."""
    module = sys.modules.get(_NAME)
    if module is not None:
        return module
    spec = importlib.util.find_spec("onnx")  # locates the package without running it
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / "onnx_ml_pb2.py" for f in folders
                 if (Path(f) / "onnx_ml_pb2.py").is_file()), None)
    if path is None:
        import onnx

        return sys.modules.get(_NAME) or onnx.onnx_pb
    file_spec = importlib.util.spec_from_file_location(_NAME, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[_NAME] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
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

__all__ = ["AttributeProto", "FunctionProto", "GraphProto", "ModelProto", "NodeProto",
           "OperatorSetIdProto", "StringStringEntryProto", "TensorProto", "TypeProto",
           "ValueInfoProto", "messages"]
