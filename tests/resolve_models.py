"""Small models for the resolution and loading tests, saved with external data.

Each builder returns a model with real (seeded) weights; :func:`save_package_model`
writes it as a model file plus one combined weight file with blake3 checksums (identical
payloads stored once), the form packages use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import _get_all_tensors

from tests import passes_models as pm
from weightstore.convert.api import convert_to_external

H = 64


def _w(name: str, shape: list[int]) -> TensorProto:
    return pm._init(name, shape)


def _branch(name: str, weight: str, x: str = "x") -> onnx.GraphProto:
    """A branch computing ``MatMul(x, weight)`` with its own initializer."""
    return helper.make_graph([helper.make_node("MatMul", [x, weight], [f"{name}_y"])], name,
                             [], [pm._vi(f"{name}_y", TensorProto.FLOAT, [1, H])],
                             initializer=[_w(weight, [H, H])])


def shape_if_nodes(value: str, equals: int, out: str) -> list[onnx.NodeProto]:
    """``out = If(Equal(Gather(Shape(value), 0), equals))``, as exporters write a batch
    test: ``w_then`` live in the then-branch, ``w_else`` in the else-branch."""
    return [
        helper.make_node("Shape", [value], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
            np.array(0, dtype=np.int64), "zero")),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Constant", [], ["wanted"], value=numpy_helper.from_array(
            np.array(equals, dtype=np.int64), "wanted")),
        helper.make_node("Equal", ["d0", "wanted"], ["cond"]),
        helper.make_node("If", ["cond"], [out], then_branch=_branch("then", "w_then"),
                         else_branch=_branch("else", "w_else")),
    ]


def shape_if_model(batch: int | str = 1) -> onnx.ModelProto:
    """``If(Equal(Gather(Shape(x), 0), 1))``: with a static batch of 1 the then-branch is
    live and ``w_else`` is dead."""
    nodes = [*shape_if_nodes("x", 1, "h"), helper.make_node("MatMul", ["h", "w_out"], ["y"])]
    graph = helper.make_graph(nodes, "shape_if", [pm._vi("x", TensorProto.FLOAT, [batch, H])],
                              [pm._vi("y", TensorProto.FLOAT, [batch, H])],
                              initializer=[_w("w_out", [H, H])])
    return pm._model(graph)


def not_if_model() -> onnx.ModelProto:
    """``If(Not(Constant(false)))``: the then-branch is live, ``w_else`` is dead."""
    nodes = [
        helper.make_node("Constant", [], ["flag"], value=numpy_helper.from_array(
            np.array(False), "flag")),
        helper.make_node("Not", ["flag"], ["go"]),
        helper.make_node("If", ["go"], ["y"], then_branch=_branch("then", "w_then"),
                         else_branch=_branch("else", "w_else")),
    ]
    graph = helper.make_graph(nodes, "not_if", [pm._vi("x", TensorProto.FLOAT, [1, H])],
                              [pm._vi("y", TensorProto.FLOAT, [1, H])])
    return pm._model(graph)


def closure_model() -> onnx.ModelProto:
    """Tied weights (two names, same bytes), a weight read twice, a dynamic If whose
    branches capture an outer weight and hold their own, a model-local function holding a
    Constant weight, and dead weights (unused, and read only by a dead node)."""
    tied = pm._w("tied", [H, H])
    gelu = helper.make_function(
        "local", "Scale", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
            (1 + pm._w("k", [H])).astype(np.float32), "k")),
         helper.make_node("Mul", ["a", "k"], ["b"])],
        opset_imports=[helper.make_opsetid("", pm.OPSET)])
    then = helper.make_graph(
        [helper.make_node("MatMul", ["h2", "w_cap"], ["t1"]),
         helper.make_node("MatMul", ["t1", "w_branch"], ["t_y"])], "then", [],
        [pm._vi("t_y", TensorProto.FLOAT, [1, H])], initializer=[_w("w_branch", [H, H])])
    other = helper.make_graph([helper.make_node("Add", ["h2", "w_bias"], ["e_y"])], "else",
                              [], [pm._vi("e_y", TensorProto.FLOAT, [1, H])])
    nodes = [
        helper.make_node("MatMul", ["x", "tied_a"], ["h1"]),
        helper.make_node("MatMul", ["h1", "tied_b"], ["h2"]),
        helper.make_node("If", ["flag"], ["h3"], then_branch=then, else_branch=other),
        helper.make_node("Scale", ["h3"], ["h4"], domain="local"),
        helper.make_node("MatMul", ["h4", "w_dead_reader"], ["unused"]),
        helper.make_node("Add", ["h4", "w_bias"], ["y"]),
    ]
    inits = [numpy_helper.from_array(tied, "tied_a"), numpy_helper.from_array(tied, "tied_b"),
             _w("w_cap", [H, H]), _w("w_bias", [1, H]), _w("w_dead", [H, H]),
             _w("w_dead_reader", [H, H])]
    graph = helper.make_graph(nodes, "closure", [pm._vi("x", TensorProto.FLOAT, [1, H]),
                                                 pm._vi("flag", TensorProto.BOOL, [])],
                              [pm._vi("y", TensorProto.FLOAT, [1, H])], initializer=inits)
    return _with_function(graph, gelu)


def _with_function(graph: onnx.GraphProto, function: onnx.FunctionProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", pm.OPSET),
                                                    helper.make_opsetid("local", 1)],
                              ir_version=8, functions=[function])
    onnx.checker.check_model(model)
    return model


def save_package_model(model: onnx.ModelProto, folder: Path, name: str = "model", *,
                       checksum: bool = True) -> Path:
    """``model`` as ``folder/<name>.onnx`` plus one combined weight file, whose SHA-1 its
    external data declares (onnx.proto's ``checksum``: a load then reads the whole file
    to verify it) unless ``checksum`` is False."""
    folder.mkdir(parents=True, exist_ok=True)
    inline = folder / f".{name}.inline.onnx"
    onnx.save(model, str(inline))
    out = folder / f"{name}.onnx"
    convert_to_external(inline, out, threshold=1024)
    inline.unlink()
    if not checksum:
        proto = onnx.load(str(out), load_external_data=False)
        for t in _get_all_tensors(proto):
            kept = [(e.key, e.value) for e in t.external_data if e.key != "checksum"]
            del t.external_data[:]
            for key, value in kept:
                t.external_data.add(key=key, value=value)
        out.write_bytes(proto.SerializeToString())
    return out
