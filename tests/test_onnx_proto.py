"""onnx's message classes without onnx's initialiser: the same classes, either import order."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from weightstore.catalogue.element_types import BYTE_WIDE, element_bits, expected_nbytes
from weightstore.io import onnx_proto


def _fresh(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_classes_are_onnx_own_when_onnx_comes_first() -> None:
    assert onnx_proto.ModelProto is onnx.ModelProto
    assert onnx_proto.TensorProto is onnx.TensorProto
    assert onnx_proto.messages() is sys.modules["onnx.onnx_ml_pb2"]


def test_loading_the_messages_first_leaves_onnx_whole() -> None:
    """Messages made before ``import onnx`` are onnx's own afterwards: the checker, the
    helpers and the descriptor pool (registered once) accept them."""
    found = _fresh(
        "import json, sys\n"
        "from weightstore.io.onnx_proto import ModelProto, GraphProto, NodeProto\n"
        "before = sorted(m for m in ('onnx', 'numpy', 'ml_dtypes') if m in sys.modules)\n"
        "g = GraphProto(name='g', node=[NodeProto(op_type='Identity', input=['x'],\n"
        "                                          output=['y'])])\n"
        "m = ModelProto(ir_version=10, graph=g)\n"
        "import onnx\n"
        "from onnx import helper, onnx_ml_pb2\n"
        "x = helper.make_tensor_value_info('x', onnx.TensorProto.FLOAT, [2])\n"
        "y = helper.make_tensor_value_info('y', onnx.TensorProto.FLOAT, [2])\n"
        "m.graph.input.append(x); m.graph.output.append(y)\n"
        "m.opset_import.append(helper.make_opsetid('', 17))\n"
        "onnx.checker.check_model(m)\n"
        "again = onnx.load_model_from_string(m.SerializeToString())\n"
        "print(json.dumps({'before': before, 'same': onnx.ModelProto is ModelProto,\n"
        "                  'module': onnx_ml_pb2 is sys.modules['onnx.onnx_ml_pb2'],\n"
        "                  'parsed': type(again) is ModelProto}))\n")
    assert found == {"before": [], "same": True, "module": True, "parsed": True}


def _raw_itemsize(data_type: int) -> int:
    """Bytes per element in raw_data, as onnx maps the type to numpy. onnx before 1.18 (no
    ml_dtypes) widens bfloat16 and the float8 types to float32 for arrays; their raw_data
    holds the storage type."""
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    if dtype == np.float32 and data_type != onnx.TensorProto.FLOAT:
        storage = onnx.helper.tensor_dtype_to_storage_tensor_dtype(data_type)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(storage))
    return dtype.itemsize


@pytest.mark.parametrize("name", sorted(onnx.TensorProto.DataType.keys()))
def test_element_sizes_agree_with_onnx(name: str) -> None:
    """The table of byte-wide types matches onnx's own mapping for every type it knows."""
    data_type = onnx.TensorProto.DataType.Value(name)
    if data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        assert element_bits(data_type) is None
        return
    try:
        itemsize = _raw_itemsize(data_type)
    except (KeyError, TypeError, ValueError):
        pytest.skip(f"onnx {onnx.__version__} maps no numpy type to {name}")
    if data_type in BYTE_WIDE:
        assert BYTE_WIDE[data_type] == itemsize
    elif element_bits(data_type) % 8 == 0:  # byte-wide, missing from the table: onnx asked
        assert element_bits(data_type) == 8 * itemsize


def test_bfloat16_and_float8_take_their_own_width_whatever_the_onnx() -> None:
    assert expected_nbytes(onnx.TensorProto.BFLOAT16, [3, 2]) == 12
    assert expected_nbytes(onnx.TensorProto.FLOAT8E4M3FN, [5]) == 5
    assert expected_nbytes(onnx.TensorProto.COMPLEX64, [2]) == 16


def test_an_onnx_without_the_generated_module_falls_back_to_importing_onnx(tmp_path) -> None:
    """An onnx built without ONNX-ML types has no ``onnx_ml_pb2.py``: the classes then come
    from onnx itself (its ``onnx_pb``), still onnx's own."""
    found = _fresh(
        "import importlib.util, json, sys, types\n"
        "real = importlib.util.find_spec\n"
        "def find_spec(name, *a, **k):\n"
        "    spec = real(name, *a, **k)\n"
        "    if name == 'onnx':\n"
        f"        spec.submodule_search_locations = [{str(tmp_path)!r}]\n"
        "    return spec\n"
        "importlib.util.find_spec = find_spec\n"
        "from weightstore.io import onnx_proto\n"
        "importlib.util.find_spec = real\n"
        "loaded = 'onnx' in sys.modules\n"
        "import onnx\n"
        "print(json.dumps({'onnx': loaded,\n"
        "                  'same': onnx_proto.ModelProto is onnx.ModelProto}))\n")
    assert found == {"onnx": True, "same": True}


def _attribute_values() -> list[tuple[str, object]]:
    tensor = onnx.helper.make_tensor("t", onnx.TensorProto.FLOAT, [2], [1.0, 2.5])
    graph = onnx.helper.make_graph([], "g", [], [])
    return [("i", 3), ("b", True), ("npi", np.int64(7)), ("f", 0.5), ("npf", np.float32(0.25)),
            ("s", "text"), ("bs", b"\x00\xff"), ("t", tensor), ("g", graph),
            ("ints", [1, 2, 3]), ("floats", [0.5, 1.5]), ("mixed", (1, 2.5)),
            ("strings", ["a", b"b"]), ("tensors", [tensor]), ("graphs", [graph]),
            ("tp", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [1]))]


def test_nodes_are_onnx_helpers_byte_for_byte() -> None:
    """``make_node`` and ``make_attribute`` write what onnx.helper writes (sorted
    attributes, None left out, every value type), and ``attribute_value`` reads it back."""
    for key, value in _attribute_values():
        ours = onnx_proto.make_attribute(key, value)
        assert ours.SerializeToString() == \
            onnx.helper.make_attribute(key, value).SerializeToString(), key
        theirs = onnx.helper.get_attribute_value(ours)
        assert onnx_proto.attribute_value(ours) == theirs, key
    attributes = dict(_attribute_values())
    for kwargs in ({}, {"name": "n", "domain": "com.microsoft"}, {"name": "", "domain": ""},
                   {"doc_string": "said", "overload": "v2", "domain": "local"},
                   {"doc_string": ""}):
        ours = onnx_proto.make_node("Op", ["a", "b"], ["c"], **kwargs, skipped=None,
                                    **attributes)
        theirs = onnx.helper.make_node("Op", ["a", "b"], ["c"], **kwargs, skipped=None,
                                       **attributes)
        assert ours.SerializeToString() == theirs.SerializeToString()
    with pytest.raises(ValueError):
        onnx_proto.make_attribute("empty", [])
    with pytest.raises(TypeError):
        onnx_proto.make_attribute("none", object())


@pytest.mark.parametrize(("value", "kwargs"), [
    ([], {"attr_type": onnx.AttributeProto.INTS}),
    ([2, 3], {"attr_type": onnx.AttributeProto.INTS}),
    ([1, 2], {"attr_type": onnx.AttributeProto.FLOATS}), (["a"], {"doc_string": "said"}),
    ("text", {"doc_string": "", "attr_type": onnx.AttributeProto.STRING}),
])
def test_attributes_of_a_given_type_and_doc_string_are_onnx_helpers(value, kwargs) -> None:
    """The type an empty list cannot tell is given (a FileConstant's ``shape`` of a
    scalar), and a doc string is kept, as onnx.helper does."""
    assert onnx_proto.make_attribute("a", value, **kwargs).SerializeToString() == \
        onnx.helper.make_attribute("a", value, **kwargs).SerializeToString()


def test_an_attribute_of_another_type_than_given_is_refused_as_onnx_refuses_it() -> None:
    for value in (1, "text"):
        with pytest.raises(TypeError):
            onnx.helper.make_attribute("a", value, attr_type=onnx.AttributeProto.FLOAT)
        with pytest.raises(TypeError, match="attribute 'a' is of type"):
            onnx_proto.make_attribute("a", value, attr_type=onnx.AttributeProto.FLOAT)


NATIVE = ["float32", "uint8", "int8", "uint16", "int16", "int32", "int64", "bool", "float16",
          "float64", "uint32", "uint64", "complex64", "complex128"]


@pytest.mark.parametrize("dtype", NATIVE)
def test_arrays_are_onnx_numpy_helpers_byte_for_byte(dtype: str) -> None:
    """numpy's own types, from raw data and from the typed fields, as onnx's numpy_helper
    reads and writes them; the element type as onnx.helper maps it."""
    from weightstore.io import onnx_arrays

    values = (np.arange(-3, 9).reshape(3, 4) * 1.5).astype(dtype)
    ours = onnx_arrays.from_array(values, "w")
    assert ours.SerializeToString() == onnx.numpy_helper.from_array(values, "w").SerializeToString()
    assert onnx_arrays.from_array(values).name == ""
    assert onnx_arrays.np_dtype(ours.data_type) == onnx.helper.tensor_dtype_to_np_dtype(
        ours.data_type)
    typed = onnx.helper.make_tensor("w", ours.data_type, values.shape, values.flatten())
    for tensor in (ours, typed):
        got, expected = onnx_arrays.to_array(tensor), onnx.numpy_helper.to_array(tensor)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


def test_other_types_are_onnx_own() -> None:
    """A type numpy lacks (bfloat16), strings and big-endian arrays go to onnx's functions
    (which refuse the last)."""
    from weightstore.io import onnx_arrays

    bf16 = onnx.helper.make_tensor("b", onnx.TensorProto.BFLOAT16, [2], [1.0, 2.0])
    assert onnx_arrays.to_array(bf16).tobytes() == onnx.numpy_helper.to_array(bf16).tobytes()
    words = np.array(["a", "bc"], dtype=object)
    assert onnx_arrays.from_array(words).SerializeToString() == \
        onnx.numpy_helper.from_array(words).SerializeToString()
    with pytest.raises(ValueError, match="into TensorProto element type"):
        onnx_arrays.from_array(np.arange(4, dtype=">i4"))


def test_the_checker_and_shape_inference_run_without_onnx_initialiser() -> None:
    """onnx's C++ extension, loaded under its own name: the checker refuses what onnx's
    refuses, shape inference infers what onnx's infers, and ``import onnx`` afterwards
    finds the same extension."""
    found = _fresh(
        "import json, sys\n"
        "from weightstore.io import onnx_native\n"
        "from weightstore.io.onnx_proto import make_node, ModelProto, GraphProto, "
        "ValueInfoProto, TypeProto, OperatorSetIdProto\n"
        "def value(name):\n"
        "    v = ValueInfoProto(name=name)\n"
        "    v.type.tensor_type.elem_type = 1\n"
        "    v.type.tensor_type.shape.dim.add().dim_value = 2\n"
        "    return v\n"
        "g = GraphProto(name='g', node=[make_node('Relu', ['x'], ['h']),\n"
        "                               make_node('Relu', ['h'], ['y'])],\n"
        "               input=[value('x')], output=[value('y')])\n"
        "m = ModelProto(ir_version=10, graph=g, opset_import=[OperatorSetIdProto(version=17)])\n"
        "onnx_native.check_model(m)\n"
        "inferred = onnx_native.infer_shapes(m)\n"
        "bad = ModelProto(); bad.CopyFrom(m); bad.graph.node[0].op_type = 'NoSuchOp'\n"
        "try:\n"
        "    onnx_native.check_model(bad); refused = False\n"
        "except onnx_native.validation_error():\n"
        "    refused = True\n"
        "known = [onnx_native.has_schema('Relu'), onnx_native.has_schema('NoSuchOp'),\n"
        "         onnx_native.has_schema('MatMulNBits', 'com.microsoft')]\n"
        "before = sorted(k for k in ('onnx', 'numpy', 'ml_dtypes') if k in sys.modules)\n"
        "import onnx\n"
        "print(json.dumps({'before': before, 'refused': refused, 'known': known,\n"
        "    'inferred': [v.name for v in inferred.graph.value_info],\n"
        "    'same': onnx.checker.C is sys.modules['onnx.onnx_cpp2py_export'].checker,\n"
        "    'theirs': onnx.shape_inference.infer_shapes(m).SerializeToString()\n"
        "              == inferred.SerializeToString()}))\n")
    assert found == {"before": [], "refused": True, "known": [True, False, False],
                     "inferred": ["h"], "same": True, "theirs": True}


def test_models_parse_as_onnx_parses_them(encoder_model: onnx.ModelProto) -> None:
    """``parse_model`` is ``onnx.load_model_from_string``: the same message from the same
    bytes, and the same refusal of what is not bytes."""
    data = encoder_model.SerializeToString()
    ours = onnx_proto.parse_model(data)
    assert type(ours) is onnx.ModelProto
    assert ours.SerializeToString() == onnx.load_model_from_string(data).SerializeToString()
    for wrong in (memoryview(data), bytearray(data), "text"):
        with pytest.raises(TypeError) as theirs:
            onnx.load_model_from_string(wrong)
        with pytest.raises(TypeError) as raised:
            onnx_proto.parse_model(wrong)
        assert str(raised.value) == str(theirs.value)
