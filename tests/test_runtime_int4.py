"""The int4 runtime folder: recipes/runtime-folder.yaml packages onnxruntime-genai's fp32
export of the tiny Llama (examples/tiny_llm/fp32) with an ``int4`` scenario, the
``quantize-weights`` pass with the settings the builder's ``-p int4 -e cpu`` used, and a
``cpu-int4`` device. That device's folder, from ``weightstore bundle`` and from
``weightstore pull --device cpu-int4`` against a real registry, is a runtime folder:
``onnxruntime_genai.Model`` loads it and generates token for token what the builder's own
int4 export (examples/tiny_llm/int4) generates. Its weights are the builder's int4 export's,
byte for byte: the int4 matrices and the weights it shares with fp32, none of the fp32
matrices the int4 ones replaced, in weight files of at most 1.1x those live bytes.

The settings, read from the builder's int4 graph: every MatMulNBits has ``bits`` 4,
``block_size`` 32 and ``accuracy_level`` 4 and no zero-point input (symmetric); every MatMul
of the fp32 graph became one, ``lm_head`` too; the embedding's Gather stays float (no
GatherBlockQuantized): the builder's int4 is onnxruntime's MatMulNBitsQuantizer over its
own fp32 graph, which the pass reproduces.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from weightstore.cli import main
from weightstore.registry.pull import pull
from weightstore.store import WeightStore

from .helpers import build_example, file_tree
from .registry_server import needs_registry, running_registry
from .tiny_llm import TINY_LLM, assert_generates_as_builder

DEVICE = "cpu-int4"
COMPANIONS = ("genai_config.json", "tokenizer.json", "tokenizer_config.json")
LIMIT = 1.1  # a device folder's weight bytes against its live bytes


def _weights(path: Path) -> dict[str, bytes]:
    """Every initializer of the graph at ``path`` (external data read), name -> raw bytes."""
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runtime-int4")
    folder = build_example(root, "runtime-folder") / "tiny-llm" / "1.0.0" / "runtime"
    return folder, root / "store"


def test_the_builders_int4_settings() -> None:
    """What the recipe's pass parameters say is what the builder's int4 graph holds."""
    fp32 = onnx.load(str(TINY_LLM / "fp32" / "model.onnx"), load_external_data=False)
    int4 = onnx.load(str(TINY_LLM / "int4" / "model.onnx"), load_external_data=False)
    quantized = [n for n in int4.graph.node if n.op_type == "MatMulNBits"]
    assert [n.name for n in quantized] == [
        f"{n.name}_Q4" for n in fp32.graph.node if n.op_type == "MatMul"]
    assert "/lm_head/MatMul_Q4" in {n.name for n in quantized}
    for node in quantized:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, 32, 4)
        assert len(node.input) == 3  # A, weight, scales: no zero points
    assert not [n for n in int4.graph.node if n.op_type == "GatherBlockQuantized"]
    import yaml

    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes"
                             / "runtime-folder.yaml").read_text())
    (scenario,) = recipe["models"][0]["scenarios"]
    assert scenario["passes"] == [{"name": "quantize-weights", "bits": 4, "block_size": 32,
                                   "symmetric": True, "accuracy_level": 4}]
    assert {"name": DEVICE, "scenario": scenario["name"]} in recipe["devices"]


def _is_the_builders_int4_folder(folder: Path, package: Path) -> None:
    """``folder`` runs as the builder's int4 export and carries its weights only."""
    tree = file_tree(folder)
    for name in COMPANIONS:
        assert tree[name] == (TINY_LLM / "fp32" / name).read_bytes(), name
    # the builder's int4 weights, byte for byte: the int4 matrices and the shared ones
    assert _weights(folder / "model.onnx") == _weights(TINY_LLM / "int4" / "model.onnx")
    record = json.loads(tree["bundle.json"])
    (model,) = record["models"]
    assert model["scenario"] == "int4"
    external = {w["name"] for w in model["external_weights"]}
    fp32 = _weights(TINY_LLM / "fp32" / "model.onnx")
    assert external and not {n for n in external if n.endswith(".MatMul.weight")}
    assert {n for n in external if n in fp32} == {
        "model.embed_tokens.weight", "cos_cache", "sin_cache"}  # shared with fp32
    weight_bytes = sum(len(tree[f["name"]]) for f in record["files"])
    assert weight_bytes <= LIMIT * model["live_bytes"], (weight_bytes, model["live_bytes"])
    for p in folder.rglob("*"):  # real files, no holes
        assert p.stat().st_blocks * 512 >= p.stat().st_size, p.name
    # and the package's fp32 matrices are in the package, not in the device's folder
    assert set(_weights(package / "model.onnx")) == set(fp32)
    assert_generates_as_builder(folder, "int4")


def test_the_bundle_is_the_builders_int4_export(package, tmp_path, capsys) -> None:
    folder, _ = package
    assert main(["verify", str(folder)]) == 0
    assert_generates_as_builder(folder, "fp32")  # the package folder runs the fp32 graph
    assert main(["bundle", str(folder), DEVICE, "--output", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    _is_the_builders_int4_folder(tmp_path / "a", folder)
    assert main(["bundle", str(folder), DEVICE, "--output", str(tmp_path / "b")]) == 0
    assert file_tree(tmp_path / "a") == file_tree(tmp_path / "b")  # deterministic


@needs_registry
def test_pull_device_is_the_builders_int4_export(package, tmp_path, capsys) -> None:
    folder, store = package
    with running_registry(tmp_path / "registry") as server:
        ref = f"{server.host}/tiny-llm:1.0.0"
        assert main(["push", str(folder), ref, "--store", str(store)]) == 0
        report = pull(ref, tmp_path / "pulled", store=WeightStore(tmp_path / "fresh-store"),
                      device=DEVICE)
        assert main(["pull", ref, str(tmp_path / "cli"), "--device", DEVICE,
                     "--store", str(tmp_path / "cli-store")]) == 0
    capsys.readouterr()
    _is_the_builders_int4_folder(tmp_path / "pulled", folder)
    assert file_tree(tmp_path / "cli") == file_tree(tmp_path / "pulled")
    assert main(["bundle", str(folder), DEVICE, "--output", str(tmp_path / "bundled")]) == 0
    assert file_tree(tmp_path / "pulled") == file_tree(tmp_path / "bundled")
    # it downloads the folder's bytes and the package's metadata (manifest, summary, the
    # graph its records are in), not the fp32 matrices the int4 ones replaced
    fp32_matrices = sum(len(b) for n, b in _weights(TINY_LLM / "fp32" / "model.onnx").items()
                        if n.endswith(".MatMul.weight"))
    pulled = sum(len(b) for b in file_tree(tmp_path / "pulled").values())
    assert report.received_bytes - pulled < fp32_matrices, (report.to_dict(), pulled)
