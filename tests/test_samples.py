"""Tests for the sample model generators in ``tests.samples``."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from .samples import (
    FUNCTION_DOMAIN,
    make_encoder,
    make_large_model,
    make_shared_pair,
    run_onnxruntime,
    sample_inputs,
)

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "tiny_bert"

Walk = Iterator[tuple[int, onnx.GraphProto]]


def _walk(graph: onnx.GraphProto, depth: int = 0) -> Walk:
    """Yield (depth, graph) for ``graph`` and every nested subgraph."""
    yield depth, graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g, depth + 1)
            for sub in attr.graphs:
                yield from _walk(sub, depth + 1)


def _constants(nodes: list[onnx.NodeProto]) -> list[TensorProto]:
    return [
        attr.t
        for node in nodes
        if node.op_type == "Constant"
        for attr in node.attribute
        if attr.name == "value"
    ]


def _nbytes(tensor: TensorProto) -> int:
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _load_example_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_bert_generate", EXAMPLE_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Determinism


def test_encoder_is_byte_identical_for_same_arguments() -> None:
    assert make_encoder().SerializeToString() == make_encoder().SerializeToString()
    assert make_encoder(seed=1).SerializeToString() != make_encoder().SerializeToString()


def test_shared_pair_is_deterministic() -> None:
    a1, b1 = make_shared_pair(seed=3)
    a2, b2 = make_shared_pair(seed=3)
    assert a1.SerializeToString() == a2.SerializeToString()
    assert b1.SerializeToString() == b2.SerializeToString()


def test_large_model_is_deterministic() -> None:
    first = make_large_model(1 << 20, tensor_bytes=256 << 10, seed=5)
    second = make_large_model(1 << 20, tensor_bytes=256 << 10, seed=5)
    assert first.SerializeToString() == second.SerializeToString()


def test_example_model_is_up_to_date() -> None:
    script = _load_example_script()
    expected = make_encoder(**script.CONFIG, seed=0, name="tiny-bert").SerializeToString()
    data = (EXAMPLE_DIR / "model.onnx").read_bytes()
    assert data == expected
    assert 1 << 20 <= len(data) <= 2 << 20


# Validity and execution


@pytest.mark.parametrize(
    "kwargs", [{}, {"layers": 1, "heads": 2, "hidden": 32, "ffn": 512, "vocab": 50}]
)
def test_encoder_passes_full_check(kwargs: dict[str, int]) -> None:
    model = make_encoder(**kwargs)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version in (8, 9)
    assert {o.domain: o.version for o in model.opset_import}[""] == 17


def test_shared_pair_passes_full_check(
    shared_pair: tuple[onnx.ModelProto, onnx.ModelProto],
) -> None:
    for model in shared_pair:
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("use_pooler", [True, False])
@pytest.mark.parametrize("seq", [8, 1])
def test_encoder_runs_in_onnxruntime(
    encoder_model: onnx.ModelProto, use_pooler: bool, seq: int
) -> None:
    inputs = sample_inputs(encoder_model, seq=seq, batch=3)
    inputs["use_pooler"] = np.array(use_pooler)
    hidden_states, pooled = run_onnxruntime(encoder_model, inputs)
    assert hidden_states.shape == (3, seq, 64)
    assert pooled.shape == (3, 64)
    assert hidden_states.dtype == np.float32 and pooled.dtype == np.float32
    assert np.isfinite(hidden_states).all() and np.isfinite(pooled).all()
    assert np.abs(pooled).max() > 0


def test_pooler_branches_give_different_results(encoder_model: onnx.ModelProto) -> None:
    inputs = sample_inputs(encoder_model)
    on = run_onnxruntime(encoder_model, {**inputs, "use_pooler": np.array(True)})
    off = run_onnxruntime(encoder_model, {**inputs, "use_pooler": np.array(False)})
    np.testing.assert_array_equal(on[0], off[0])
    assert not np.array_equal(on[1], off[1])
    assert np.abs(on[1]).max() <= 1.0  # tanh


def test_runs_from_path_with_external_data(
    encoder_model: onnx.ModelProto, save_model: Callable[..., Path]
) -> None:
    inputs = sample_inputs(encoder_model, seed=7)
    expected = run_onnxruntime(encoder_model, inputs)
    path = save_model(
        encoder_model,
        "ext/model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.data",
        size_threshold=0,
    )
    assert (path.parent / "model.data").stat().st_size > 0
    assert encoder_model.graph.initializer[0].HasField("raw_data")  # caller's model untouched
    actual = run_onnxruntime(path, inputs)
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_gelu_function_is_exact_gelu() -> None:
    model = make_encoder(layers=1)
    function = model.functions[0]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gelu", ["x"], ["y"], domain=FUNCTION_DOMAIN)],
        "gelu",
        [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
    )
    probe = onnx.helper.make_model(
        graph, opset_imports=model.opset_import, functions=[function], ir_version=model.ir_version
    )
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32) * 3
    (y,) = run_onnxruntime(probe, {"x": x})
    erf = np.vectorize(math.erf)
    reference = 0.5 * x.astype(np.float64) * (1.0 + erf(x.astype(np.float64) / np.sqrt(2.0)))
    np.testing.assert_allclose(y, reference, rtol=1e-5, atol=1e-6)


# Features the weight store must handle


def test_main_graph_has_typed_field_constants(encoder_model: onnx.ModelProto) -> None:
    tensors = _constants(list(encoder_model.graph.node))
    big_float = [t for t in tensors if len(t.float_data) and _nbytes(t) >= 1024]
    assert len(big_float) == 2  # one intermediate bias per layer
    assert all(not t.raw_data for t in big_float)
    int64_typed = [t for t in tensors if len(t.int64_data)]
    assert [t.name for t in int64_typed] == ["embeddings.token_type_ids"]
    raw = [t for t in tensors if t.raw_data]
    assert raw, "most Constants stay raw_data"


def test_shape_constants_feed_reshape_and_slice(encoder_model: onnx.ModelProto) -> None:
    graph = encoder_model.graph
    constant_outputs = {n.output[0] for n in graph.node if n.op_type == "Constant"}
    reshape_shapes = {n.input[1] for n in graph.node if n.op_type == "Reshape"}
    assert reshape_shapes and reshape_shapes <= constant_outputs
    heads = [n for n in graph.node if n.op_type == "Reshape" and "heads_shape" in n.input[1]]
    assert len(heads) == 3 * 2  # Q, K, V share one shape Constant per layer
    slice_bounds = {i for n in graph.node if n.op_type == "Slice" for i in n.input[1:3]}
    assert slice_bounds & constant_outputs
    token_type = next(n for n in graph.node if n.output[0] == "embeddings.token_type_ids")
    consumers = [n for n in graph.node if token_type.output[0] in n.input]
    assert [(n.op_type, list(n.input).index(token_type.output[0])) for n in consumers] == [
        ("Slice", 0)
    ]


def test_if_branches_carry_tensors_at_two_depths(encoder_model: onnx.ModelProto) -> None:
    by_depth: dict[int, list[tuple[str, str]]] = {}
    for depth, graph in _walk(encoder_model.graph):
        found = by_depth.setdefault(depth, [])
        found += [("init", t.name) for t in graph.initializer]
        found += [("const", t.name) for t in _constants(list(graph.node)) if _nbytes(t) >= 1024]
    assert max(by_depth) == 2
    assert ("init", "pooler.dense.bias") in by_depth[1]
    assert ("const", "pooler.mean.weight") in by_depth[1]
    assert ("const", "pooler.dense.weight") in by_depth[2]
    assert ("init", "pooler.single.weight") in by_depth[2]
    ifs = [n for n in encoder_model.graph.node if n.op_type == "If"]
    assert [n.input[0] for n in ifs] == ["use_pooler"]


def test_function_carries_a_typed_constant(encoder_model: onnx.ModelProto) -> None:
    assert {o.domain for o in encoder_model.opset_import} >= {"", FUNCTION_DOMAIN}
    (function,) = encoder_model.functions
    assert (function.domain, function.name) == (FUNCTION_DOMAIN, "Gelu")
    tensors = _constants(list(function.node))
    big = [t for t in tensors if _nbytes(t) >= 1024]
    assert len(big) == 1 and len(big[0].float_data) == 256 and not big[0].raw_data
    callers = [n for n in encoder_model.graph.node if n.domain == FUNCTION_DOMAIN]
    assert len(callers) == 2


# Shared pair


def test_shared_pair_shares_some_bytes_and_differs_in_others(
    shared_pair: tuple[onnx.ModelProto, onnx.ModelProto],
) -> None:
    def tensors(model: onnx.ModelProto) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for _, graph in _walk(model.graph):
            out.update({t.name: t.SerializeToString() for t in graph.initializer})
            out.update({t.name: t.SerializeToString() for t in _constants(list(graph.node))})
        return out

    first, second = tensors(shared_pair[0]), tensors(shared_pair[1])
    assert first.keys() == second.keys()
    same = {name for name in first if first[name] == second[name]}
    differ = set(first) - same
    assert "embeddings.word_embeddings.weight" in same
    assert "encoder.layer.0.attention.self.query.weight" in same
    assert "encoder.layer.0.intermediate.dense.bias" in same  # float_data Constant
    assert "encoder.layer.1.attention.self.query.weight" in differ
    assert "encoder.layer.1.intermediate.dense.bias" in differ
    assert "pooler.dense.weight" in differ
    assert all(n.startswith(("embeddings.", "encoder.layer.0.")) for n in same if "weight" in n)


# Large model


def test_large_model_size_and_execution() -> None:
    requested = 20 << 20
    model = make_large_model(requested, tensor_bytes=4 << 20)
    inits = list(model.graph.initializer)
    total = sum(len(t.raw_data) for t in inits)
    assert abs(total - requested) <= 0.05 * requested
    assert all(t.HasField("raw_data") and len(t.raw_data) <= 4 << 20 for t in inits)
    assert len(inits) == 5
    onnx.checker.check_model(model, full_check=True)
    (y,) = run_onnxruntime(model, sample_inputs(model))
    assert y.shape == (1, 1024) and np.isfinite(y).all()


@pytest.mark.parametrize("requested", [20 << 20, (20 << 20) + 123_457, 3000])
def test_large_model_odd_sizes(requested: int) -> None:
    model = make_large_model(requested)
    total = sum(len(t.raw_data) for t in model.graph.initializer)
    assert abs(total - requested) <= 0.05 * requested
    onnx.checker.check_model(model)


# Inputs and environment


def test_sample_inputs_are_valid(encoder_model: onnx.ModelProto) -> None:
    inputs = sample_inputs(encoder_model, seed=1, batch=4, seq=5)
    assert set(inputs) == {"input_ids", "use_pooler"}
    ids = inputs["input_ids"]
    assert ids.shape == (4, 5) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 1000
    assert inputs["use_pooler"].shape == () and inputs["use_pooler"].dtype == np.bool_
    again = sample_inputs(encoder_model, seed=1, batch=4, seq=5)
    np.testing.assert_array_equal(ids, again["input_ids"])
    assert sample_inputs(encoder_model, vocab=3)["input_ids"].max() < 3


def test_encoder_rejects_bad_head_count() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        make_encoder(hidden=30, heads=4)


def test_store_dir_is_isolated(isolated_env: Path) -> None:
    assert Path(os.environ["WEIGHTSTORE_DIR"]).parent == isolated_env
    assert Path(os.environ["XDG_CACHE_HOME"]).parent == isolated_env


def test_example_recipes_are_valid() -> None:
    from weightstore.recipe.schema import load_recipe

    root = Path(__file__).resolve().parents[1]
    for recipe in sorted((root / "recipes").glob("*.yaml")):
        loaded = load_recipe(recipe)
        for model in loaded.recipe.models:
            assert loaded.model_source(model).is_file(), recipe
