"""Small realistic models for the rewrite-pass tests, and the helpers that run them.

Each builder returns a model with real (seeded) weights, most of them over the passes'
small-value limit so that the passes see them without payload, and the inputs to run it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.sites import iter_tensor_sites
from weightstore.convert.encoding import clear_payload
from weightstore.passes.base import SMALL_VALUE_LIMIT
from weightstore.passes.cleanup import prune
from weightstore.passes.rewriting import apply_record, derivations_of
from weightstore.scenarios.derive import base_values, materialize

OPSET = 17
Inputs = dict[str, np.ndarray]


def _w(name: str, shape: Sequence[int], scale: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return (rng.standard_normal(tuple(shape)) * scale).astype(np.float32)


def _init(name: str, shape: Sequence[int], scale: float = 0.1) -> TensorProto:
    return numpy_helper.from_array(_w(name, shape, scale), name)


def _const(output: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=numpy_helper.from_array(array, output))


def _vi(name: str, elem: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def _model(graph: onnx.GraphProto, opset: int = OPSET, **kwargs) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8, **kwargs)
    onnx.checker.check_model(model)
    return model


def _rand(shape: Sequence[int], seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)


# -- models -------------------------------------------------------------------------------------

def attention_block(hidden: int = 48, heads: int = 4) -> tuple[onnx.ModelProto, list[Inputs]]:
    """Self-attention with separate Q/K/V projections, plus a second Q/K/V group inside a
    dynamic If branch (subgraph initializers) and a key weight also read elsewhere."""
    hd = hidden // heads
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array([0, 0, heads, hd], np.int64), "heads_shape"),
             numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "merge_shape"),
             numpy_helper.from_array(np.array(math.sqrt(hd), np.float32), "scale")]
    for part in ("q", "k", "v"):
        inits += [_init(f"attn.{part}.weight", [hidden, hidden]),
                  _init(f"attn.{part}.bias", [hidden])]
        nodes += [helper.make_node("MatMul", ["x", f"attn.{part}.weight"], [f"{part}_mm"]),
                  helper.make_node("Add", [f"{part}_mm", f"attn.{part}.bias"], [f"{part}_lin"]),
                  helper.make_node("Reshape", [f"{part}_lin", "heads_shape"], [f"{part}_h"])]
    nodes += [
        helper.make_node("Transpose", ["q_h"], ["q_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_h"], ["k_t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v_h"], ["v_t"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"]),
        helper.make_node("Div", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["merged"]),
        helper.make_node("MatMul", ["merged", "attn.o.weight"], ["attn_out"]),
        # the key weight is also read by another MatMul on another input: it must stay
        helper.make_node("MatMul", ["attn_out", "attn.k.weight"], ["side"]),
    ]
    inits.append(_init("attn.o.weight", [hidden, hidden]))
    # a dynamic If whose then-branch projects Q/K/V with its own initializers
    sub_nodes = [helper.make_node("MatMul", ["side", f"sub.{p}.weight"], [f"sub_{p}"])
                 for p in ("q", "k", "v")]
    sub_nodes += [helper.make_node("Add", ["sub_q", "sub_k"], ["sub_qk"]),
                  helper.make_node("Add", ["sub_qk", "sub_v"], ["sub_out"])]
    then = helper.make_graph(sub_nodes, "then", [], [_vi("sub_out", TensorProto.FLOAT, [])],
                             initializer=[_init(f"sub.{p}.weight", [hidden, hidden])
                                          for p in ("q", "k", "v")])
    other = helper.make_graph([helper.make_node("Identity", ["side"], ["other_out"])], "else",
                              [], [_vi("other_out", TensorProto.FLOAT, [])])
    nodes.append(helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other))
    graph = helper.make_graph(
        nodes, "attention",
        [_vi("x", TensorProto.FLOAT, ["batch", "seq", hidden]), _vi("flag", TensorProto.BOOL, [])],
        [_vi("y", TensorProto.FLOAT, ["batch", "seq", hidden])], initializer=inits)
    x = _rand([2, 5, hidden])
    return _model(graph), [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]


def float_mlp() -> tuple[onnx.ModelProto, list[Inputs]]:
    """Embedding, two dense layers and a Clip whose float bounds must stay exact."""
    inits = [_init("emb.weight", [50, 64]), _init("fc1.weight", [64, 128]),
             _init("fc1.bias", [128]), _init("fc2.weight", [128, 64]), _init("fc2.bias", [64]),
             numpy_helper.from_array(np.array(-0.25, np.float32), "clip.min"),
             numpy_helper.from_array(np.array(0.25, np.float32), "clip.max"),
             _init("wide.bias", [2048], 0.01)]
    nodes = [
        helper.make_node("Gather", ["emb.weight", "ids"], ["emb"], axis=0),
        helper.make_node("MatMul", ["emb", "fc1.weight"], ["h1"]),
        helper.make_node("Add", ["h1", "fc1.bias"], ["h1b"]),
        helper.make_node("Relu", ["h1b"], ["a1"]),
        helper.make_node("MatMul", ["a1", "fc2.weight"], ["h2"]),
        helper.make_node("Add", ["h2", "fc2.bias"], ["h2b"]),
        helper.make_node("Clip", ["h2b", "clip.min", "clip.max"], ["clipped"]),
        helper.make_node("ReduceSum", ["clipped"], ["total"], keepdims=1),
        helper.make_node("Add", ["total", "wide.bias"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "mlp", [_vi("ids", TensorProto.INT64, ["batch", 3])],
                              [_vi("y", TensorProto.FLOAT, ["batch", 2048])], initializer=inits)
    ids = np.random.default_rng(3).integers(0, 50, size=(4, 3), dtype=np.int64)
    return _model(graph), [{"ids": ids}]


def gemm_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """Linear layers exported as Gemm(transB=1); one weight read by two Gemms, one Gemm
    with transB=0 that must not change."""
    inits = [_init("l1.weight", [40, 48]), _init("l1.bias", [40]),
             _init("l2.weight", [40, 40]), _init("l3.weight", [40, 32])]
    nodes = [
        helper.make_node("Gemm", ["x", "l1.weight", "l1.bias"], ["h1"], transB=1, alpha=0.5,
                         name="l1"),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "l2.weight"], ["h2"], transB=1, name="l2a"),
        helper.make_node("Gemm", ["h2", "l2.weight"], ["h3"], transB=1, beta=2.0, name="l2b"),
        helper.make_node("Gemm", ["h3", "l3.weight"], ["y"], transB=0, name="l3"),
    ]
    graph = helper.make_graph(nodes, "gemm", [_vi("x", TensorProto.FLOAT, [4, 48])],
                              [_vi("y", TensorProto.FLOAT, [4, 32])], initializer=inits)
    return _model(graph), [{"x": _rand([4, 48])}]


def conv_bn_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """Two Conv + BatchNormalization pairs (with and without conv bias) and one pair that
    must not fold (the Conv output is also read elsewhere)."""
    c = 48
    inits = [_init("c1.weight", [c, 3, 3, 3], 0.1), _init("c1.bias", [c]),
             _init("c2.weight", [c, c, 3, 3], 0.02), _init("c3.weight", [c, c, 1, 1], 0.05)]
    for bn in ("bn1", "bn2", "bn3"):
        inits += [numpy_helper.from_array(1 + _w(f"{bn}.scale", [c]), f"{bn}.scale"),
                  _init(f"{bn}.bias", [c]), _init(f"{bn}.mean", [c]),
                  numpy_helper.from_array(0.5 + np.abs(_w(f"{bn}.var", [c])), f"{bn}.var")]

    def bn(name: str, x: str, y: str) -> onnx.NodeProto:
        return helper.make_node("BatchNormalization", [x, f"{name}.scale", f"{name}.bias",
                                                       f"{name}.mean", f"{name}.var"], [y],
                                epsilon=1e-3)

    nodes = [
        helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["c1"], pads=[1, 1, 1, 1]),
        bn("bn1", "c1", "b1"),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2.weight"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        bn("bn2", "c2", "b2"),
        helper.make_node("Conv", ["b2", "c3.weight"], ["c3"]),
        bn("bn3", "c3", "b3"),
        helper.make_node("Add", ["b3", "c3"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "convbn", [_vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [_vi("y", TensorProto.FLOAT, [1, c, 8, 8])], initializer=inits)
    return _model(graph), [{"x": _rand([1, 3, 16, 16])}]


def constant_if_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """An If on a Constant condition whose chosen branch holds a nested If on a constant
    (folded too), a dynamic If with weights (moved whole), a branch initializer, a branch
    output that is an initializer, and a name another subgraph defines as well."""
    hidden = 40
    f = TensorProto.FLOAT
    # depth 2, inside the chosen branch: condition False -> else branch
    inner_then = helper.make_graph(
        [_const("w_a", _w("w_a", [hidden, hidden])),
         helper.make_node("MatMul", ["x", "w_a"], ["p_then"])],
        "inner_then", [], [_vi("p_then", f, [])])
    inner_else = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_b"], ["p_else"])],
        "inner_else", [], [_vi("p_else", f, [])], initializer=[_init("w_b", [hidden, hidden])])
    # a dynamic If inside the chosen branch: its weights move with it, under their names
    dyn_then = helper.make_graph(
        [_const("s_big", 1 + _w("s_big", [hidden, hidden])),
         helper.make_node("MatMul", ["h", "s_big"], ["q_then"])],
        "dyn_then", [], [_vi("q_then", f, [])])
    dyn_else = helper.make_graph(
        [helper.make_node("MatMul", ["h", "u_big"], ["q_else"])],
        "dyn_else", [], [_vi("q_else", f, [])], initializer=[_init("u_big", [hidden, hidden])])
    chosen = helper.make_graph(
        [_const("inner_cond", np.array(False)),
         helper.make_node("If", ["inner_cond"], ["p"], then_branch=inner_then,
                          else_branch=inner_else),
         helper.make_node("MatMul", ["p", "w_c"], ["h0"]),
         _const("shift", _w("shift", [hidden], 1.0)),
         helper.make_node("Add", ["h0", "shift"], ["h"]),
         helper.make_node("If", ["flag"], ["q"], then_branch=dyn_then, else_branch=dyn_else),
         helper.make_node("Tanh", ["q"], ["y_then"])],
        "chosen", [], [_vi("y_then", f, []), _vi("w_c", f, [])],
        initializer=[_init("w_c", [hidden, hidden])])
    dropped = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_dropped"], ["y_else"])], "dropped", [],
        [_vi("y_else", f, []), _vi("w_dropped", f, [])],
        initializer=[_init("w_dropped", [hidden, hidden])])
    # another subgraph defines "h": the inlined "h" must get a fresh name
    side_then = helper.make_graph([helper.make_node("Relu", ["x"], ["h"])], "side_then", [],
                                  [_vi("h", f, [])])
    side_else = helper.make_graph([helper.make_node("Neg", ["x"], ["z_else"])], "side_else",
                                  [], [_vi("z_else", f, [])])
    nodes = [
        _const("cond", np.array(True)),
        helper.make_node("If", ["cond"], ["y", "w_out"], then_branch=chosen,
                         else_branch=dropped),
        helper.make_node("If", ["flag"], ["z"], then_branch=side_then, else_branch=side_else),
        helper.make_node("Add", ["y", "z"], ["yz"]),
        helper.make_node("MatMul", ["yz", "w_out"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "constant-if",
        [_vi("x", f, [2, hidden]), _vi("flag", TensorProto.BOOL, [])],
        [_vi("out", f, [2, hidden])])
    x = _rand([2, hidden])
    return _model(graph), [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]


def captured_weights_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """Every weight in the main graph, read from the branches of an If, as torch's dynamo
    exporter writes a model with control flow (silero-vad's op 18 export): a conv kernel
    and a matrix both branches read, a matrix a nested If reads two levels down, a matrix
    one branch also reads as a non-data input (Max), and a small bias."""
    hidden, f = 32, TensorProto.FLOAT

    def out(name: str) -> onnx.ValueInfoProto:  # a matrix of any shape
        return _vi(name, f, [f"{name}_rows", f"{name}_columns"])

    nested_then = helper.make_graph(
        [helper.make_node("MatMul", ["h", "deep.weight"], ["d_then"])],
        "nested_then", [], [out("d_then")])
    nested_else = helper.make_graph([helper.make_node("Neg", ["h"], ["d_else"])],
                                    "nested_else", [], [out("d_else")])
    then_branch = helper.make_graph(
        [helper.make_node("Conv", ["image", "conv.weight", "conv.bias"], ["c"], pads=[1, 1]),
         helper.make_node("Flatten", ["c"], ["flat"]),
         helper.make_node("MatMul", ["flat", "shared.weight"], ["h"]),
         helper.make_node("If", ["flag"], ["d"], then_branch=nested_then,
                          else_branch=nested_else),
         helper.make_node("Mul", ["d", "mixed.weight"], ["y_then"])],
        "then", [], [out("y_then")])
    else_branch = helper.make_graph(
        [helper.make_node("Conv", ["image", "conv.weight", "conv.bias"], ["c2"],
                          pads=[1, 1]),
         helper.make_node("Flatten", ["c2"], ["flat2"]),
         helper.make_node("MatMul", ["flat2", "shared.weight"], ["h2"]),
         helper.make_node("Max", ["h2", "mixed.weight"], ["y_else"])],
        "else", [], [out("y_else")])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then_branch,
                          else_branch=else_branch)],
        "captured",
        [_vi("image", f, [1, 2, hidden // 2]), _vi("flag", TensorProto.BOOL, [])],
        [out("y")],
        initializer=[_init("conv.weight", [2, 2, 3]), _init("conv.bias", [2]),
                     _init("shared.weight", [hidden, hidden]),
                     _init("deep.weight", [hidden, hidden]),
                     _init("mixed.weight", [hidden, hidden])])
    image = _rand([1, 2, hidden // 2])
    return _model(graph), [{"image": image, "flag": np.array(True)},
                           {"image": image, "flag": np.array(False)}]


def dead_code_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """Dead chains, unused initializers, a dead node whose subgraph captures a weight, a
    live If whose branch holds dead nodes, a function only a dead node calls, stale
    value_info, and an initializer that is also a graph input (kept)."""
    hidden = 40
    f = TensorProto.FLOAT
    fn = helper.make_function("local", "Scale2", ["X"], ["Y"],
                              [_const("two", np.array(2.0, np.float32)),
                               helper.make_node("Mul", ["X", "two"], ["Y"])],
                              [helper.make_opsetid("", OPSET)])
    live_fn = helper.make_function("local", "Keep", ["X"], ["Y"],
                                   [helper.make_node("Relu", ["X"], ["Y"]),
                                    helper.make_node("Neg", ["X"], ["unused_in_fn"])],
                                   [helper.make_opsetid("", OPSET)])
    dead_sub = helper.make_graph([helper.make_node("MatMul", ["x", "w_captured"], ["cap"])],
                                 "dead_sub", [], [_vi("cap", f, [])])
    dead_sub_else = helper.make_graph([helper.make_node("Identity", ["x"], ["cap2"])],
                                      "dead_sub_else", [], [_vi("cap2", f, [])])
    live_then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_live"], ["lt"]),
         helper.make_node("MatMul", ["x", "w_branch_dead"], ["lt_dead"]),
         helper.make_node("Tanh", ["lt_dead"], ["lt_dead2"])],
        "live_then", [], [_vi("lt", f, [])],
        initializer=[_init("w_branch_dead", [hidden, hidden])])
    live_else = helper.make_graph([helper.make_node("Identity", ["x"], ["le"])], "live_else",
                                  [], [_vi("le", f, [])])
    nodes = [
        helper.make_node("MatMul", ["x", "w_dead"], ["d1"]),
        helper.make_node("Tanh", ["d1"], ["d2"]),
        helper.make_node("Scale2", ["d2"], ["d3"], domain="local"),
        helper.make_node("If", ["flag"], ["dead_if"], then_branch=dead_sub,
                         else_branch=dead_sub_else),
        helper.make_node("If", ["flag"], ["live_if"], then_branch=live_then,
                         else_branch=live_else),
        helper.make_node("Keep", ["live_if"], ["kept"], domain="local"),
        helper.make_node("Add", ["kept", "offset"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "dead-code",
        [_vi("x", f, [2, hidden]), _vi("flag", TensorProto.BOOL, []), _vi("offset", f, [hidden])],
        [_vi("y", f, [2, hidden])],
        initializer=[_init("w_dead", [hidden, hidden]), _init("w_captured", [hidden, hidden]),
                     _init("w_live", [hidden, hidden]), _init("w_unused", [hidden, hidden]),
                     _init("offset", [hidden])],
        value_info=[_vi("d2", f, [2, hidden]), _vi("live_if", f, [2, hidden])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("local", 1)],
                              ir_version=8, functions=[fn, live_fn])
    onnx.checker.check_model(model)
    x = _rand([2, hidden])
    return model, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}]


def with_constant_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every main-graph initializer held by a Constant node in a typed field
    (``float_data``, ``int64_data``), as Paddle2ONNX and older tf2onnx export weights."""
    out = copy_model(model)
    g = out.graph
    nodes = []
    for t in g.initializer:
        array = numpy_helper.to_array(t)
        typed = helper.make_tensor(t.name, t.data_type, list(array.shape),
                                   array.flatten().tolist())
        assert not typed.raw_data
        nodes.append(helper.make_node("Constant", [], [t.name], value=typed,
                                      name=f"{t.name}.const"))
    del g.initializer[:]
    kept = list(g.node)
    del g.node[:]
    g.node.extend(nodes + kept)
    onnx.checker.check_model(out)
    return out


def conv_bn_constant_model() -> tuple[onnx.ModelProto, list[Inputs]]:
    """:func:`conv_bn_model` with its weights in Constant nodes (typed ``float_data``)."""
    model, inputs = conv_bn_model()
    return with_constant_weights(model), inputs


# -- helpers ----------------------------------------------------------------------------------

def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def tensor_nbytes(tensor: TensorProto) -> int:
    if tensor.data_type == TensorProto.STRING:
        return 0
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return itemsize * math.prod(tensor.dims)


def metadata_copy(model: onnx.ModelProto, limit: int = SMALL_VALUE_LIMIT) -> onnx.ModelProto:
    """What a pass sees: payloads of tensors over ``limit`` bytes omitted, the rest inline."""
    out = copy_model(model)
    for site in iter_tensor_sites(out):
        if tensor_nbytes(site.tensor) > limit:
            clear_payload(site.tensor)
    return out


def runnable(full: onnx.ModelProto, protos: Sequence) -> onnx.ModelProto:
    """The base model with every payload, rewritten by ``protos``, derived weights computed."""
    out = copy_model(full)
    derivations = {}
    for proto in protos:
        apply_record(out, proto)
        derivations.update(derivations_of(proto))
    prune(out)
    materialize(out, derivations, base_values(full))
    return out


def encoder_with_fixed_pooler(use_pooler: bool = True) -> onnx.ModelProto:
    """The sample encoder with its ``use_pooler`` input fixed by a Constant node, as a
    deployment that always pools would export it: the pooler If becomes foldable."""
    from .samples import make_encoder

    model = make_encoder()
    kept = [i for i in model.graph.input if i.name != "use_pooler"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.node.insert(0, _const("use_pooler", np.array(use_pooler)))
    onnx.checker.check_model(model)
    return model
