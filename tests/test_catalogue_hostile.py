"""Hostile model files: every failure is a typed error naming the byte offset."""

from __future__ import annotations

import contextlib

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from weightstore.catalogue.descriptors import weight_descriptors
from weightstore.catalogue.reader import MAX_DEPTH, read_catalogue
from weightstore.catalogue.wire import encode_varint
from weightstore.errors import ModelError, WeightstoreError

from .samples import make_encoder

SMALL = make_encoder(vocab=50, hidden=16, heads=2, layers=1, ffn=32, max_seq=8)
SMALL_BYTES = SMALL.SerializeToString()


def _write(tmp_path, data: bytes):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    return path


def _catalogue_all(path) -> None:
    """Catalogue, describe and read every payload: the whole read side."""
    with read_catalogue(path) as catalogue:
        size = catalogue.file_size
        for w in weight_descriptors(catalogue):
            if w.payload is None:
                continue
            if not w.is_external:
                assert w.payload.offset + w.payload.length <= size
            w.read(catalogue)


@pytest.mark.parametrize("data, message, offset", [
    (b"\x3a\x05abc", "runs past the end", 0),  # graph (field 7) longer than the file
    (b"\x38\x01", "wire type 0", 0),  # graph with a varint wire type
    (b"\x3a" + b"\xff" * 11, "longer than 10 bytes", 1),
    (b"\x08\x08\x3a\x01\x0a", "truncated varint", 5),  # node length missing inside graph
    (b"\x08", "truncated varint", 1),
    (b"\x0b\x01", "wire type 3", 0),
    (b"\x00\x01", "field number 0", 0),
])
def test_framing_errors_name_the_offset(tmp_path, data, message, offset):
    with pytest.raises(ModelError) as err:
        read_catalogue(_write(tmp_path, data))
    assert message in str(err.value)
    assert err.value.context["offset"] == offset
    assert err.value.context["file"].endswith("m.onnx")


@pytest.mark.parametrize("data", [
    b"", b"hello, this is not a model\n", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
    b"\x12\x03abc",  # a valid protobuf message without graph or ir_version
])
def test_not_onnx(tmp_path, data):
    with pytest.raises(ModelError) as err:
        read_catalogue(_write(tmp_path, data))
    assert "model file is empty" in str(err.value) or "not an ONNX model" in str(err.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        read_catalogue(tmp_path / "none.onnx")
    with pytest.raises(ModelError, match="folder"):
        read_catalogue(tmp_path)


def _len_field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + encode_varint(len(payload)) + payload


def test_nesting_limit(tmp_path):
    """Built at the wire level: protobuf itself refuses to build messages this deep."""
    graph = b""
    for _ in range(MAX_DEPTH // 3 + 2):  # each level: graph -> node -> attribute -> graph
        attribute = _len_field(0x0A, b"then_branch") + _len_field(0x32, graph)
        node = _len_field(0x2A, attribute)
        graph = _len_field(0x0A, node)
    model = b"\x08\x08" + _len_field(0x3A, graph)
    with pytest.raises(ModelError, match="nested deeper") as err:
        read_catalogue(_write(tmp_path, model))
    assert err.value.context["limit"] == MAX_DEPTH
    assert isinstance(err.value.context["offset"], int)


def test_payload_length_disagreeing_with_shape(tmp_path):
    t = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0], raw=False)
    t.ClearField("float_data")
    t.raw_data = b"\x00" * 12  # 3 floats for a [4] tensor
    g = helper.make_graph([], "g", [], [], [t])
    path = _write(tmp_path, helper.make_model(g).SerializeToString())
    with pytest.raises(ModelError, match="disagrees") as err:
        _catalogue_all(path)
    assert "'w'" in err.value.context["where"]


def test_truncation_anywhere_is_typed(tmp_path):
    step = max(1, len(SMALL_BYTES) // 97)
    for cut in range(1, len(SMALL_BYTES), step):
        path = _write(tmp_path, SMALL_BYTES[:cut])
        with contextlib.suppress(WeightstoreError):
            _catalogue_all(path)


_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(SMALL_BYTES) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(SMALL_BYTES) - 1), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, len(SMALL_BYTES) - 1), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, len(SMALL_BYTES) - 1), st.integers(1, 16)),
)


def _mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, pos, value in mutations:
        pos = min(pos, max(len(buf) - 1, 0))
        if not buf:
            break
        if kind == "flip":
            buf[pos] ^= value
        elif kind == "cut":
            del buf[pos:]
        elif kind == "insert":
            buf.insert(pos, value)
        else:
            del buf[pos:pos + value]
    return bytes(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(_mutation, min_size=1, max_size=4))
def test_mutated_models_raise_only_typed_errors(tmp_path_factory, mutations):
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(_mutate(SMALL_BYTES, mutations))
    with contextlib.suppress(WeightstoreError):
        _catalogue_all(path)


def test_small_model_is_sane():
    onnx.checker.check_model(SMALL, full_check=True)
