"""Shape-like inputs reached through model-local functions stay inline."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.shape_inputs import function_shape_positions, shape_input_names
from weightstore.convert import convert_to_external

from .samples import run_onnxruntime

LOCAL = "local"
OPSETS = [helper.make_opsetid("", 18), helper.make_opsetid(LOCAL, 1)]
BODY_OPSETS = [helper.make_opsetid("", 18)]


def _function(name: str, inputs: list[str], outputs: list[str],
              nodes: list[onnx.NodeProto], overload: str | None = None) -> onnx.FunctionProto:
    opsets = [*BODY_OPSETS, helper.make_opsetid(LOCAL, 1)]
    return helper.make_function(LOCAL, name, inputs, outputs, nodes, opsets, overload=overload)


def _call(name: str, inputs: list[str], outputs: list[str], **kwargs) -> onnx.NodeProto:
    return helper.make_node(name, inputs, outputs, domain=LOCAL, **kwargs)


def _reshape_function(name: str = "R") -> onnx.FunctionProto:
    """``R(X, shp) = Reshape(X, shp)``."""
    return _function(name, ["X", "shp"], ["Y"], [helper.make_node("Reshape", ["X", "shp"], ["Y"])])


def _model(nodes: list[onnx.NodeProto], functions: list[onnx.FunctionProto],
           initializers: list[onnx.TensorProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "main", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=OPSETS, functions=functions, ir_version=8)
    model.ir_version = 10
    return model


def _weights() -> tuple[onnx.TensorProto, onnx.TensorProto]:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((2, 6)).astype(np.float32), "W")
    s = numpy_helper.from_array(np.array([3, 4], dtype=np.int64), "S")
    return w, s


def _io() -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    return ([helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 6])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4])])


def _reshape_model() -> onnx.ModelProto:
    """``Y = R(X + W, S)`` with ``R(X, shp) = Reshape(X, shp)``."""
    nodes = [helper.make_node("Add", ["X", "W"], ["A"]), _call("R", ["A", "S"], ["Y"])]
    return _model(nodes, [_reshape_function()], list(_weights()), *_io())


def _nested_model() -> onnx.ModelProto:
    """``Y = A(X + W, S)``; ``A(P, Q) = B(P, Q)``; ``B(U, V) = Reshape(U, V)``."""
    a = _function("A", ["P", "Q"], ["O"], [_call("B", ["P", "Q"], ["O"])])
    b = _function("B", ["U", "V"], ["O"], [helper.make_node("Reshape", ["U", "V"], ["O"])])
    nodes = [helper.make_node("Add", ["X", "W"], ["T"]), _call("A", ["T", "S"], ["Y"])]
    return _model(nodes, [a, b], list(_weights()), *_io())


def _if_model() -> onnx.ModelProto:
    """``F(X, shp, c)`` reshapes ``X`` by ``shp`` inside both branches of an ``If``."""
    out = helper.make_tensor_value_info("Z", TensorProto.FLOAT, [3, 4])
    then = helper.make_graph([helper.make_node("Reshape", ["X", "shp"], ["Z"])], "then", [],
                             [out])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["N"]),
                               helper.make_node("Reshape", ["N", "shp"], ["Z"])], "else", [],
                              [out])
    f = _function("F", ["X", "shp", "c"], ["O"], [
        helper.make_node("If", ["c"], ["O"], then_branch=then, else_branch=other)])
    w, s = _weights()
    c = numpy_helper.from_array(np.array(True), "C")
    nodes = [helper.make_node("Add", ["X", "W"], ["T"]), _call("F", ["T", "S", "C"], ["Y"])]
    return _model(nodes, [f], [w, s, c], *_io())


def _assert_runs_identically(model: onnx.ModelProto, save_model, tmp_path) -> onnx.ModelProto:
    onnx.checker.check_model(model, full_check=True)
    src = save_model(model)
    out = tmp_path / "ext.onnx"
    convert_to_external(src, out, threshold=0)
    converted = onnx.load(str(out), load_external_data=False)
    inputs = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    expected = run_onnxruntime(model, inputs)
    actual = run_onnxruntime(out, inputs)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual, strict=True):
        assert e.shape == a.shape
        assert e.tobytes() == a.tobytes()
    return converted


def _external(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}


def test_function_argument_reaching_reshape():
    model = _reshape_model()
    assert function_shape_positions(model) == {(LOCAL, "R", ""): frozenset({1})}
    names = shape_input_names(model)
    assert "S" in names
    assert "A" not in names and "W" not in names


def test_function_argument_stays_inline_and_runs(save_model, tmp_path):
    converted = _assert_runs_identically(_reshape_model(), save_model, tmp_path)
    assert _external(converted) == {"W"}


def test_nested_functions():
    model = _nested_model()
    assert function_shape_positions(model) == {(LOCAL, "A", ""): frozenset({1}),
                                               (LOCAL, "B", ""): frozenset({1})}
    names = shape_input_names(model)
    assert {"S", "Q", "V"} <= names
    assert not {"T", "W", "P", "U"} & names


def test_nested_functions_run(save_model, tmp_path):
    converted = _assert_runs_identically(_nested_model(), save_model, tmp_path)
    assert _external(converted) == {"W"}


def test_constant_in_function_body_passed_on():
    """A Constant inside one function, passed to another that reshapes with it."""
    shape = numpy_helper.from_array(np.array([3, 4], dtype=np.int64), "k")
    outer = _function("Outer", ["P"], ["O"], [
        helper.make_node("Constant", [], ["k"], value=shape),
        _call("R", ["P", "k"], ["O"]),
    ])
    nodes = [helper.make_node("Add", ["X", "W"], ["T"]), _call("Outer", ["T"], ["Y"])]
    model = _model(nodes, [outer, _reshape_function()], [_weights()[0]], *_io())
    assert "k" in shape_input_names(model)
    assert (LOCAL, "Outer", "") not in function_shape_positions(model)


def test_formal_input_used_in_subgraph():
    model = _if_model()
    # shp: used by name inside both branches; c: the If condition
    assert function_shape_positions(model) == {(LOCAL, "F", ""): frozenset({1, 2})}
    names = shape_input_names(model)
    assert {"S", "C"} <= names
    assert not {"T", "W"} & names


def test_formal_input_used_in_subgraph_runs(save_model, tmp_path):
    converted = _assert_runs_identically(_if_model(), save_model, tmp_path)
    assert _external(converted) == {"W"}


def test_if_condition_stays_inline_and_runs(save_model, tmp_path):
    """onnxruntime folds an If on a constant condition but cannot read it as external data."""
    out = helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 6])
    then = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Z"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Sub", ["X", "W"], ["Z"])], "else", [], [out])
    nodes = [helper.make_node("If", ["C"], ["Y"], then_branch=then, else_branch=other)]
    c = numpy_helper.from_array(np.array(True), "C")
    model = _model(nodes, [], [_weights()[0], c], _io()[0],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 6])])
    assert shape_input_names(model) == {"C"}
    converted = _assert_runs_identically(model, save_model, tmp_path)
    assert _external(converted) == {"W"}


def test_call_inside_subgraph_of_main_graph():
    out = helper.make_tensor_value_info("Z", TensorProto.FLOAT, [3, 4])
    branch = helper.make_graph([_call("R", ["X", "S"], ["Z"])], "branch", [], [out])
    nodes = [helper.make_node("If", ["C"], ["Y"], then_branch=branch, else_branch=branch)]
    model = _model(nodes, [_reshape_function()], list(_weights()), *_io())
    assert "S" in shape_input_names(model)


@pytest.mark.parametrize("order", [0, 1])
def test_recursion_terminates(order):
    """Self- and mutually recursive functions (not runnable, but must not hang)."""
    self_call = _function("Self", ["X", "s"], ["Y"], [_call("Self", ["X", "s"], ["Y"])])
    # F passes its inputs swapped to G; G reshapes with its 2nd input and passes its 1st
    # back to F's 1st, which reaches G's 2nd.
    f = _function("F", ["a", "b"], ["Y"], [_call("G", ["b", "a"], ["Y"])])
    g = _function("G", ["p", "q"], ["Y"], [
        helper.make_node("Reshape", ["p", "q"], ["Z"]),
        _call("F", ["p", "Z"], ["Y"]),
    ])
    functions = [self_call, f, g] if order == 0 else [g, f, self_call]
    nodes = [_call("Self", ["X", "S1"], ["Y1"]), _call("F", ["X", "S2"], ["Y2"]),
             _call("G", ["X", "S3"], ["Y"])]
    model = _model(nodes, functions, [], *_io())
    positions = function_shape_positions(model)
    assert (LOCAL, "Self", "") not in positions
    # G: q directly, p through F's 1st; F: a through G's 2nd, b through G's 1st.
    assert positions[(LOCAL, "G", "")] == frozenset({0, 1})
    assert positions[(LOCAL, "F", "")] == frozenset({0, 1})
    names = shape_input_names(model)
    assert {"S2", "S3", "X"} <= names
    assert "S1" not in names


def test_unrelated_names_stay_out():
    add = _function("Plus", ["X", "Y"], ["O"], [helper.make_node("Add", ["X", "Y"], ["O"])])
    # same name in another domain, and another overload of R: not the reshaping function
    nodes = [
        _call("Plus", ["X", "W"], ["P"]),
        _call("R", ["P", "S"], ["Q"]),
        helper.make_node("R", ["Q", "U"], ["V"], domain="elsewhere"),
        _call("R", ["V", "K"], ["Y"], overload="flat"),
    ]
    flat = _function("R", ["X", "shp"], ["Y"], [helper.make_node("Flatten", ["X"], ["Y"])],
                     overload="flat")
    model = _model(nodes, [add, _reshape_function(), flat], [], *_io())
    assert function_shape_positions(model) == {(LOCAL, "R", ""): frozenset({1})}
    names = shape_input_names(model)
    assert names == {"S", "shp"}  # shp: R's own Reshape


def test_model_without_functions_unchanged(encoder_model):
    direct = {n.input[1] for g in [encoder_model.graph] for n in g.node
              if n.op_type == "Reshape"}
    assert direct <= shape_input_names(encoder_model)


@pytest.mark.parametrize("op", ["Reshape", "Expand", "Unsqueeze", "Slice", "ReduceSum"])
def test_shape_input_behind_identity_stays_inline(tmp_path, op):
    """Exporters put ``Identity`` nodes in front of shared shape constants; onnxruntime's
    shape inference reads through them, so what they copy must stay inline too (even at
    threshold 0), in a function body as in the graph. A Cast it does not read through: its
    int32 input stays inline as a shape value, not as a shape input."""
    data = {"Reshape": [3, 4], "Expand": [2, 6], "Unsqueeze": [0], "Slice": [0],
            "ReduceSum": [1]}[op]
    extra = {"Slice": ["S_end"]}.get(op, [])
    s = numpy_helper.from_array(np.array(data, dtype=np.int64), "S")
    end = numpy_helper.from_array(np.array([1], dtype=np.int64), "S_end")
    w, _ = _weights()
    body = _function("F", ["X", "shp"], ["Y"], [
        helper.make_node("Identity", ["shp"], ["shp1"]),
        helper.make_node(op, ["X", "shp1", *extra], ["Y"])])
    cast = numpy_helper.from_array(np.array(data, dtype=np.int32), "C")
    nodes = [helper.make_node("Add", ["X", "W"], ["A"]),
             helper.make_node("Identity", ["S"], ["S1"]),
             helper.make_node("Identity", ["S1"], ["S2"]),
             helper.make_node(op, ["A", "S2", *extra], ["Y"]),
             helper.make_node("Cast", ["C"], ["C1"], to=TensorProto.INT64),
             helper.make_node(op, ["A", "C1", *extra], ["Y2"]),
             _call("F", ["A", "S"], ["Y3"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("Y", "Y2", "Y3")]
    model = _model(nodes, [body], [w, s, cast] + ([end] if extra else []), _io()[0], outputs)
    names = shape_input_names(model)
    assert {"S", "S1", "S2", "C1"} <= names
    src, out = tmp_path / "m.onnx", tmp_path / "x.onnx"
    onnx.save(model, str(src))
    convert_to_external(src, out, threshold=0, jobs=1)
    external = {t.name for t in onnx.load(str(out), load_external_data=False).graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    assert external == {"W"}
    x = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    for a, b in zip(run_onnxruntime(out, x), run_onnxruntime(src, x), strict=True):
        assert a.tobytes() == b.tobytes()


def test_split_to_sequence_sizes_stay_inline(tmp_path):
    """onnxruntime's shape inference reads SplitToSequence's ``split`` too."""
    graph = helper.make_graph(
        [helper.make_node("SplitToSequence", ["X", "sizes"], ["seq"], axis=1),
         helper.make_node("SequenceAt", ["seq", "at"], ["Y"])], "main",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([2, 4], dtype=np.int64), "sizes"),
         numpy_helper.from_array(np.array(1, dtype=np.int64), "at")])
    model = helper.make_model(graph, opset_imports=BODY_OPSETS, ir_version=8)
    assert "sizes" in shape_input_names(model)
    src, out = tmp_path / "m.onnx", tmp_path / "x.onnx"
    onnx.save(model, str(src))
    convert_to_external(src, out, threshold=0, jobs=1)
    x = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    assert run_onnxruntime(out, x)[0].tobytes() == run_onnxruntime(src, x)[0].tobytes()


def _shape_arithmetic_model() -> onnx.ModelProto:
    """What the TorchScript exporter writes for attention and recurrent layers: a sliced
    ``Shape`` plus an exporter ``Constant`` of ``[1]``, reshaped into a Slice's ``starts``,
    and the same sum, cast to float, scaling the output (no shape input downstream).
    Beside them, a 65-element int64 table and a small float vector: data, not shapes."""
    ints = np.arange(65, dtype=np.int64)
    nodes = [
        # as exporters write it: a typed field (int64_data), the tensor unnamed
        helper.make_node("Constant", [], ["one"],
                         value=helper.make_tensor("", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["ints"], value_ints=[0]),
        helper.make_node("Shape", ["X"], ["S"]),
        helper.make_node("Slice", ["S", "zero", "first"], ["S0"]),
        helper.make_node("Add", ["S0", "one"], ["A"]),
        helper.make_node("Reshape", ["A", "first"], ["start"]),
        helper.make_node("Sub", ["start", "ints"], ["start1"]),
        helper.make_node("Slice", ["X", "start1", "end", "first"], ["Y0"]),
        helper.make_node("Cast", ["A"], ["Af"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["Y0", "Af"], ["Y1"]),
        helper.make_node("Add", ["Y1", "bias"], ["Y2"]),
        helper.make_node("Gather", ["table", "idx"], ["T"]),
        helper.make_node("Cast", ["T"], ["Tf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["Y2", "Tf"], ["Y"]),
    ]
    inits = [numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "first"),
             numpy_helper.from_array(np.array([9], dtype=np.int64), "end"),
             numpy_helper.from_array(np.full(3, 0.5, dtype=np.float32), "bias"),
             numpy_helper.from_array(ints, "table"),
             numpy_helper.from_array(np.array(3, dtype=np.int64), "idx")]
    graph = helper.make_graph(
        nodes, "main", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=BODY_OPSETS, ir_version=8)
    model.ir_version = 9
    return model


def _in_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``'s graph as the body of a model-local function called by the main graph,
    its initializers as unnamed Constants there (as dynamo exports write function bodies)."""
    g = model.graph
    body = []
    for t in g.initializer:
        value = onnx.TensorProto()
        value.CopyFrom(t)
        value.name = ""
        body.append(helper.make_node("Constant", [], [t.name], value=value))
    function = _function("Body", ["X"], ["Y"], body + list(g.node))
    return _model([_call("Body", ["X"], ["Y"])], [function], [], list(g.input),
                  list(g.output))


def _externals(model: onnx.ModelProto) -> set[str]:
    """Value names of the main graph's and the functions' external tensors."""
    names = {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    for node in [*model.graph.node, *(n for f in model.functions for n in f.node)]:
        if any(a.name == "value" and a.t.data_location == TensorProto.EXTERNAL
               for a in node.attribute):
            names.add(node.output[0])
    return names


def test_shape_values_stay_inline_whoever_consumes_them(tmp_path):
    """onnxruntime's shape inference propagates shape arithmetic and refuses an external
    operand on the way, even one whose result never reaches a shape input: small integer
    vectors and scalars stay inline at threshold 0, larger integer tables and floats go."""
    model = _shape_arithmetic_model()
    names = shape_input_names(model)
    assert {"one", "ints", "zero", "first", "end", "idx"} <= names
    assert not {"table", "bias"} & names
    src, out = tmp_path / "m.onnx", tmp_path / "x.onnx"
    onnx.save(model, str(src))
    convert_to_external(src, out, threshold=0, jobs=1)
    converted = onnx.load(str(out), load_external_data=False)
    external = {t.name for t in converted.graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    assert external == {"table", "bias"}
    assert all(a.t.data_location != TensorProto.EXTERNAL for n in converted.graph.node
               for a in n.attribute if a.name == "value")
    x = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    for a, b in zip(run_onnxruntime(out, x), run_onnxruntime(src, x), strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("where", ["graph", "function"])
def test_load_brings_shape_values_inline(tmp_path, where):
    """A model whose shape constants another tool put outside (onnx's own helper at
    threshold 0) does not load in onnxruntime as it is; ``load`` reads those payloads
    inline and runs it, bit-identical to the inline source. In a function body the
    Constants' tensors carry no name: they are known by the value they define."""
    pytest.importorskip("onnxruntime")
    import weightstore

    model = _shape_arithmetic_model()
    model = _in_function(model) if where == "function" else model
    src, ext = tmp_path / "m.onnx", tmp_path / "ext.onnx"
    onnx.save(model, str(src))
    onnx.save_model(model, str(ext), save_as_external_data=True, location="ext.data",
                    size_threshold=0, convert_attribute=True)
    stored = onnx.load(str(ext), load_external_data=False)
    assert _externals(stored) >= {"zero", "first", "end", "idx"}  # not typed fields
    x = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    with weightstore.resolve(ext) as resolved:
        session = weightstore.load(resolved)
        got = session.run(None, x)
    for a, b in zip(got, run_onnxruntime(src, x), strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("where", ["graph", "function"])
@pytest.mark.parametrize("external_weight", ["combined", "separate"])
def test_packages_at_threshold_zero_run_in_onnxruntime(tmp_path, external_weight, where):
    """A build that puts every weight outside still keeps the shape values inline, so the
    package runs in onnxruntime as it is, bit-identical to the source."""
    import weightstore

    model = _shape_arithmetic_model()
    onnx.save(_in_function(model) if where == "function" else model, str(tmp_path / "m.onnx"))
    recipe = {"package": "p", "version": "1", "store": {"path": "store"},
              "models": [{"name": "m", "source": "m.onnx"}],
              "layouts": [{"name": "all", "external_weight": external_weight,
                           "size_threshold": 0}],
              "output": "dist"}
    package = weightstore.build(recipe, base_dir=tmp_path).packages[0].path
    built = onnx.load(str(package / "m.onnx"), load_external_data=False)
    assert _externals(built) == {"table", "bias"}
    x = {"X": np.arange(12, dtype=np.float32).reshape(2, 6)}
    for a, b in zip(run_onnxruntime(package / "m.onnx", x),
                    run_onnxruntime(tmp_path / "m.onnx", x), strict=True):
        assert a.tobytes() == b.tobytes()
