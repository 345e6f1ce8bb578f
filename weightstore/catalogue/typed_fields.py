"""TensorProto's typed value fields <-> little-endian raw bytes, bit-exact.

``float_data`` and ``double_data`` are fixed-width on the wire: their packed content *is*
the little-endian bytes, so they are copied, never converted through Python floats (which
would quiet signalling NaNs). The varint fields (``int32_data``, ``int64_data``,
``uint64_data``) are decoded by protobuf and narrowed with numpy to the element type's
storage width; a value that does not fit (300 for a UINT8, -1 for a FLOAT16's bit
pattern) is refused, since narrowing it could not be undone. Element counts are checked
against the shape first, so a hostile shape cannot make anything allocate more than the
payload's own size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..io.onnx_proto import TensorProto
from .element_types import FOUR_BIT, SIX_BIT, TWO_BIT, expected_nbytes
from .wire import I32, I64, LEN, encode_varint, iter_fields

T = TensorProto
_EIGHT_BIT_FLOATS = {getattr(T, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                             "FLOAT8E5M2FNUZ", "FLOAT8E8M0") if hasattr(T, n)}

# (field, data type) -> numpy storage dtype of one value. A value per element (two for
# complex numbers), except for the 4-bit and 2-bit types, whose int32_data holds the
# packed bytes, one per value, as raw_data would; the 6-bit floats hold one element per
# value there, packed four to three bytes on their way to raw bytes (as onnx does).
_LAYOUT: dict[tuple[str, int], str] = {
    ("float_data", T.FLOAT): "<f4",
    ("float_data", T.COMPLEX64): "<f4",
    ("double_data", T.DOUBLE): "<f8",
    ("double_data", T.COMPLEX128): "<f8",
    ("int64_data", T.INT64): "<i8",
    ("uint64_data", T.UINT64): "<u8",
    ("uint64_data", T.UINT32): "<u4",
    ("int32_data", T.INT32): "<i4",
    ("int32_data", T.INT16): "<i2",
    ("int32_data", T.INT8): "i1",
    ("int32_data", T.UINT16): "<u2",
    ("int32_data", T.UINT8): "u1",
    ("int32_data", T.BOOL): "u1",
    ("int32_data", T.FLOAT16): "<u2",
    ("int32_data", T.BFLOAT16): "<u2",
    **{("int32_data", t): "u1" for t in _EIGHT_BIT_FLOATS | FOUR_BIT | TWO_BIT | SIX_BIT},
}
_FIELD_NUMBER = {"float_data": 4, "int32_data": 5, "int64_data": 7, "double_data": 10,
                 "uint64_data": 11}


def _layout(encoding: str, data_type: int, where: str) -> np.dtype:
    layout = _LAYOUT.get((encoding, data_type))
    if layout is None:
        name = T.DataType.Name(data_type) if data_type in T.DataType.values() else data_type
        raise ModelError(f"{encoding} cannot hold {name} values", where=where)
    return np.dtype(layout)


def expected_values(encoding: str, data_type: int, dims: Sequence[int], where: str) -> int:
    """How many values the typed field must hold for this shape."""
    _layout(encoding, data_type, where)
    if data_type in FOUR_BIT | TWO_BIT:
        return expected_nbytes(data_type, dims) or 0
    return math.prod(dims) * (2 if data_type in (T.COMPLEX64, T.COMPLEX128) else 1)


def _pack_six(codes: np.ndarray) -> bytes:
    """6-bit codes, four to three bytes, least significant bits first (onnx's packing)."""
    padded = np.zeros(-(-codes.size // 4) * 4, dtype=np.uint32)
    padded[:codes.size] = codes & 0x3F
    g = padded.reshape(-1, 4)
    word = g[:, 0] | g[:, 1] << 6 | g[:, 2] << 12 | g[:, 3] << 18
    packed = np.stack([word & 0xFF, word >> 8 & 0xFF, word >> 16], axis=1).astype(np.uint8)
    return packed.tobytes()[:-(-codes.size * 6 // 8)]


def _unpack_six(data: bytes, count: int) -> np.ndarray:
    groups = -(-count // 4)
    padded = np.zeros(groups * 3, dtype=np.uint32)
    padded[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    b = padded.reshape(-1, 3)
    word = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16
    codes = np.stack([word >> shift & 0x3F for shift in (0, 6, 12, 18)], axis=1)
    return codes.reshape(-1)[:count].astype(np.uint8)


def decode(fragment: bytes, encoding: str, data_type: int, dims: Sequence[int],
           where: str) -> bytes:
    """The little-endian bytes held by ``fragment``: serialized occurrences of the field."""
    storage = _layout(encoding, data_type, where)
    count = expected_values(encoding, data_type, dims, where)
    if encoding in ("float_data", "double_data"):
        width = storage.itemsize
        chunks = []
        view = memoryview(fragment)
        for f in iter_fields(view, 0, len(fragment)):
            packed = f.wire_type == LEN and f.length % width == 0
            if packed or f.wire_type == (I32 if width == 4 else I64):
                chunks.append(view[f.value:f.end])
            else:
                raise ModelError(f"malformed {encoding}", where=where)
        data = b"".join(chunks)
        if len(data) != count * width:
            raise ModelError(f"{encoding} holds {len(data) // width} values, the shape "
                             f"needs {count}", where=where)
        return data
    if count > len(fragment):  # every varint takes at least one byte
        raise ModelError(f"{encoding} is too short for the shape", where=where, values=count)
    tensor = T()
    try:
        tensor.MergeFromString(fragment)
    except DecodeError:
        raise ModelError(f"malformed {encoding}", where=where) from None
    values = getattr(tensor, encoding)
    if len(values) != count:
        raise ModelError(f"{encoding} holds {len(values)} values, the shape needs {count}",
                         where=where)
    wide = np.array(values, dtype=np.uint64 if encoding == "uint64_data" else np.int64)
    narrow = wide.astype(storage)
    limit = 1 if data_type == T.BOOL else 0x3F if data_type in SIX_BIT else None
    lossy = ((wide < 0) | (wide > limit) if limit is not None
             else narrow.astype(wide.dtype) != wide)
    if lossy.any():
        # onnx and onnxruntime would keep the low bits; writing them back could not give
        # the tensor as it was, so the value is refused rather than guessed at
        name = T.DataType.Name(data_type)
        raise ModelError(f"{encoding} holds a value outside {name}'s range",
                         where=where, value=int(wide[np.argmax(lossy)]))
    if data_type in SIX_BIT:
        return _pack_six(narrow)
    return narrow.tobytes()


def encode(tensor: TensorProto, encoding: str, data: bytes) -> None:
    """Store little-endian ``data`` in ``tensor``'s typed field ``encoding`` (bit-exact)."""
    where = f"tensor '{tensor.name}'"
    storage = _layout(encoding, tensor.data_type, where)
    if len(data) % storage.itemsize:
        raise ModelError("payload size is not a whole number of values", where=where)
    if tensor.data_type in SIX_BIT:
        data = _unpack_six(data, math.prod(tensor.dims)).tobytes()
    if encoding in ("float_data", "double_data"):
        tag = encode_varint((_FIELD_NUMBER[encoding] << 3) | LEN)
        tensor.MergeFromString(tag + encode_varint(len(data)) + bytes(data))
        return
    values = np.frombuffer(data, dtype=storage)
    wide = values.astype(np.uint64 if encoding == "uint64_data" else np.int64)
    getattr(tensor, encoding).extend(wide.tolist())
