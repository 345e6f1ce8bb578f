"""Element types: how many bits one element takes, so how many bytes a tensor holds.

onnx packs its sub-byte types in ``raw_data`` (and external data), least significant bits
first: 4-bit types two to a byte, 2-bit types four to a byte, 6-bit floats four to three
bytes; a tensor takes ``ceil(elements * bits / 8)`` bytes. Every other type takes numpy's
item size. Types an older onnx lacks are simply absent.

The byte-wide types are listed here rather than asked of ``onnx.helper`` (which imports
numpy and ml_dtypes, most of a second): a build reads sizes of every tensor before it needs
anything else of onnx. A type missing from the table (one a newer onnx adds) is still asked
of onnx; a test checks the table against onnx's own mapping.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from ..io.onnx_proto import TensorProto

T = TensorProto


def _types(*names: str) -> frozenset[int]:
    return frozenset(getattr(T, n) for n in names if hasattr(T, n))


# bytes per element of every type that takes whole bytes
_BYTES = {name: size for size, names in {
    1: ("UINT8", "INT8", "BOOL", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ", "FLOAT8E8M0"),
    2: ("UINT16", "INT16", "FLOAT16", "BFLOAT16"),
    4: ("FLOAT", "INT32", "UINT32"),
    8: ("INT64", "UINT64", "DOUBLE", "COMPLEX64"),
    16: ("COMPLEX128",),
}.items() for name in names}
BYTE_WIDE = {getattr(T, name): size for name, size in _BYTES.items() if hasattr(T, name)}

FOUR_BIT = _types("INT4", "UINT4", "FLOAT4E2M1")
TWO_BIT = _types("INT2", "UINT2")
SIX_BIT = _types("FLOAT6E2M3", "FLOAT6E3M2")
_SUB_BYTE_BITS = {**dict.fromkeys(FOUR_BIT, 4), **dict.fromkeys(TWO_BIT, 2),
                  **dict.fromkeys(SIX_BIT, 6)}


@functools.cache
def element_bits(data_type: int) -> int | None:
    """Bits per element in raw_data, None for strings and unknown types."""
    if data_type in (T.STRING, T.UNDEFINED):
        return None
    if data_type in _SUB_BYTE_BITS:
        return _SUB_BYTE_BITS[data_type]
    if data_type in BYTE_WIDE:
        return 8 * BYTE_WIDE[data_type]
    try:
        import numpy as np
        import onnx

        return 8 * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def expected_nbytes(data_type: int, dims: Sequence[int]) -> int | None:
    """Little-endian byte size of a tensor, or None for strings/unknown types."""
    bits = element_bits(data_type)
    if bits is None:
        return None
    return -(-math.prod(dims) * bits // 8)
