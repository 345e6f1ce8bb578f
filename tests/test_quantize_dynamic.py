"""quantize-dynamic against onnxruntime's own ``quantize_dynamic``: the same nodes, the
same quantized payloads byte for byte, the same outputs, on a BERT-like encoder built with
onnx's helpers (tiny_bert, not an exporter's), a random BERT exported by
``torch.onnx.export`` (tiny_bert_export, a real exporter's transformer), onnxruntime-genai's
builder LLM and a small conv net with a MatMul head."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.builder.run import BuildOptions, build
from weightstore.errors import ScenarioError
from weightstore.packaging.bundles import assemble
from weightstore.resolve.runnable import runnable_variant
from weightstore.scenarios.operations import add_scenario, show_scenario

from .helpers import record_calls
from .samples import run_onnxruntime, sample_inputs

onnxruntime = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

ROOT = Path(__file__).resolve().parents[1]
TINY_BERT = ROOT / "examples" / "tiny_bert" / "model.onnx"
TINY_EXPORT = ROOT / "examples" / "tiny_bert_export" / "model.onnx"
TINY_LLM = ROOT / "examples" / "tiny_llm" / "fp32" / "model.onnx"
DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "Cast", "Mul"}


def conv_net(opset: int = 17) -> onnx.ModelProto:
    """A small conv net with a MatMul head: two convolutions, a pooled feature vector, a
    named MatMul whose weight a ReduceSum also reads, and two unnamed MatMuls sharing
    their input and weight (onnxruntime shares their scale product)."""
    rng = np.random.default_rng(7)

    def w(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [w("conv1.w", 8, 3, 3, 3), w("conv1.b", 8), w("conv2.w", 16, 8, 3, 3),
             w("conv2.b", 16), w("head.w", 16, 32), w("head.b", 32), w("out.w", 32, 10)]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], "conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], "conv2", pads=[1] * 4),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], "pool"),
        helper.make_node("Flatten", ["pooled"], ["features"], "flatten"),
        helper.make_node("MatMul", ["features", "head.w"], ["h0"], "head"),
        helper.make_node("Add", ["h0", "head.b"], ["h1"], "head_bias"),
        helper.make_node("Relu", ["h1"], ["h"], "head_relu"),
        helper.make_node("MatMul", ["h", "out.w"], ["logits"]),
        helper.make_node("MatMul", ["h", "out.w"], ["aux"]),
        helper.make_node("ReduceSum", ["head.w"], ["head_sum"], "head_sum", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10]),
         helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["batch", 10]),
         helper.make_tensor_value_info("head_sum", TensorProto.FLOAT, [])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def llm_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A prompt of five tokens with an empty cache."""
    ids = np.array([[3, 41, 159, 7, 300]], dtype=np.int64)
    out = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for value in model.graph.input:
        if value.name.startswith("past_key_values."):
            dims = value.type.tensor_type.shape.dim
            out[value.name] = np.zeros((1, dims[1].dim_value, 0, 16), dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Each model's file (with its external data beside it) and inputs."""
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, src in (("bert", TINY_BERT), ("export", TINY_EXPORT), ("llm", TINY_LLM)):
        (folder / name).mkdir()
        for f in src.parent.glob(src.name + "*"):
            shutil.copy(f, folder / name / f.name)
        out[name] = folder / name / src.name
    (folder / "conv").mkdir()
    onnx.save(conv_net(), str(folder / "conv" / "model.onnx"))
    out["conv"] = folder / "conv" / "model.onnx"
    bert = onnx.load(str(TINY_BERT))
    ids = np.random.default_rng(3).integers(0, 512, size=(2, 8), dtype=np.int64)
    inputs = {"bert": sample_inputs(bert, seed=3),
              "export": {"input_ids": ids, "attention_mask": np.ones_like(ids)},
              "llm": llm_inputs(onnx.load(str(TINY_LLM), load_external_data=False)),
              "conv": {"image": np.random.default_rng(1).standard_normal(
                  (2, 3, 8, 8)).astype(np.float32)}}
    return {k: (out[k], inputs[k]) for k in out}


def reference(src: Path, out: Path, weight_type: str, op_types=("MatMul",)) -> onnx.ModelProto:
    """onnxruntime's ``quantize_dynamic`` of ``src`` (only MatMul, or its defaults),
    without the shapes it infers on the way (``value_info``: not the graph, but
    onnxruntime's optimizer fuses more with them, which moves outputs by an ulp)."""
    qtype = {"int8": quantization.QuantType.QInt8, "uint8": quantization.QuantType.QUInt8}
    quantization.quantize_dynamic(str(src), str(out), weight_type=qtype[weight_type],
                                  op_types_to_quantize=list(op_types) or None)
    model = onnx.load(str(out))
    del model.graph.value_info[:]
    transposed = [n for n in onnx.load(str(src), load_external_data=False).graph.node
                  if n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute)]
    if transposed and not any("_Transposed" in t.name for t in model.graph.initializer):
        pytest.skip(f"onnxruntime {onnxruntime.__version__}'s quantize_dynamic quantizes a "
                    "transB Gemm's weight in place, named <weight>_quantized; the pass "
                    "writes what newer releases write (a transposed copy, "
                    "<weight>_Transposed_quantized)")
    return model


def ours(src: Path, folder: Path, weight_type: str) -> onnx.ModelProto:
    """The scenario stored in a copy of ``src``, replayed from its metadata and filled
    from the base weights and the recorded recipes, without the shapes the source
    declares (``value_info``: an exporter's, which ``reference`` drops as well)."""
    folder.mkdir()
    for f in src.parent.glob(src.name + "*"):
        shutil.copy(f, folder / f.name)
    path = folder / src.name
    add_scenario(path, "int8", [{"name": "quantize-dynamic", "weight_type": weight_type}])
    model = runnable_variant(path, "int8")
    del model.graph.value_info[:]
    return model


def canonical(node: onnx.NodeProto) -> bytes:
    """A node's bytes with its attributes in name order, its tensors in one encoding,
    its subgraphs' value_info dropped and a default domain unset (the quantizer re-creates
    nodes that hold subgraphs and re-infers shapes; a replayed variant gets its payloads
    as raw data)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if not copy.domain:
        copy.ClearField("domain")
    attributes = sorted(copy.attribute, key=lambda a: a.name)
    del copy.attribute[:]
    copy.attribute.extend(attributes)
    for a in copy.attribute:
        for t in [a.t] if a.type == onnx.AttributeProto.TENSOR else list(a.tensors):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            del g.value_info[:]
            for t in g.initializer:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
            for inner in g.node:
                inner.CopyFrom(onnx.NodeProto.FromString(canonical(inner)))
    return copy.SerializeToString(deterministic=True)


def payloads(model: onnx.ModelProto) -> dict[str, tuple[str, tuple, bytes]]:
    out = {}
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        out[t.name] = (str(a.dtype), a.shape, a.tobytes())
    return out


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
@pytest.mark.parametrize("name", ["bert", "export", "llm", "conv"])
def test_the_scenario_is_quantize_dynamic_node_for_node_and_byte_for_byte(
        models, tmp_path, name, weight_type):
    src, inputs = models[name]
    expected = reference(src, tmp_path / "ort.onnx", weight_type)
    actual = ours(src, tmp_path / "ours", weight_type)
    assert sorted(map(canonical, actual.graph.node)) == sorted(map(canonical, expected.graph.node))
    assert payloads(actual) == payloads(expected)
    quantized = [n for n in actual.graph.node if n.op_type == "MatMulInteger"]
    assert quantized and {n.op_type for n in actual.graph.node} >= DYNAMIC_OPS
    assert [m.op_type for m in actual.graph.node if m.op_type == "MatMul"] == [
        m.op_type for m in expected.graph.node if m.op_type == "MatMul"]
    got = run_onnxruntime(actual, inputs)
    want = run_onnxruntime(expected, inputs)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))
    base = run_onnxruntime(src, inputs)
    assert any(g.tobytes() != b.tobytes() for g, b in zip(got, base, strict=True))


@pytest.mark.parametrize("name", ["bert", "export", "llm", "conv"])
def test_the_matmuls_it_quantizes_are_those_quantize_dynamic_picks_by_default(
        models, tmp_path, name):
    """With every op type (its defaults), quantize_dynamic also quantizes Gather tables
    and Conv kernels, which the pass leaves in float; its MatMuls are the pass's, with
    the same weights byte for byte."""
    src, _ = models[name]
    default = reference(src, tmp_path / "ort.onnx", "int8", op_types=())
    actual = ours(src, tmp_path / "ours", "int8")

    def integer_matmuls(model):
        return sorted(canonical(n) for n in model.graph.node if n.op_type == "MatMulInteger")

    assert integer_matmuls(actual) == integer_matmuls(default)
    mine, theirs = payloads(actual), payloads(default)
    derived = {n for m in actual.graph.node if m.op_type == "MatMulInteger"
               for n in m.input[1::2]}
    derived |= {n for m in actual.graph.node if m.op_type == "Mul" for n in m.input
                if n in mine}
    assert derived and {n: mine[n] for n in derived} == {n: theirs[n] for n in derived}
    left = {n.op_type for n in default.graph.node} - {n.op_type for n in actual.graph.node}
    assert left <= {"ConvInteger", "DequantizeLinear", "Reshape"}


def test_a_float16_model_is_quantized_as_quantize_dynamic_does(tmp_path):
    """float16 weights give float16 scales and a Cast to float16 (onnxruntime's CPU
    provider has no float16 DynamicQuantizeLinear, so only the graphs are compared)."""
    model = conv_net()
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "half.onnx"
    onnx.save(model, str(src))
    expected = reference(src, tmp_path / "ort.onnx", "uint8")
    actual = ours(src, tmp_path / "ours", "uint8")
    assert sorted(map(canonical, actual.graph.node)) == sorted(map(canonical, expected.graph.node))
    assert payloads(actual) == payloads(expected)
    assert payloads(actual)["out.w_scale"][0] == "float16"


def test_records_derive_every_quantized_payload_from_the_float_weight(models, tmp_path):
    src, _ = models["conv"]
    shutil.copytree(src.parent, tmp_path / "conv")
    path = tmp_path / "conv" / src.name
    add_scenario(path, "int8", [{"name": "quantize-dynamic", "weight_type": "uint8"}])
    records = show_scenario(path, "int8")["rewrites"]
    assert [r["operation"] for r in records] == ["quantize-dynamic"] * 4
    added = {t["name"]: t for r in records for t in r["added_initializers"]}
    assert {n: (t["dtype"], t["shape"], t["derived"]) for n, t in added.items()} == {
        "head.w_quantized": ("UINT8", [16, 32],
                             {"operation": "dynamic-int8-weight", "sources": ["head.w"]}),
        "head.w_scale": ("FLOAT", [], {"operation": "dynamic-int8-scale",
                                       "sources": ["head.w"]}),
        "head.w_zero_point": ("UINT8", [], {"operation": "dynamic-int8-zero-point",
                                            "sources": ["head.w"]}),
        "out.w_quantized": ("UINT8", [32, 10],
                            {"operation": "dynamic-int8-weight", "sources": ["out.w"]}),
        "out.w_scale": ("FLOAT", [], {"operation": "dynamic-int8-scale",
                                      "sources": ["out.w"]}),
        "out.w_zero_point": ("UINT8", [], {"operation": "dynamic-int8-zero-point",
                                           "sources": ["out.w"]}),
    }
    # out.w goes with its last MatMul; the ReduceSum after the head reads head.w
    # dequantized, as onnxruntime rewires it
    assert [r["removed_initializers"] for r in records] == [[], [], [6], [4]]
    assert [n["op_type"] for n in records[3]["added_nodes"]] == ["DequantizeLinear"]


def test_an_opset_without_dynamic_quantize_linear_is_refused(tmp_path):
    path = tmp_path / "old.onnx"
    onnx.save(conv_net(opset=10), str(path))
    with pytest.raises(ScenarioError, match="opset 11"):
        add_scenario(path, "int8", [{"name": "quantize-dynamic"}])


def test_a_device_of_the_int8_dynamic_scenario_runs_in_onnxruntime(models, tmp_path,
                                                                   monkeypatch):
    """Each weight is quantized once (its scale and zero point come from the same call),
    a forced rebuild quantizes nothing, and the device's folder is quantize_dynamic's
    graph with its payloads, running as it does."""
    from onnxruntime.quantization import quant_utils

    calls = record_calls(monkeypatch, quant_utils, "quantize_data")
    src, inputs = models["bert"]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"package: p\nversion: '1'\nstore: {{path: {tmp_path / 'store'}}}\n"
        f"models:\n  - name: encoder\n    source: {src}\n    scenarios:\n"
        "      - name: int8-dynamic\n        passes: [{name: quantize-dynamic}]\n"
        "layouts:\n  - {name: c, external_weight: combined, size_threshold: 1024}\n"
        "devices:\n  - {name: cpu-int8, scenario: int8-dynamic}\n"
        f"output: {tmp_path / 'out'}\n")
    package = build(recipe, BuildOptions(jobs=1)).packages[0]
    assert len(calls) == 24  # the encoder's MatMul weights
    calls.clear()
    assert build(recipe, BuildOptions(jobs=1, force=True)).packages[0].status == "built"
    assert calls == []
    assemble(package.path, "cpu-int8", tmp_path / "device")
    expected = reference(src, tmp_path / "ort.onnx", "int8")
    device = onnx.load(str(tmp_path / "device" / "encoder.onnx"))
    assert sorted(map(canonical, device.graph.node)) == sorted(
        map(canonical, expected.graph.node))
    got = run_onnxruntime(tmp_path / "device" / "encoder.onnx", inputs)
    want = run_onnxruntime(expected, inputs)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))


def gemm_net() -> onnx.ModelProto:
    """Gemms as exporters write ``nn.Linear``: with a bias and ``transB`` 1 (its weight
    also read by a ReduceSum, so it stays), without ``transB``, unnamed and sharing one
    transposed weight, one whose ``alpha`` keeps it float; ``a.w_Transposed`` is taken."""
    rng = np.random.default_rng(11)

    def w(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    gemm = helper.make_node
    nodes = [
        gemm("Gemm", ["x", "a.w", "a.b"], ["h1"], "fc1", transB=1),
        gemm("Relu", ["h1"], ["r1"], "relu1"),
        gemm("Gemm", ["r1", "b.w", "b.b"], ["h2"], "fc2"),
        gemm("Gemm", ["h2", "c.w"], ["y1"], transB=1),
        gemm("Gemm", ["h2", "c.w"], ["y2"], transB=1),
        gemm("Gemm", ["h2", "d.w"], ["y3"], "scaled", alpha=0.5),
        gemm("ReduceSum", ["a.w"], ["a_sum"], "a_sum", keepdims=0),
        gemm("Identity", ["y1"], ["a.w_Transposed"], "taken"),
    ]
    graph = helper.make_graph(
        nodes, "gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 24])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in (
            ("y2", ["batch", 8]), ("y3", ["batch", 8]), ("a_sum", []),
            ("a.w_Transposed", ["batch", 8]))],
        [w("a.w", 32, 24), w("a.b", 32), w("b.w", 32, 16), w("b.b", 16), w("c.w", 8, 16),
         w("d.w", 16, 8)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
def test_gemms_are_quantized_as_quantize_dynamic_quantizes_them(tmp_path, weight_type):
    """quantize_dynamic writes a Gemm as MatMul (+ Add) and quantizes it even when asked
    for MatMul only; so does the pass, transposing a transB weight."""
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "gemms.onnx"
    onnx.save(gemm_net(), str(src))
    expected = reference(src, tmp_path / "ort.onnx", weight_type)
    actual = ours(src, tmp_path / "ours", weight_type)
    integer = [n for n in actual.graph.node if n.op_type == "MatMulInteger"]
    assert sorted(n.name for n in integer) == ["", "", "fc1_MatMul_quant", "fc2_MatMul_quant"]
    assert [n.op_type for n in actual.graph.node if n.op_type == "Gemm"] == ["Gemm"]
    assert sorted(map(canonical, actual.graph.node)) == sorted(map(canonical, expected.graph.node))
    assert payloads(actual) == payloads(expected)
    assert {"a.w", "a.w_Transposed_1_quantized", "c.w_Transposed_quantized"} <= set(
        payloads(actual)) and "c.w" not in payloads(actual)
    inputs = {"x": np.random.default_rng(2).standard_normal((3, 24)).astype(np.float32)}
    got, want = run_onnxruntime(actual, inputs), run_onnxruntime(expected, inputs)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))



@pytest.mark.parametrize("attributes, match", [
    ((("transposed", "yes"), ("weight_type", "int8")), "transposed attribute"),
    ((("transposed", "true"), ("weight_type", "int8"), ("axis", "0")), "do not fit"),
])
def test_a_recipe_with_a_bad_transposed_attribute_is_a_scenario_error(attributes, match):
    from weightstore.catalogue.descriptors import DerivedWeightRecipe
    from weightstore.scenarios.derive import compute

    recipe = DerivedWeightRecipe("dynamic-int8-weight", ("w",), attributes)
    with pytest.raises(ScenarioError, match=match):
        compute(recipe, [np.ones((4, 3), np.float32)])
