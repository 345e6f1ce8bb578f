"""onnx's C++ checker, shape inference and operator schemas, without onnx's initialiser.

``onnx.checker``, ``onnx.shape_inference`` and ``onnx.defs`` are thin wrappers over onnx's
C++ extension, ``onnx.onnx_cpp2py_export``, which takes and returns serialized models.
Importing them runs ``onnx/__init__.py`` (numpy and ml_dtypes: half a second and more),
which none of the three needs. As :mod:`.onnx_proto` does for the message classes,
:func:`extension` loads that very extension under its own name and registers it in
``sys.modules``, so an ``import onnx`` later finds it loaded; when onnx was imported
first, its extension is used as it is. An install whose extension cannot be found this
way falls back to ``import onnx``.
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType

from .onnx_proto import ModelProto, load_submodule, onnx_folders

_NAME = "onnx.onnx_cpp2py_export"
MAXIMUM_PROTOBUF = 2**31  # what onnx.checker refuses to check from memory


def extension() -> ModuleType:
    """onnx's C++ extension module, loaded once."""
    module = sys.modules.get(_NAME)
    if module is not None:
        return module
    path = next((f / f"onnx_cpp2py_export{suffix}" for f in onnx_folders()
                 for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if (f / f"onnx_cpp2py_export{suffix}").is_file()), None)
    if path is None:
        import onnx.onnx_cpp2py_export as found

        return found
    return load_submodule(_NAME, path)


def validation_error() -> type[Exception]:
    """``onnx.checker.ValidationError``."""
    return extension().checker.ValidationError


def check_model(model: ModelProto) -> None:
    """``onnx.checker.check_model(model)``: raises :func:`validation_error`'s class."""
    data = model.SerializeToString()
    if len(data) > MAXIMUM_PROTOBUF:
        raise ValueError("a model of more than 2 GiB is checked from its file")
    extension().checker.check_model(data, False, False, False)


def infer_shapes(model: ModelProto, *, data_prop: bool = False) -> ModelProto:
    """``onnx.shape_inference.infer_shapes(model, data_prop=...)``."""
    inferred = extension().shape_inference.infer_shapes(
        model.SerializeToString(), False, False, data_prop)
    return ModelProto.FromString(inferred)


def has_schema(op_type: str, domain: str = "") -> bool:
    """``onnx.defs.has(op_type, domain)``: does onnx define this operator?"""
    return bool(extension().defs.has_schema(op_type, domain))


__all__ = ["MAXIMUM_PROTOBUF", "check_model", "extension", "has_schema", "infer_shapes",
           "validation_error"]
