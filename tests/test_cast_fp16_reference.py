"""cast-fp16 against onnxruntime's own float16 converter (``onnxruntime.transformers.
float16.convert_float_to_float16``, what onnxruntime's transformer optimizer and Olive's
fp16 pass run): every weight the pass stores as float16 holds the bytes the converter
gives that weight, on the encoder built with onnx's helpers, a ``torch.onnx.export``
BERT, onnxruntime-genai's Llama export and a conv net.

The one rule where the two differ is the converter's, and the test checks it exactly: a
nonzero value closer to zero than float16's smallest subnormal (5.96e-08) becomes that
subnormal there (its ``min_positive_val``), while a cast rounds it to the nearest float16
(zero below half of it), as onnx's ``Cast`` and numpy do. A finite value beyond float16's
range, which the converter clamps to 65504, is refused by the pass (``derive._cast``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import weightstore
from weightstore.resolve.runnable import runnable_variant

from . import test_quantize_weights as quantized
from .test_quantize_weights import copy_model, graphs

sources = quantized.sources  # the models of the quantizer comparisons (a fixture)

float16 = pytest.importorskip("onnxruntime.transformers.float16")

SMALLEST = 5.96e-08  # the converter's min_positive_val: float16's smallest subnormal


def _cast_weights(variant: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Original weight name -> the float16 payload the scenario reads it from (the input
    of the ``Cast(to=FLOAT)`` that outputs the original name)."""
    found = {}
    for g in graphs(variant):
        inits = {t.name: t for t in g.initializer}
        consts = {n.output[0]: a.t for n in g.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"}
        for n in g.node:
            if n.op_type != "Cast" or n.input[0] not in {**inits, **consts}:
                continue
            tensor = inits.get(n.input[0]) or consts[n.input[0]]
            if tensor.data_type == onnx.TensorProto.FLOAT16:
                found[n.output[0]] = numpy_helper.to_array(tensor)
    return found


def _converted(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The converter's float16 weights by name: initializers, and Constant nodes' values
    by their output."""
    theirs = float16.convert_float_to_float16(model, keep_io_types=True,
                                              disable_shape_infer=True)
    tensors = [(t.name, t) for g in graphs(theirs) for t in g.initializer]
    tensors += [(n.output[0], a.t) for g in graphs(theirs) for n in g.node
                if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    return {name: numpy_helper.to_array(t) for name, t in tensors
            if t.data_type == onnx.TensorProto.FLOAT16}


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-bert-export", "tiny-llm", "convnet"])
def test_float16_payloads_are_those_of_onnxruntimes_converter(sources, tmp_path, name):
    src = sources[name]
    model = copy_model(src, tmp_path)
    weightstore.add_scenario(model, "h", ["cast-fp16"])
    mine = _cast_weights(runnable_variant(model, "h"))
    original = onnx.load(str(src))
    theirs = _converted(original)
    source = {t.name: numpy_helper.to_array(t) for g in graphs(original)
              for t in g.initializer}
    source.update({n.output[0]: numpy_helper.to_array(a.t) for g in graphs(original)
                   for n in g.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    compared = sorted(mine)
    assert len(compared) >= 3 and set(compared) <= set(theirs), (compared, sorted(theirs))
    raised = 0
    for w in compared:
        a, b = mine[w], theirs[w]
        assert a.dtype == b.dtype == np.float16 and a.shape == b.shape, w
        differ = a.view(np.uint16) != b.view(np.uint16)
        x = source[w].astype(np.float32)
        tiny = (x != 0) & (np.abs(x) < SMALLEST)
        # only the converter's rule: a tiny value raised to the smallest subnormal
        assert not (differ & ~tiny).any(), w
        assert (np.abs(b[tiny].astype(np.float32)) == np.float16(SMALLEST)).all(), w
        raised += int(differ.sum())
    assert raised < 1e-4 * sum(mine[w].size for w in compared)


def test_the_one_rule_that_differs_is_the_converters_raising_of_tiny_values(tmp_path):
    """A matrix holding values closer to zero than float16's smallest subnormal: the
    pass rounds them (to zero below half of it, to it above), the converter raises every
    nonzero one to it; every other value is the same float16 in both."""
    from onnx import TensorProto, helper

    values = np.full((32, 64), 0.25, dtype=np.float32)
    values[0, :6] = [1e-9, -1e-9, 2e-8, -4e-8, 5e-8, 1e-3]
    values[1:] = np.random.default_rng(5).standard_normal((31, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(values, "w")])
    src = tmp_path / "src" / "m.onnx"
    src.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(src))
    model = copy_model(src, tmp_path / "mine")
    weightstore.add_scenario(model, "h", ["cast-fp16"])
    mine = _cast_weights(runnable_variant(model, "h"))["w"]
    theirs = _converted(onnx.load(str(src)))["w"]
    differ = np.argwhere(mine.view(np.uint16) != theirs.view(np.uint16)).tolist()
    assert differ == [[0, 0], [0, 1], [0, 2]]  # 1e-9, -1e-9, 2e-8: zero here, raised there
    assert mine[0, :5].tolist() == [0.0, -0.0, 0.0, -5.960464477539063e-08,
                                    5.960464477539063e-08]
    np.testing.assert_array_equal(mine, values.astype(np.float16))


def test_weights_the_branches_read_from_the_main_graph_are_the_converters_bytes(tmp_path):
    """torch's dynamo export of a model with control flow keeps its weights in the main
    graph, read from an If's branches: those the pass casts (every read numeric data) hold
    the bytes the converter gives them."""
    from .passes_models import captured_weights_model

    model, _ = captured_weights_model()
    path = tmp_path / "captured.onnx"
    onnx.save(model, str(path))
    weightstore.add_scenario(path, "h", ["cast-fp16"])
    mine = _cast_weights(runnable_variant(path, "h"))
    theirs = _converted(model)
    assert sorted(mine) == ["conv.weight", "deep.weight", "shared.weight"]
    for w in mine:
        assert mine[w].shape == theirs[w].shape, w
        assert (mine[w].view(np.uint16) == theirs[w].view(np.uint16)).all(), w
