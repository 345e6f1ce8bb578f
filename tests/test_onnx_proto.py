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
