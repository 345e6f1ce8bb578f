"""The metadata-only catalogue: descriptors locate every payload without reading it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.descriptors import weight_descriptors
from weightstore.catalogue.inspect import inspect_model
from weightstore.catalogue.reader import read_catalogue
from weightstore.catalogue.sites import iter_tensor_sites

from .samples import make_encoder
from .test_convert import _typed_model


def _exotic_model() -> onnx.ModelProto:
    """Every place and kind of tensor the catalogue must handle."""
    rng = np.random.default_rng(5)
    f32 = rng.standard_normal((4, 5)).astype(np.float32)
    inits = [
        numpy_helper.from_array(f32, "f32"),
        numpy_helper.from_array(rng.standard_normal(9).astype(np.float16), "f16"),
        helper.make_tensor("bf16", TensorProto.BFLOAT16, [6],
                           rng.standard_normal(6).astype(np.float32)),
        helper.make_tensor("i4", TensorProto.INT4, [5], [1, -2, 3, -4, 5]),
        helper.make_tensor("f8", TensorProto.FLOAT8E4M3FN, [3], [0.5, 1.0, -2.0]),
        numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"),
        numpy_helper.from_array(np.array(7, np.int64), "scalar"),
        helper.make_tensor("dbl", TensorProto.DOUBLE, [3], [1.5, 2.5, -3.5]),
        helper.make_tensor("u64", TensorProto.UINT64, [2], [2**63 + 5, 9]),
        helper.make_tensor("text", TensorProto.STRING, [2], [b"ab", b"cde"]),
    ]
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, 2.5], np.float32), "sp"),
        numpy_helper.from_array(np.array([1, 7], np.int64), "sp_idx"), [10])
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["branch_out"])], "then", [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.arange(3, dtype=np.float32), "inner")])
    else_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["branch_out"],
                          value=helper.make_tensor("c", TensorProto.FLOAT, [3], [4, 5, 6]))],
        "else", [], [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [3])])
    nodes = [
        helper.make_node("If", ["cond"], ["picked"], then_branch=then_graph,
                         else_branch=else_graph),
        helper.make_node("ConstantOfShape", ["shape"], ["filled"],
                         value=numpy_helper.from_array(np.array([3], np.int32))),
        helper.make_node("Constant", [], ["sparse_const"], sparse_value=sparse),
    ]
    graph = helper.make_graph(
        nodes, "exotic",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [3])],
        inits, sparse_initializer=[sparse])
    fn = helper.make_function(
        "local", "Scale", ["x"], ["y"],
        [helper.make_node("Constant", [], ["k"],
                          value=numpy_helper.from_array(np.full(4, 2, np.float32))),
         helper.make_node("Mul", ["x", "k"], ["y"])],
        [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, functions=[fn],
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("local", 1)])
    info = model.training_info.add()
    info.initialization.CopyFrom(helper.make_graph(
        [], "init", [], [],
        [numpy_helper.from_array(np.ones(5, np.float32), "train_w")]))
    return model


MODELS = {
    "encoder": lambda: make_encoder(),
    "typed": _typed_model,
    "exotic": _exotic_model,
}


def _expected(t: TensorProto) -> bytes:
    return numpy_helper.from_array(numpy_helper.to_array(t)).raw_data


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_descriptor_recovers_its_bytes(name, tmp_path):
    model = MODELS[name]()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    sites = list(iter_tensor_sites(onnx.load(str(path))))
    with read_catalogue(path) as catalogue:
        assert catalogue.model.ByteSize() < path.stat().st_size
        weights = weight_descriptors(catalogue)
        assert [w.path for w in weights] == [s.path for s in sites]
        for w, site in zip(weights, sites, strict=True):
            if site.tensor.data_type == TensorProto.STRING:
                assert w.payload is None
                continue
            assert w.read(catalogue) == _expected(site.tensor), w.where
            assert w.nbytes == len(_expected(site.tensor))
            p = w.payload
            assert p.offset >= 0 and p.offset + p.length <= path.stat().st_size


def test_external_descriptors(tmp_path):
    model = make_encoder()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False,
              size_threshold=256)
    full = list(iter_tensor_sites(onnx.load(str(path))))
    with read_catalogue(path) as catalogue:
        weights = weight_descriptors(catalogue)
        external = [w for w in weights if w.is_external]
        assert external
        for w, site in zip(weights, full, strict=True):
            assert w.read(catalogue) == _expected(site.tensor)
        for w in external:
            assert (tmp_path / w.payload.location).is_file()
            assert w.payload.file.parent == tmp_path


def test_empty_is_not_omitted(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_exotic_model(), str(path))
    with read_catalogue(path) as catalogue:
        by_name = {w.name: w for w in weight_descriptors(catalogue)}
        assert by_name["empty"].is_empty and by_name["empty"].read(catalogue) == b""
        assert by_name["f32"].nbytes == 80 and not by_name["f32"].is_empty
        stripped = next(t for t in catalogue.model.graph.initializer if t.name == "f32")
        assert not stripped.raw_data  # omitted from the metadata model, yet described
        roles = {w.role for w in by_name.values()}
        assert roles == {"initializer", "constant", "attribute", "sparse"}
        assert by_name["train_w"].scope == ("training init",)
        assert by_name["k"].function == "local:Scale"


def _garble_payloads(path, catalogue) -> None:
    """Overwrite every payload byte of the file (tags and lengths stay intact)."""
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(1)
    for payload in catalogue.payloads.values():
        for f in payload.fields:
            data[f.value:f.end] = rng.integers(0, 256, f.end - f.value, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inspect_reads_no_payload_byte(name, tmp_path, capsys):
    from weightstore.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(MODELS[name](), str(path))
    before = inspect_model(path)
    with read_catalogue(path) as catalogue:
        _garble_payloads(path, catalogue)
    assert _values_changed(path, name)  # the garbling really hit the payloads
    assert inspect_model(path) == before
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] == before["totals"]


def _values_changed(path, name) -> bool:
    """Does the garbled file hold other values than the original model?"""
    original = {s.path: s.tensor.SerializeToString() for s in iter_tensor_sites(MODELS[name]())}
    try:
        garbled = onnx.load(str(path))
    except DecodeError:  # garbage in packed varints: protobuf cannot even parse it
        return True
    return any(s.tensor.SerializeToString() != original[s.path]
               for s in iter_tensor_sites(garbled))


def test_inspect_table(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_exotic_model(), str(path))
    from weightstore.catalogue.inspect import render_table

    text = render_table(inspect_model(path))
    assert "sparse" in text and "inline string_data" in text and "tensors" in text.splitlines()[-1]
