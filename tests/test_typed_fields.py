"""Typed value fields narrowed with ``array``: the same bytes and refusals as numpy's
narrowing, for every varint field and element type, and back again."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T

from weightstore.catalogue import typed_fields
from weightstore.catalogue.element_types import FOUR_BIT, SIX_BIT, TWO_BIT
from weightstore.errors import ModelError

# every varint layout, with the numpy storage type onnx.proto gives its values
VARINT = sorted((field, dtype) for (field, dtype) in typed_fields._LAYOUT
                if field not in ("float_data", "double_data") and dtype not in SIX_BIT)
STORAGE = {("int64_data", T.INT64): "<i8", ("uint64_data", T.UINT64): "<u8",
           ("uint64_data", T.UINT32): "<u4", ("int32_data", T.INT32): "<i4",
           ("int32_data", T.INT16): "<i2", ("int32_data", T.INT8): "i1",
           ("int32_data", T.UINT16): "<u2", ("int32_data", T.FLOAT16): "<u2",
           ("int32_data", T.BFLOAT16): "<u2"}  # the rest of int32_data: one byte, unsigned


def _storage(field: str, data_type: int) -> np.dtype:
    return np.dtype(STORAGE.get((field, data_type), "u1"))


def _reference(values: list[int], field: str, data_type: int) -> bytes | None:
    """numpy's narrowing, as the catalogue did it before: None where it is lossy."""
    wide = np.array(values, dtype=np.uint64 if field == "uint64_data" else np.int64)
    narrow = wide.astype(_storage(field, data_type))
    lossy = ((wide < 0) | (wide > 1) if data_type == T.BOOL
             else narrow.astype(wide.dtype) != wide)
    return None if lossy.any() else narrow.tobytes()


def _fragment(field: str, values: list[int]) -> bytes:
    tensor = T()
    getattr(tensor, field).extend(values)
    return tensor.SerializeToString()


@pytest.mark.parametrize(("field", "data_type"), VARINT)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_narrowing_matches_numpy(field, data_type, data):
    bits = 64 if field != "int32_data" else 32
    low, high = (0, 2**64 - 1) if field == "uint64_data" else (-(2**(bits - 1)), 2**(bits - 1) - 1)
    width = 8 * _storage(field, data_type).itemsize
    edges = [low, high, 0, 1, -1, 2**(width - 1) - 1, 2**(width - 1), 2**width - 1, 2**width,
             -(2**(width - 1)), -(2**(width - 1)) - 1]
    value = st.one_of(st.integers(low, high), st.sampled_from([e for e in edges
                                                                if low <= e <= high]))
    values = data.draw(st.lists(value, min_size=1, max_size=40))
    expected = _reference(values, field, data_type)
    where = "tensor 't'"
    per_value = 2 if data_type in FOUR_BIT else 4 if data_type in TWO_BIT else 1
    dims = [per_value * len(values)]  # sub-byte types: one packed byte per value
    assert typed_fields.expected_values(field, data_type, dims, where) == len(values)
    fragment = _fragment(field, values)
    if expected is None:
        with pytest.raises(ModelError, match="outside") as info:
            typed_fields.decode(fragment, field, data_type, dims, where)
        assert info.value.context["value"] in values
        return
    got = typed_fields.decode(fragment, field, data_type, dims, where)
    assert got == expected
    back = T(name="t", data_type=data_type, dims=dims)
    typed_fields.encode(back, field, got)
    assert list(getattr(back, field)) == values
