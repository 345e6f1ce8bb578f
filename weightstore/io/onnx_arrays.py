"""Tensors as numpy arrays and back, as ``onnx.numpy_helper`` makes them, without onnx's
initialiser.

``onnx.numpy_helper`` and ``onnx.helper`` import ml_dtypes (half a second and more) for
the types numpy lacks (bfloat16, the 8-, 6-, 4- and 2-bit ones). The passes and their
derived payloads mostly handle numpy's own types (float32 weights, int64 shapes, uint8
quantized blocks): for those, :func:`to_array`, :func:`from_array` and :func:`np_dtype`
give what onnx's functions give, byte for byte (a test compares them type by type), with
numpy alone. Any other type, strings, a segment or external data are handed to onnx's
own functions, which then import onnx.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .onnx_proto import TensorProto

if TYPE_CHECKING:
    import numpy as np

T = TensorProto
# numpy's own types: data type -> (numpy type, the typed field its values live in)
_NATIVE = {T.FLOAT: ("float32", "float_data"), T.UINT8: ("uint8", "int32_data"),
           T.INT8: ("int8", "int32_data"), T.UINT16: ("uint16", "int32_data"),
           T.INT16: ("int16", "int32_data"), T.INT32: ("int32", "int32_data"),
           T.INT64: ("int64", "int64_data"), T.BOOL: ("bool", "int32_data"),
           T.FLOAT16: ("float16", "int32_data"), T.DOUBLE: ("float64", "double_data"),
           T.UINT32: ("uint32", "uint64_data"), T.UINT64: ("uint64", "uint64_data"),
           T.COMPLEX64: ("complex64", "float_data"),
           T.COMPLEX128: ("complex128", "double_data")}
_BITS16 = (T.FLOAT16, T.INT16, T.UINT16)  # their int32_data holds the 16 bits
_LITTLE = sys.byteorder == "little"


def np_dtype(data_type: int) -> np.dtype:
    """``onnx.helper.tensor_dtype_to_np_dtype``."""
    import numpy as np

    native = _NATIVE.get(data_type)
    if native is not None:
        return np.dtype(native[0])
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(data_type)


def _native(tensor: TensorProto) -> bool:
    return (_LITTLE and tensor.data_type in _NATIVE and not tensor.HasField("segment")
            and tensor.data_location != T.EXTERNAL)


def to_array(tensor: TensorProto) -> np.ndarray:
    """``onnx.numpy_helper.to_array(tensor)``: raw data as a read-only view of the bytes."""
    if not _native(tensor):
        from onnx import numpy_helper

        return numpy_helper.to_array(tensor)
    import numpy as np

    name, field = _NATIVE[tensor.data_type]
    dims = tuple(tensor.dims)
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, dtype=name).reshape(dims)
    values = getattr(tensor, field)
    if tensor.data_type in _BITS16:
        return (np.array(values, dtype=np.int32).view(np.uint32).astype(np.uint16)
                .reshape(dims).view(name))
    if tensor.data_type == T.BOOL:
        return (np.array(values, dtype=np.int32).view(np.uint32).astype(np.uint8)
                .view(name).reshape(dims))
    if tensor.data_type in (T.COMPLEX64, T.COMPLEX128):
        storage = "float32" if tensor.data_type == T.COMPLEX64 else "float64"
        return np.array(values, dtype=storage).view(dtype=name).reshape(dims)
    storage = {"float_data": "float32", "int32_data": "int32", "int64_data": "int64",
               "double_data": "float64", "uint64_data": "uint64"}[field]
    return np.asarray(values, dtype=storage).astype(name).reshape(dims)


_TYPES: dict[Any, int] = {}


def from_array(array: np.ndarray, name: str | None = None) -> TensorProto:
    """``onnx.numpy_helper.from_array(array, name)``: the values as little-endian
    ``raw_data``."""
    import numpy as np

    if not _TYPES:
        _TYPES.update({np.dtype(n): t for t, (n, _) in _NATIVE.items()})
    data_type = _TYPES.get(array.dtype)
    if data_type is None or not _LITTLE:
        from onnx import numpy_helper

        return numpy_helper.from_array(array, name)
    tensor = TensorProto(dims=array.shape, data_type=data_type, raw_data=array.tobytes())
    if name:
        tensor.name = name
    return tensor


__all__ = ["from_array", "np_dtype", "to_array"]
