"""quantize-weights against onnxruntime's own MatMulNBitsQuantizer: the same graph, the same
payloads byte for byte, the same outputs, from records and derived payloads.

The models: the tiny BERT-like encoder of examples/tiny_bert (built with onnx's helpers by
tests/samples.py, not by an exporter), a random BERT exported by ``torch.onnx.export`` into
examples/tiny_bert_export (a real exporter's transformer: generated weight names, shape
logic around the MatMuls, a Gemm pooler), the Llama onnxruntime-genai's builder exported
into examples/tiny_llm/fp32 (an LLM builder's transformer), and a small conv net with a
MatMul and a Gemm head built here.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import weightstore
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import ScenarioError
from weightstore.io.digests import digest_bytes
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import WeightStore

from .helpers import store_index
from .samples import run_onnxruntime, sample_inputs
from .test_build import tree

onnxruntime = pytest.importorskip("onnxruntime")
quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BERT = EXAMPLES / "tiny_bert" / "model.onnx"
EXPORT = EXAMPLES / "tiny_bert_export" / "model.onnx"
LLM = EXAMPLES / "tiny_llm" / "fp32" / "model.onnx"
BLOCKS = {"tiny-bert": (32, 128), "tiny-bert-export": (32, 128), "tiny-llm": (16, 32),
          "convnet": (16, 64)}


def convnet() -> onnx.ModelProto:
    """Conv, ReLU, global pooling, a MatMul layer (K = 48: padded to whole blocks) and a
    Gemm classifier (transB = 1)."""
    rng = np.random.default_rng(7)

    def init(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2,
                                       name)

    nodes = [
        helper.make_node("Conv", ["image", "conv.w", "conv.b"], ["c"], name="conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc.w"], ["h0"], name="fc/MatMul"),
        helper.make_node("Add", ["h0", "fc.b"], ["h1"], name="fc/Add"),
        helper.make_node("Relu", ["h1"], ["h"], name="fc/Relu"),
        helper.make_node("Gemm", ["h", "head.w", "head.b"], ["logits"], name="head",
                         transB=1),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [init("conv.w", 48, 3, 3, 3), init("conv.b", 48), init("fc.w", 48, 96),
         init("fc.b", 96), init("head.w", 10, 96), init("head.b", 10)])
    return helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("convnet")
    onnx.save(convnet(), str(folder / "convnet.onnx"))
    return {"tiny-bert": BERT, "tiny-bert-export": EXPORT, "tiny-llm": LLM,
            "convnet": folder / "convnet.onnx"}


def feed(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    if name == "tiny-llm":
        past = np.zeros((1, 1, 0, 16), dtype=np.float32)
        ids = rng.integers(0, 320, size=(1, 6), dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones((1, 6), dtype=np.int64),
                **{i.name: past for i in model.graph.input if i.name.startswith("past")}}
    if name == "tiny-bert-export":
        return {"input_ids": rng.integers(0, 512, size=(2, 8), dtype=np.int64),
                "attention_mask": np.ones((2, 8), dtype=np.int64)}
    if name == "convnet":
        return {"image": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    return sample_inputs(model, seed=3)


def copy_model(src: Path, folder: Path) -> Path:
    """The model file and its external data, copied into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.parent.iterdir():
        if f.name.startswith(src.name):
            shutil.copy(f, folder / f.name)
    return folder / src.name


def ours(src: Path, folder: Path, params: dict) -> onnx.ModelProto:
    """The scenario's records, stored in a copy of the model, replayed with every payload
    computed (from the records' derivations)."""
    model = copy_model(src, folder)
    weightstore.add_scenario(model, "q", [{"name": "quantize-weights", **params}])
    return runnable_variant(model, "q")


def reference(src: Path, params: dict, exclude: list[str] = ()) -> onnx.ModelProto:
    """What onnxruntime's MatMulNBitsQuantizer (default RTN, QOperator) makes of the model."""
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(
        logging.WARNING)
    bits = params.get("bits", 4)
    settings = {"block_size": params.get("block_size", 128),
                "is_symmetric": params.get("symmetric", False),
                "accuracy_level": params.get("accuracy_level") or None,
                "nodes_to_exclude": list(exclude)}
    if not _WRITES_FLAT:
        settings["bits"] = bits
    elif bits != 4:  # onnxruntime before 1.24 (the newest Python 3.10 gets): 4 bits only
        pytest.skip(f"onnxruntime {onnxruntime.__version__}'s MatMulNBitsQuantizer quantizes "
                    f"to 4 bits only: no reference for {bits} bits")
    q = quantizer.MatMulNBitsQuantizer(onnx.load(str(src)), **settings)
    q.process()
    return q.model.model


def graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and every subgraph, depth first in node order."""
    out, todo = [], [model.graph]
    while todo:
        g = todo.pop(0)
        out.append(g)
        todo[:0] = [sub for n in g.node for a in n.attribute
                    for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]
    return out


def payloads(model: onnx.ModelProto) -> dict[tuple[int, str], tuple]:
    """(graph number, name) -> (type, shape, bytes) of every initializer."""
    return {(k, t.name): (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
            for k, g in enumerate(graphs(model)) for t in g.initializer}


def nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in graphs(model) for n in g.node]


def assert_same_quantization(mine: onnx.ModelProto, theirs: onnx.ModelProto) -> int:
    """Same payloads byte for byte, same nodes, same MatMulNBits attributes, same opset
    imports; returns how many MatMuls became MatMulNBits."""
    a, b = payloads(mine), payloads(theirs)
    assert sorted(a) == sorted(b)
    for name in b:
        assert a[name] == _as_written_now(a[name], b[name]), name  # type, shape and bytes
    shape = [(n.op_type, n.name, list(n.input), list(n.output)) for n in nodes(mine)]
    assert shape == [(n.op_type, n.name, list(n.input), list(n.output))
                     for n in nodes(theirs)]
    nbits = [n for n in nodes(mine) if n.op_type == "MatMulNBits"]
    expected = [n for n in nodes(theirs) if n.op_type == "MatMulNBits"]
    assert [n.SerializeToString() for n in nbits] == [n.SerializeToString() for n in expected]
    imports = {(o.domain, o.version) for o in mine.opset_import}
    assert imports == {(o.domain, o.version) for o in theirs.opset_import}
    assert ("com.microsoft", 1) in imports
    return len(nbits)


# the quantizer of before 1.24: no bits argument, scales and zero points written flat
_WRITES_FLAT = "bits" not in inspect.signature(quantizer.MatMulNBitsQuantizer).parameters


def _as_written_now(mine: tuple, theirs: tuple) -> tuple:
    """The quantizer's payload ``(type, shape, bytes)``, shaped as it writes it today:
    onnxruntime before 1.24 (the newest for Python 3.10) wrote MatMulNBits' scales and
    zero points flattened, ``[N * blocks]``, where it now writes ``[N, blocks]``; its
    kernel reads both, and the bytes are the same."""
    kind, shape, data = theirs
    if (_WRITES_FLAT and len(shape) == 1 and len(mine[1]) == 2
            and math.prod(mine[1]) == shape[0]):
        return kind, mine[1], data
    return theirs


def assert_same_outputs(name: str, mine: onnx.ModelProto, theirs: onnx.ModelProto) -> None:
    inputs = feed(name, theirs)
    for x, y in zip(run_onnxruntime(mine, inputs), run_onnxruntime(theirs, inputs),
                    strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-bert-export", "tiny-llm", "convnet"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block", [0, 1])
def test_payloads_are_those_of_matmul_nbits_quantizer(sources, tmp_path, name, bits,
                                                      symmetric, block):
    params = {"bits": bits, "block_size": BLOCKS[name][block], "symmetric": symmetric}
    mine = ours(sources[name], tmp_path / "m", params)
    theirs = reference(sources[name], params)
    count = assert_same_quantization(mine, theirs)
    assert count == {"tiny-bert": 25, "tiny-bert-export": 12, "tiny-llm": 11,
                     "convnet": 1}[name]  # bert: the pooler's in an If branch; the
    # export: six weight MatMuls a layer (its pooler is a Gemm, left float)
    assert_same_outputs(name, mine, theirs)


def test_a_gemm_head_stays_float(sources, tmp_path):
    mine = ours(sources["convnet"], tmp_path / "m", {"block_size": 16})
    (gemm,) = [n for n in mine.graph.node if n.op_type == "Gemm"]
    assert gemm.input[1] == "head.w"
    assert (0, "head.w") in payloads(mine) and (0, "fc.w") not in payloads(mine)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_float16_weight_keeps_float16_scales(tmp_path, bits):
    rng = np.random.default_rng(11)
    weight = numpy_helper.from_array(rng.standard_normal((96, 40)).astype(np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 40])], [weight])
    src = tmp_path / "src" / "half.onnx"
    src.parent.mkdir()
    onnx.save(helper.make_model_gen_version(graph,
                                            opset_imports=[helper.make_opsetid("", 17)]), src)
    params = {"bits": bits, "block_size": 32, "symmetric": False}
    mine, theirs = ours(src, tmp_path / "m", params), reference(src, params)
    assert assert_same_quantization(mine, theirs) == 1
    assert payloads(mine)[(0, "w_scales")][0] == TensorProto.FLOAT16
    inputs = {"x": rng.standard_normal((3, 96)).astype(np.float16)}
    for x, y in zip(run_onnxruntime(mine, inputs), run_onnxruntime(theirs, inputs),
                    strict=True):
        np.testing.assert_array_equal(x, y)


def test_selection_and_accuracy_level(sources, tmp_path):
    """``nodes``, ``exclude`` and ``min_elements`` pick MatMuls; the quantizer given the
    complement as ``nodes_to_exclude`` makes the same graph."""
    params = {"bits": 4, "block_size": 16, "symmetric": True, "accuracy_level": 4,
              "nodes": "layers\\.", "exclude": "down_proj", "min_elements": 2048}
    mine = ours(LLM, tmp_path / "m", params)
    model = onnx.load(str(LLM), load_external_data=False)
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    skipped = [n.name for n in model.graph.node if n.op_type == "MatMul" and (
        "layers." not in n.name or "down_proj" in n.name or sizes[n.input[1]] < 2048)]
    assert "/lm_head/MatMul" in skipped and "/model/layers.0/mlp/down_proj/MatMul" in skipped
    theirs = reference(LLM, params, exclude=skipped)
    count = assert_same_quantization(mine, theirs)
    assert count == 11 - len(skipped) > 0
    nbits = next(n for n in nodes(mine) if n.op_type == "MatMulNBits")
    assert helper.get_attribute_value(
        next(a for a in nbits.attribute if a.name == "accuracy_level")) == 4
    assert_same_outputs("tiny-llm", mine, theirs)


def test_bad_parameters_are_one_line(sources, tmp_path, capsys):
    model = copy_model(sources["convnet"], tmp_path)
    with pytest.raises(ScenarioError, match="bad parameter of pass 'quantize-weights'"):
        weightstore.add_scenario(model, "q", [{"name": "quantize-weights", "bits": 3}])
    passes = json.dumps([{"name": "quantize-weights", "block_size": 48}])
    assert main(["scenario", "add", str(model), "q", "--passes", passes]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "block_size must be a power of two" in err


# -- a package with an int4 scenario --------------------------------------------------------

INT4 = {"bits": 4, "block_size": 32, "symmetric": True, "accuracy_level": 4}
RECIPE = """package: bert
version: "1.0.0"
models:
  - name: encoder
    source: {source}
    scenarios:
      - name: int4
        passes:
          - {{name: quantize-weights, bits: 4, block_size: 32, symmetric: true,
             accuracy_level: 4}}
layouts:
  - {{name: c, external_weight: combined, size_threshold: 1024}}
devices:
  - {{name: cpu-int4, scenario: int4}}
output: out
"""


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """The bits of every call of onnxruntime's quantization kernels from now on."""
    from onnxruntime.capi import _pybind_state as kernels

    calls: list[int] = []
    for bits in (4, 8):
        real = getattr(kernels, f"quantize_matmul_{bits}bits")

        def counting(*args, _real=real, _bits=bits):
            calls.append(_bits)
            return _real(*args)

        monkeypatch.setattr(kernels, f"quantize_matmul_{bits}bits", counting)
    return calls


@pytest.fixture
def package(tmp_path, kernel_calls):
    source = copy_model(BERT, tmp_path / "src")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(source=source))
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    return recipe, result.packages[0]


def test_each_weight_is_quantized_once_and_a_warm_rebuild_quantizes_nothing(
        package, kernel_calls, tmp_path):
    recipe, _ = package
    assert kernel_calls == [4] * 25  # 25 weights; scales and zero points from the same call
    kernel_calls.clear()
    before = tree(tmp_path / "out")
    again = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1, force=True))
    assert again.packages[0].status == "built" and kernel_calls == []  # derived keys kept
    assert tree(tmp_path / "out") == before
    shutil.rmtree(tmp_path / "out")
    restored = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert kernel_calls == [] and tree(tmp_path / "out") == before  # the action record
    assert restored.packages[0].status != "up-to-date"


def tensors(model: onnx.ModelProto) -> dict[str, bytes]:
    """Name -> bytes of every initializer and Constant tensor, in every graph and
    function."""
    out = {}
    for g in [*graphs(model), *model.functions]:
        out.update({t.name: numpy_helper.to_array(t).tobytes()
                    for t in getattr(g, "initializer", ())})
        out.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t).tobytes()
                    for n in g.node if n.op_type == "Constant" and n.attribute[0].name
                    == "value"})
    return out


def test_the_store_holds_the_fp32_payloads_and_the_quantized_ones_only(package, tmp_path):
    _, built = package
    base, theirs = tensors(onnx.load(str(BERT))), tensors(reference(BERT, INT4))

    def keys(raws):
        return {f"blake3:{digest_bytes('blake3', raw)}" for raw in raws}

    fp32 = keys(raw for raw in base.values() if len(raw) >= 1024)  # the package's own
    new = {n: raw for n, raw in theirs.items() if n not in base}
    assert len(new) == 50  # every quantized weight and its scales (symmetric: no zero
    # points), the small scales too: a rebuild reads them instead of quantizing again
    listed = built.summary["models"][0]["external_weights"]
    assert {w["id"] for w in listed if "scenario" not in w} == fp32
    assert {w["id"] for w in listed if "scenario" in w} == keys(
        raw for raw in new.values() if len(raw) >= 1024)
    stored = set(store_index(WeightStore(tmp_path / "store")))
    files = {c["digest"] for c in built.summary["contents"]} | keys(
        [(built.path / "summary.json").read_bytes()])  # models, device lists, summary
    assert stored - files == fp32 | keys(new.values())


def assert_int4_device_runs_as_the_quantizers_model(built, source: Path, inputs: dict,
                                                    count: int, tmp_path, capsys) -> None:
    """``weightstore run --device cpu-int4`` of the package and its resolved int4 scenario
    give exactly the outputs of MatMulNBitsQuantizer's model of ``source``, reading only
    the live bytes; replayed, the scenario is that model."""
    theirs = reference(source, INT4)
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["run", str(built.path), "--device", "cpu-int4", "--inputs",
                 str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "int4" and doc["read_bytes"] == doc["live_bytes"]
    expected = run_onnxruntime(theirs, inputs)
    with np.load(tmp_path / "out.npz") as out:
        for name, want in zip(out.files, expected, strict=True):
            np.testing.assert_array_equal(out[name], want)
    with weightstore.resolve(built.path, scenario="int4") as resolved:
        session = weightstore.load(resolved)
        ops = [n.op_type for n in nodes(resolved.metadata_model)]
        assert ops.count("MatMulNBits") == count
        for got, want in zip(session.run(None, inputs), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    replayed = runnable_variant(built.path / "encoder.onnx", "int4")
    assert_same_quantization(replayed, theirs)


def test_the_int4_device_runs_as_the_quantizers_model(package, tmp_path, capsys):
    _, built = package
    inputs = sample_inputs(onnx.load(str(BERT)), seed=5)
    # 25: the attention's MatMuls read no weight
    assert_int4_device_runs_as_the_quantizers_model(built, BERT, inputs, 25, tmp_path, capsys)


def test_the_exporters_bert_builds_and_its_int4_device_runs_as_the_quantizers_model(
        tmp_path, kernel_calls, capsys):
    # torch.onnx.export's graph: weights under generated names, shape logic around them,
    # a Gemm pooler (left float, as the quantizer leaves it)
    source = copy_model(EXPORT, tmp_path / "src")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(source=source))
    built = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1)).packages[0]
    assert kernel_calls == [4] * 12
    inputs = feed("tiny-bert-export", onnx.load(str(EXPORT)))
    assert_int4_device_runs_as_the_quantizers_model(built, EXPORT, inputs, 12, tmp_path,
                                                    capsys)


def test_empty_weights_are_quantized_as_the_quantizer_does(tmp_path, capsys):
    """With ``min_elements: 0`` a MatMul weight with no element ([0, N] or [K, 0]) is
    selected, as MatMulNBitsQuantizer takes it: the same graph and payloads (empty ones),
    and the built package runs as the quantizer's model."""
    model = convnet()
    g = model.graph
    g.input.append(helper.make_tensor_value_info("none", TensorProto.FLOAT, ["batch", 0]))
    for a, shape in (("none", (0, 10)), ("h", (96, 0))):
        name = f"empty{shape[1]}"
        g.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32),
                                                     f"{name}.w"))
        g.node.append(helper.make_node("MatMul", [a, f"{name}.w"], [name],
                                       name=f"{name}/MatMul"))
        g.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                      ["batch", shape[1]]))
    src = tmp_path / "src" / "net.onnx"
    src.parent.mkdir()
    onnx.save(model, src)
    params = {"bits": 4, "block_size": 16, "symmetric": False}
    theirs = reference(src, params)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("block_size: 32, symmetric: true,\n             "
                                     "accuracy_level: 4", "block_size: 16, min_elements: 0")
                      .format(source=src).replace("size_threshold: 1024", "size_threshold: 0"))
    built = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1)).packages[0]
    replayed = runnable_variant(built.path / "encoder.onnx", "int4")
    assert assert_same_quantization(replayed, theirs) == 3
    inputs = {"image": np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(
        np.float32), "none": np.zeros((2, 0), np.float32)}
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["run", str(built.path), "--device", "cpu-int4", "--inputs",
                 str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        for name, want in zip(out.files, run_onnxruntime(theirs, inputs), strict=True):
            np.testing.assert_array_equal(out[name], want)


@pytest.mark.parametrize("block_size", ["512", "8", "48"])
def test_a_record_naming_a_block_size_the_kernels_refuse_is_a_scenario_error(block_size):
    # a model someone else made carries its derivations: only blocks of 16 to 256 (a
    # power of two) reach onnxruntime's kernels, the rest is one typed error
    from weightstore.catalogue.descriptors import DerivedWeightRecipe
    from weightstore.scenarios.derive import compute

    recipe = DerivedWeightRecipe("matmul-nbits-weight", ("w",), (
        ("bits", "4"), ("block_size", block_size), ("symmetric", "true")))
    with pytest.raises(ScenarioError, match="block size"):
        compute(recipe, [np.ones((64, 8), np.float32)])
