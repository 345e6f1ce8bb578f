"""TensorProto's typed value fields <-> little-endian raw bytes, bit-exact.

``float_data`` and ``double_data`` are fixed-width on the wire: their packed content *is*
the little-endian bytes, so they are copied, never converted through Python floats (which
would quiet signalling NaNs). The varint fields (``int32_data``, ``int64_data``,
``uint64_data``) are decoded by protobuf and narrowed to the element type's storage width
with the standard library's :mod:`array` (which refuses a value that does not fit: 300 for
a UINT8, -1 for a FLOAT16's bit pattern), since narrowing it could not be undone. numpy
is imported only for the 6-bit floats' packing: a build of an everyday model never loads
it. Element counts are checked
against the shape first, so a hostile shape cannot make anything allocate more than the
payload's own size.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..io.onnx_proto import TensorProto
from .element_types import FOUR_BIT, SIX_BIT, TWO_BIT, expected_nbytes
from .wire import I32, I64, LEN, encode_varint, iter_fields

if TYPE_CHECKING:
    import numpy as np

T = TensorProto
_EIGHT_BIT_FLOATS = {getattr(T, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                             "FLOAT8E5M2FNUZ", "FLOAT8E8M0") if hasattr(T, n)}

# (field, data type) -> storage type of one value, as an array typecode (little-endian on
# the wire; the widths are checked below). A value per element (two for complex numbers),
# except for the 4-bit and 2-bit types, whose int32_data holds the packed bytes, one per
# value, as raw_data would; the 6-bit floats hold one element per value there, packed four
# to three bytes on their way to raw bytes (as onnx does).
_LAYOUT: dict[tuple[str, int], str] = {
    ("float_data", T.FLOAT): "f",
    ("float_data", T.COMPLEX64): "f",
    ("double_data", T.DOUBLE): "d",
    ("double_data", T.COMPLEX128): "d",
    ("int64_data", T.INT64): "q",
    ("uint64_data", T.UINT64): "Q",
    ("uint64_data", T.UINT32): "I",
    ("int32_data", T.INT32): "i",
    ("int32_data", T.INT16): "h",
    ("int32_data", T.INT8): "b",
    ("int32_data", T.UINT16): "H",
    ("int32_data", T.UINT8): "B",
    ("int32_data", T.BOOL): "B",
    ("int32_data", T.FLOAT16): "H",
    ("int32_data", T.BFLOAT16): "H",
    **{("int32_data", t): "B" for t in _EIGHT_BIT_FLOATS | FOUR_BIT | TWO_BIT | SIX_BIT},
}
_WIDTHS = {"b": 1, "B": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "f": 4, "d": 8}
if any(array(code).itemsize != width for code, width in _WIDTHS.items()):
    raise ImportError("this platform's C types do not have the widths onnx's typed fields "
                      "need (array typecodes: " + ", ".join(
                          f"{c}={array(c).itemsize}" for c in _WIDTHS) + ")")
_FIELD_NUMBER = {"float_data": 4, "int32_data": 5, "int64_data": 7, "double_data": 10,
                 "uint64_data": 11}


def _layout(encoding: str, data_type: int, where: str) -> str:
    layout = _LAYOUT.get((encoding, data_type))
    if layout is None:
        name = T.DataType.Name(data_type) if data_type in T.DataType.values() else data_type
        raise ModelError(f"{encoding} cannot hold {name} values", where=where)
    return layout


def _little_endian(values: array) -> array:
    if sys.byteorder == "big":
        values.byteswap()
    return values


def expected_values(encoding: str, data_type: int, dims: Sequence[int], where: str) -> int:
    """How many values the typed field must hold for this shape."""
    _layout(encoding, data_type, where)
    if data_type in FOUR_BIT | TWO_BIT:
        return expected_nbytes(data_type, dims) or 0
    return math.prod(dims) * (2 if data_type in (T.COMPLEX64, T.COMPLEX128) else 1)


def _pack_six(codes: bytes) -> bytes:
    """6-bit codes, four to three bytes, least significant bits first (onnx's packing)."""
    import numpy as np

    codes = np.frombuffer(codes, dtype=np.uint8)
    padded = np.zeros(-(-codes.size // 4) * 4, dtype=np.uint32)
    padded[:codes.size] = codes & 0x3F
    g = padded.reshape(-1, 4)
    word = g[:, 0] | g[:, 1] << 6 | g[:, 2] << 12 | g[:, 3] << 18
    packed = np.stack([word & 0xFF, word >> 8 & 0xFF, word >> 16], axis=1).astype(np.uint8)
    return packed.tobytes()[:-(-codes.size * 6 // 8)]


def _unpack_six(data: bytes, count: int) -> np.ndarray:
    import numpy as np

    groups = -(-count // 4)
    padded = np.zeros(groups * 3, dtype=np.uint32)
    padded[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    b = padded.reshape(-1, 3)
    word = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16
    codes = np.stack([word >> shift & 0x3F for shift in (0, 6, 12, 18)], axis=1)
    return codes.reshape(-1)[:count].astype(np.uint8)


_VALUE_WIDTH = {"int32_data": 4, "int64_data": 8, "uint64_data": 8}


def narrows(tensor: TensorProto) -> bool:
    """Does a parsed tensor hold values in a field that :func:`field_narrows`?"""
    return any(getattr(tensor, encoding) and field_narrows(encoding, tensor.data_type)
               for encoding in _VALUE_WIDTH)


def field_narrows(encoding: str, data_type: int) -> bool:
    """Can the field hold a value the element type cannot: a varint field whose values are
    wider than the type's storage (``int32_data`` of a UINT8, ``uint64_data`` of a UINT32),
    or a type of fewer values than its storage (BOOL, the 6-bit floats)? Such a tensor is
    decoded (:func:`decode`, which refuses the value) even where its bytes stay inline."""
    storage = _LAYOUT.get((encoding, data_type))
    if storage is None or encoding not in _VALUE_WIDTH:
        return False
    return (_WIDTHS[storage] < _VALUE_WIDTH[encoding] or data_type == T.BOOL
            or data_type in SIX_BIT)


def _narrow(values: Sequence[int], encoding: str, data_type: int, **context: str) -> array:
    """The values in the element type's storage, little-endian; a value the type cannot
    hold is refused (:class:`ModelError` naming it, with ``context``). The field can hold
    the type (:func:`_layout` said so)."""
    storage = _LAYOUT[(encoding, data_type)]
    limit = 1 if data_type == T.BOOL else 0x3F if data_type in SIX_BIT else None
    try:
        if limit is not None and not all(0 <= v <= limit for v in values):
            raise OverflowError
        return _little_endian(array(storage, values))
    except OverflowError:
        # onnx and onnxruntime would keep the low bits; writing them back could not give
        # the tensor as it was, so the value is refused rather than guessed at
        top = limit if limit is not None else (1 << (8 * _WIDTHS[storage] - (
            0 if storage.isupper() else 1))) - 1
        bottom = 0 if limit is not None or storage.isupper() else -top - 1
        name = T.DataType.Name(data_type)
        raise ModelError(f"{encoding} holds a value outside {name}'s range", **context,
                         value=next(v for v in values if not bottom <= v <= top)) from None


def check_values(tensor: TensorProto, where: str) -> None:
    """Refuse a parsed tensor whose typed field holds a value its element type cannot
    (:func:`field_narrows`), naming it as ``tensor`` (as a conversion does): the tensors
    that stay inline, which no conversion decodes, are checked as the ones that move out
    are."""
    for encoding in _VALUE_WIDTH:
        values = getattr(tensor, encoding)
        if values and field_narrows(encoding, tensor.data_type):
            _narrow(values, encoding, tensor.data_type, tensor=where)


def decode(fragment: bytes, encoding: str, data_type: int, dims: Sequence[int],
           where: str) -> bytes:
    """The little-endian bytes held by ``fragment``: serialized occurrences of the field."""
    storage = _layout(encoding, data_type, where)
    count = expected_values(encoding, data_type, dims, where)
    if encoding in ("float_data", "double_data"):
        width = _WIDTHS[storage]
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
    narrow = _narrow(values, encoding, data_type, where=where)
    if data_type in SIX_BIT:
        return _pack_six(narrow.tobytes())
    return narrow.tobytes()


def encode(tensor: TensorProto, encoding: str, data: bytes) -> None:
    """Store little-endian ``data`` in ``tensor``'s typed field ``encoding`` (bit-exact)."""
    where = f"tensor '{tensor.name}'"
    storage = _layout(encoding, tensor.data_type, where)
    if len(data) % _WIDTHS[storage]:
        raise ModelError("payload size is not a whole number of values", where=where)
    if tensor.data_type in SIX_BIT:
        data = _unpack_six(data, math.prod(tensor.dims)).tobytes()
    if encoding in ("float_data", "double_data"):
        tag = encode_varint((_FIELD_NUMBER[encoding] << 3) | LEN)
        tensor.MergeFromString(tag + encode_varint(len(data)) + bytes(data))
        return
    values = array(storage)
    values.frombytes(data)
    getattr(tensor, encoding).extend(_little_endian(values).tolist())
