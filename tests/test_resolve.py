"""Resolution: phases in order, frozen result, selection, constant results, the manifest."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import weightstore
from tests import passes_models as pm
from tests import resolve_models as rm
from weightstore.cli import main
from weightstore.errors import ResolutionError
from weightstore.load import RecordingReader
from weightstore.passes.analysis import Scope
from weightstore.resolve.constants import ValueKind, analyze
from weightstore.resolve.source import open_source

from .samples import run_onnxruntime

SEED_ORDER = ["parse", "replay", "transform", "cleanup", "inference", "fold-known",
              "placement", "prepared", "closure"]


@pytest.fixture
def split(split_build):
    """The split-layout package of the sample encoder with three scenarios and devices."""
    return split_build / "out" / "pk" / "1" / "split"


def _files(folder) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_file()}


def test_phases_run_in_the_seed_order(split):
    with weightstore.resolve(split, scenario="fused") as r:
        assert [p.name for p in r.transformations.phases] == SEED_ORDER
        assert r.selected_scenario == "fused" and r.transformations.rewrites > 0
        assert r.prepared_requirements and r.payload_manifest.active


def test_resolved_model_is_frozen_and_owns_its_source(split):
    r = weightstore.resolve(split)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.selected_scenario = "fused"  # type: ignore[misc]
    copy = r.metadata_model
    del copy.graph.node[:]  # edits a copy: the frozen graph is untouched
    assert len(r.metadata_model.graph.node) > 0
    assert not r.source.closed
    r.close()
    assert r.source.closed


def test_changing_the_graph_after_resolution_is_rejected(split):
    with weightstore.resolve(split) as r:
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.model_bytes = b""  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.payload_manifest.entries = ()  # type: ignore[misc]
        edited = r.metadata_model
        del edited.graph.node[0]
        object.__setattr__(r, "model_bytes", edited.SerializeToString())  # forced past it
        with pytest.raises(ResolutionError, match="changed after it was frozen"):
            weightstore.load(r)


def test_transformation_report_names_stale_analyses_and_reruns(tmp_path):
    path = rm.save_package_model(rm.not_if_model(), tmp_path)
    with weightstore.resolve(path) as r:
        phases = r.transformations.phases
        fold = next(p for p in phases if p.name == "fold-known")
        assert fold.changed_topology and fold.stale == ("cleanup", "inference")
        assert [p.name for p in phases if p.rerun_of == "fold-known"] == ["cleanup",
                                                                           "inference"]
        assert r.transformations.reruns == ("cleanup", "inference")


def test_device_gives_scenario_and_capabilities(split):
    with weightstore.resolve(split, device="npu") as r:
        assert r.selected_scenario == "half" and r.capabilities["accelerator"] == "npu"
    with weightstore.resolve(split, device="plain") as r:
        assert r.selected_scenario is None


# -- constant-result analysis ------------------------------------------------------------

def test_constant_results_classify_without_materializing():
    model = rm.shape_if_model()
    meta = pm.metadata_copy(model)
    results = analyze(meta)
    root = Scope((), meta.graph)
    assert results.result(root, "x").kind == ValueKind.DYNAMIC
    assert results.known(root, "s").tolist() == [1, rm.H]  # from shape inference
    assert results.known(root, "cond").item() is True
    assert results.result(root, "w_out").kind == ValueKind.CONSTANT  # large: not read
    assert results.result(root, "w_out").value is None
    assert results.result(root, "y").kind == ValueKind.DYNAMIC


def test_op_over_constants_is_constant_but_not_materialized():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["ab", "x"], ["y"])], "g",
        [pm._vi("x", TensorProto.FLOAT, [64, 64])], [pm._vi("y", TensorProto.FLOAT, [64, 64])],
        initializer=[pm._init("a", [64, 64]), pm._init("b", [64, 64])])
    meta = pm.metadata_copy(pm._model(graph))
    results = analyze(meta)
    root = Scope((), meta.graph)
    assert results.result(root, "ab").kind == ValueKind.CONSTANT
    assert results.result(root, "y").kind == ValueKind.DYNAMIC


@pytest.mark.parametrize("build_model", [rm.shape_if_model, rm.not_if_model],
                         ids=["equal-gather-shape", "not-constant"])
def test_if_with_known_condition_drops_dead_branch_weights(tmp_path, build_model):
    model = build_model()
    path = rm.save_package_model(model, tmp_path, checksum=False)
    with weightstore.resolve(path) as r:
        values = {v for e in r.payload_manifest.entries for v in e.values}
        assert "w_then" in values and "w_else" not in values
        assert not any(n.op_type == "If" for n in r.metadata_model.graph.node)
        reader = RecordingReader()
        session = weightstore.load(r, reader=reader, manager=weightstore.load.WeightManager(),
                                   in_place=False)
        feed = {"x": pm._rand([1, rm.H])}
        expected = run_onnxruntime(model, feed)
        np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])
        assert reader.bytes_read == r.payload_manifest.active_bytes


@pytest.mark.parametrize("batch,live", [(2, {"w_else", "w_out"}),
                                        ("N", {"w_then", "w_else", "w_out"})])
def test_static_batch_picks_a_branch_and_symbolic_batch_keeps_both(tmp_path, batch, live):
    path = rm.save_package_model(rm.shape_if_model(batch=batch), tmp_path)
    with weightstore.resolve(path) as r:
        assert {v for e in r.payload_manifest.entries for v in e.values} == live


# -- selection ---------------------------------------------------------------------------

def test_explicit_and_callback_selection_are_mutually_exclusive(split):
    with pytest.raises(ResolutionError, match="not both"):
        weightstore.resolve(split, scenario="fused", selector=lambda ctx: "fused")


def test_selector_access_to_weight_payloads_is_impossible(split):
    seen = []

    def selector(ctx):
        seen.append(ctx)
        return "half" if ctx.capabilities.get("accelerator") == "npu" else None

    with weightstore.resolve(split, selector=selector, capabilities={"accelerator": "npu"}) as r:
        assert r.selected_scenario == "half"
    ctx, = seen
    assert ctx.scenarios == ("fused", "half", "both")
    assert dict(ctx.scenario_metadata["fused"])  # requires etc. as metadata
    # only names, strings and capabilities: nothing that locates or holds a payload
    text = repr(ctx)
    assert str(split) not in text and ".data" not in text
    for f in dataclasses.fields(ctx):
        value = getattr(ctx, f.name)
        assert isinstance(value, (tuple, type(ctx.model_metadata)))
    with pytest.raises(TypeError):
        ctx.capabilities["accelerator"] = "gpu"  # type: ignore[index]


def test_unknown_selected_scenario_fails_before_file_validation(split, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("encoder.onnx", "summary.json"):
        (bare / name).write_bytes((split / name).read_bytes())
    with pytest.raises(ResolutionError) as info:
        weightstore.resolve(bare, scenario="nope")  # every weight file is missing
    assert info.value.context["phase"] == "select"
    assert info.value.context["scenario"] == "nope"
    with pytest.raises(ResolutionError) as info:
        weightstore.resolve(bare, selector=lambda ctx: "nope")
    assert info.value.context["phase"] == "select"


def test_missing_default_or_unrelated_scenario_file_does_not_prevent_resolution(split,
                                                                              tmp_path):
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(split, copy)
    os.unlink(copy / "pk.default.data")
    os.unlink(copy / "pk.half.data")
    with weightstore.resolve(copy, scenario="both", store=tmp_path / "no-store") as r:
        assert {e.source.file for e in r.payload_manifest.active} <= _files(copy)


def test_missing_live_payload_fails_with_scenario_initializer_and_location(split, tmp_path):
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(split, copy)
    os.unlink(copy / "pk.fused.data")
    with pytest.raises(ResolutionError) as info:
        weightstore.resolve(copy, scenario="fused", store=tmp_path / "no-store")
    ctx = info.value.context
    assert ctx["phase"] == "closure" and ctx["scenario"] == "fused"
    assert ctx["location"] == "pk.fused.data" and "fused_qkv" in ctx["initializer"]
    with weightstore.resolve(copy, scenario="half", store=tmp_path / "no-store"):
        pass  # the removed file holds nothing "half" needs


# -- the manifest ------------------------------------------------------------------------

def test_manifest_entries_carry_reason_source_range_and_checksum(split):
    with weightstore.resolve(split, scenario="fused") as r:
        m = r.payload_manifest
        assert m.active and not m.dormant
        for e in m.active:
            assert e.reasons and e.source.file.startswith("pk.")
            assert e.source.checksum and e.source.store_key == e.source.checksum
            assert e.source.length > 0
        fused = [e for e in m.active if any("fused_qkv" in v for v in e.values)]
        assert fused and all(e.source.file == "pk.fused.data" for e in fused)
        ranges = [e.source.range_key for e in m.active]
        assert len(ranges) == len(set(ranges))  # one entry per range


def test_closure_over_subgraphs_functions_duplicates_and_tied_weights(tmp_path):
    path = rm.save_package_model(rm.closure_model(), tmp_path)
    with weightstore.resolve(path) as r:
        by_value = {v: e for e in r.payload_manifest.active for v in e.values}
        assert set(by_value) == {"tied_a", "tied_b", "w_cap", "w_branch"}
        assert by_value["tied_a"] is by_value["tied_b"]  # tied: one range, one entry
        assert any("captured by If" in reason for reason in by_value["w_cap"].reasons)
        assert "w_dead" not in by_value and "w_dead_reader" not in by_value
        funcs = r.metadata_model.functions
        assert funcs and funcs[0].node[0].op_type == "Constant"  # small: in the metadata


def test_resolve_command_prints_the_manifest(split, capsys):
    assert main(["resolve", str(split), "--scenario", "fused", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "fused"
    assert doc["manifest"]["totals"]["active_entries"] == len(doc["manifest"]["active"])
    assert {"file", "offset", "length", "checksum", "reasons", "values"} <= set(
        doc["manifest"]["active"][0])
    assert [p["phase"] for p in doc["transformations"]["phases"]] == SEED_ORDER
    assert main(["resolve", str(split), "--scenario", "fused", "--device", "npu"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err  # argparse refuses both
    assert main(["resolve", str(split), "--scenario", "nope"]) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_resolution_reads_no_payload_byte(split, monkeypatch):
    """Resolution opens only the model file (for its structure) and the package's summary
    (for store keys), and stats weight files."""
    opened = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    with weightstore.resolve(split, scenario="fused", transformations=["cast-fp16"],
                             cache=False):
        pass
    inside = [p for p in opened if os.path.realpath(p).startswith(str(split.resolve()))]
    assert sorted({os.path.basename(p) for p in inside}) == ["encoder.onnx", "summary.json"]
    # the key of a kept resolution digests the model files and records, no weight file
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)
    opened.clear()
    with weightstore.resolve(split, scenario="fused", transformations=["cast-fp16"]) as r:
        assert r.key is not None
    inside = [p for p in opened if os.path.realpath(p).startswith(str(split.resolve()))]
    assert inside and all(p.endswith((".onnx", ".json")) for p in inside)


def test_source_opens_package_models_by_name(split, tmp_path):
    with pytest.raises(ResolutionError, match="no such model"):
        open_source(split, model="decoder")
    with pytest.raises(ResolutionError, match="no such model file"):
        open_source(tmp_path / "missing.onnx")


def test_metadata_only_evaluators_cover_shape_arithmetic():
    from onnx import TensorProto, helper, numpy_helper

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
            np.array(value, dtype=np.int64), name))

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),                      # [2, 3, 5]
        const("one", [1]), const("three", [3]), const("zero", [0]), const("axes", [0]),
        helper.make_node("Slice", ["s", "one", "three", "zero"], ["tail"]),  # [3, 5]
        helper.make_node("Concat", ["tail", "one"], ["cat"], axis=0),         # [3, 5, 1]
        helper.make_node("Unsqueeze", ["cat", "axes"], ["u"]),               # [[3, 5, 1]]
        helper.make_node("Squeeze", ["u", "axes"], ["sq"]),                  # [3, 5, 1]
        helper.make_node("Cast", ["sq"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Size", ["x"], ["n"]),                              # 30
        helper.make_node("Mul", ["tail", "three"], ["m"]),                   # [9, 15]
        helper.make_node("Sub", ["m", "one"], ["d"]),                        # [8, 14]
        helper.make_node("Add", ["d", "one"], ["a"]),                        # [9, 15]
        helper.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [pm._vi("x", TensorProto.FLOAT, [2, 3, 5])],
                              [pm._vi("y", TensorProto.FLOAT, [2, 3, 5]),
                               pm._vi("f", TensorProto.FLOAT, [3]),
                               pm._vi("n", TensorProto.INT64, []),
                               pm._vi("a", TensorProto.INT64, [2])])
    model = pm._model(graph)
    results = analyze(model)
    root = Scope((), model.graph)
    assert results.known(root, "tail").tolist() == [3, 5]
    assert results.known(root, "cat").tolist() == [3, 5, 1]
    assert results.known(root, "u").tolist() == [[3, 5, 1]]
    assert results.known(root, "sq").tolist() == [3, 5, 1]
    assert results.known(root, "f").dtype == np.float32
    assert int(results.known(root, "n")) == 30
    assert results.known(root, "a").tolist() == [9, 15]
    assert results.result(root, "y").kind == ValueKind.DYNAMIC
    assert results.counts()["known"] >= 12
