"""What resolution shares and does on demand: one parse per model file, a constant-result
analysis proportional to what folding asks, device models closed over as resolved, and one
rule for the files behind live weights."""

from __future__ import annotations

import contextlib
import shutil
import sys

import onnx
import pytest
from onnx import TensorProto, helper

import weightstore
import weightstore.catalogue.reader as catalogue_reader
from tests import passes_models as pm
from tests import resolve_models as rm
from weightstore.catalogue.metadata import metadata_model
from weightstore.catalogue.reader import read_catalogue
from weightstore.errors import ExternalDataError, IntegrityError, ModelError, ResolutionError
from weightstore.packaging.bundles import assemble
from weightstore.packaging.check import check_package
from weightstore.passes.analysis import Scope, iter_scopes
from weightstore.passes.base import PassContext
from weightstore.passes.fold_constant_if import FoldConstantIf
from weightstore.resolve.constants import ValueCounts, ValueKind, analyze
from weightstore.resolve.files import file_problems
from weightstore.resolve.source import open_source
from weightstore.resolve.variant import resolve_variant

from .helpers import record_calls
from .samples import make_encoder


@pytest.fixture
def split(split_build):
    return split_build / "out" / "pk" / "1" / "split"


@pytest.fixture
def walks(monkeypatch):
    """The catalogue walks resolution makes (wire-level reads of a model file by the
    source it opened; not the test's own)."""
    calls: list[tuple] = []
    real = catalogue_reader.catalogue_from

    def recorded(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__") == "weightstore.resolve.model_source":
            calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(catalogue_reader, "catalogue_from", recorded)
    return calls


@pytest.fixture
def inferences(monkeypatch):
    """onnx shape inference runs (through its C++ extension)."""
    from weightstore.io import onnx_native

    return record_calls(monkeypatch, onnx_native, "infer_shapes")


# -- one parse per model file --------------------------------------------------------------

def test_packaged_model_is_parsed_once_without_a_wire_walk(split, walks):
    model = split / "encoder.onnx"
    with contextlib.closing(open_source(model)) as src:
        meta = src.metadata()
        for scenario in (None, "fused", "half"):
            resolve_variant(src, scenario)
    with read_catalogue(model) as catalogue:
        expected = metadata_model(catalogue)
    assert meta.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True)
    report = check_package(split, device="npu")
    assert report.ok and walks == []


def test_metadata_copies_are_the_callers_to_change(split):
    with contextlib.closing(open_source(split / "encoder.onnx")) as src:
        first = src.metadata()
        del first.graph.node[:]
        assert len(src.metadata().graph.node) > 0


def test_large_inline_payloads_are_left_out_by_the_catalogue(tmp_path, walks):
    model = make_encoder()  # every weight inline, most above the small-value limit
    path = tmp_path / "inline.onnx"
    onnx.save(model, str(path))
    with contextlib.closing(open_source(path)) as src:
        meta = src.metadata()
        with read_catalogue(path) as catalogue:
            expected = metadata_model(catalogue)
    assert [str(p) for _, p in walks] == [str(path)]
    assert meta.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True)
    assert not meta.graph.initializer[0].raw_data  # the large word embedding: omitted


def test_a_catalogue_asked_for_after_a_rewrite_is_refused(split, tmp_path):
    """The catalogue walked late must describe the file the metadata was parsed from."""
    path = tmp_path / "encoder.onnx"
    shutil.copyfile(split / "encoder.onnx", path)
    with contextlib.closing(open_source(path)) as src:
        with open(path, "ab") as f:  # rewritten in place: the same inode, other bytes
            f.write(b"\x00")
        with pytest.raises(ModelError, match="changed since it was parsed"):
            src.catalogue  # noqa: B018


def test_a_model_that_is_not_onnx_still_fails_naming_the_file(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07" * 10)
    with pytest.raises(ModelError, match="not an ONNX model"):
        open_source(path)


# -- constant-result analysis on demand ----------------------------------------------------

def _dims_if_model(batch: int, length: int = 1) -> onnx.ModelProto:
    """``If(Equal(Gather(Shape(chain(x)), 0), 2))`` where ``chain`` is ``length`` Relus: the
    dims of its end are known only from shape inference."""
    nodes = []
    value = "x"
    for i in range(length):
        nodes.append(helper.make_node("Relu", [value], [f"r{i}"]))
        value = f"r{i}"
    nodes += rm.shape_if_nodes(value, 2, "y")
    graph = helper.make_graph(nodes, "dims_if", [pm._vi("x", TensorProto.FLOAT, [batch, rm.H])],
                              [pm._vi("y", TensorProto.FLOAT, [1, rm.H])])
    return pm._model(graph)


def test_no_shape_inference_when_no_shape_needs_dims(inferences):
    for model in (rm.not_if_model(), rm.shape_if_model()):  # declared dims suffice
        results = analyze(model)
        root = Scope((), model.graph)
        cond = next(n for n in model.graph.node if n.op_type == "If").input[0]
        assert results.known(root, cond) is not None
    assert inferences == []


def test_shape_inference_runs_once_however_much_is_asked(inferences):
    model = _dims_if_model(batch=2)
    results = analyze(model)
    root = Scope((), model.graph)
    assert results.known(root, "cond").item() is True
    assert results.known(root, "d0").item() == 2
    results.counts()
    assert len(inferences) == 1


def test_folding_asks_only_the_condition_cone(inferences):
    """A graph of many nodes beside an If on a declared dim: nothing but the cone runs."""
    model = rm.shape_if_model()
    extra = [helper.make_node("Relu", ["y" if i == 0 else f"z{i - 1}"], [f"z{i}"])
             for i in range(500)]
    model.graph.node.extend(extra)
    results = analyze(model)
    FoldConstantIf()(model, PassContext(known=results.known))
    assert len(results._memo) < 10 and inferences == []


def test_a_long_chain_is_no_deep_recursion():
    model = _dims_if_model(batch=2, length=3000)
    results = analyze(model)
    assert results.known(Scope((), model.graph), "cond").item() is True


def test_results_do_not_depend_on_the_order_of_questions():
    model = pm.metadata_copy(make_encoder(layers=2))
    names = [(scope, name) for scope in iter_scopes(model, functions=False)
             for name in [*(i.name for i in scope.container.input),
                          *(o for n in scope.container.node for o in n.output if o)]]
    forward, backward = analyze(model), analyze(model)
    first = [forward.result(s, n) for s, n in names]
    second = [backward.result(s, n) for s, n in reversed(names)][::-1]
    assert [r.kind for r in first] == [r.kind for r in second]
    assert any(r.kind == ValueKind.KNOWN for r in first)
    assert dict(ValueCounts(analyze(model))) == forward.counts()
    mixed = analyze(model)  # folding's questions first, then the full classification
    known = [mixed.known(s, n) for s, n in names]
    assert [k is not None for k in known] == [r.kind == ValueKind.KNOWN for r in first]
    assert [mixed.result(s, n).kind for s, n in names] == [r.kind for r in first]


def test_a_fold_pass_instance_runs_again_on_another_model():
    folded, again = rm.not_if_model(), rm.shape_if_model()
    reused = FoldConstantIf()
    reused(folded, PassContext())
    records = reused(again, PassContext(known=analyze(again).known))
    fresh = FoldConstantIf()(again, PassContext(known=analyze(again).known))
    assert [r.added_initializers for r in records] == [r.added_initializers for r in fresh]
    assert records and records[0].added_initializers[0].name == "w_then"


# -- device models and the file rule -------------------------------------------------------

@pytest.mark.parametrize("device", ["npu", "cpu", "plain", "pinned"])
def test_a_device_model_is_the_phases_fixpoint(split, device):
    """Closing over a device model as written gives what resolving it again gives."""
    model = split / "devices" / device / "encoder.onnx"
    with contextlib.closing(open_source(model)) as src:
        again = resolve_variant(src, None)
        final = resolve_variant(src, None, final=True)
    assert again.manifest.to_dict() == final.manifest.to_dict()
    assert [p.name for p in final.transformations.phases] == ["closure"]


def test_bundle_checks_the_device_models_payloads(split, tmp_path):
    out = tmp_path / "npu"
    assemble(split, "npu", out)
    data = next(p for p in out.iterdir() if p.suffix == ".data")
    data.write_bytes(data.read_bytes()[:-1] + bytes([data.read_bytes()[-1] ^ 1]))
    # the device model's external data names ranges only: its keys are the folder's
    # bundle.json's, which the model file opened on its own finds beside it
    with contextlib.closing(open_source(out / "encoder.onnx")) as src:
        entries = resolve_variant(src, "half", final=True).external
    with pytest.raises(IntegrityError, match="do not match"):
        file_problems(out, entries, "half", strict=True, verify=True)
    # without the record there is nothing to verify against, and verify says so
    (out / "bundle.json").unlink()
    with contextlib.closing(open_source(out / "encoder.onnx")) as src:
        entries = resolve_variant(src, "half", final=True).external
    with pytest.raises(IntegrityError, match="no checksum"):
        file_problems(out, entries, "half", strict=True, verify=True)


def test_one_file_rule_strict_or_collecting(split, tmp_path):
    copy = tmp_path / "pk"
    shutil.copytree(split, copy)
    (copy / "pk.half.data").unlink()
    with contextlib.closing(open_source(copy / "encoder.onnx")) as src:
        entries = resolve_variant(src, "half").external
    problems = file_problems(copy, entries, "half", strict=False, model="encoder.onnx")
    assert problems and all("pk.half.data" in p and "scenario=half" in p for p in problems)
    with pytest.raises(ExternalDataError, match="missing") as err:
        file_problems(copy, entries, "half", strict=True)
    assert err.value.context["scenario"] == "half"
    assert err.value.context["location"] == "pk.half.data"
    # the closure phase applies the same rule, naming its phase
    with pytest.raises(ResolutionError) as err:
        weightstore.resolve(copy, scenario="half")
    assert err.value.context["phase"] == "closure"
    assert err.value.context["location"] == "pk.half.data"
    # and check reports it as a problem, not an error
    report = check_package(copy, scenario="half")
    assert not report.ok and any("pk.half.data" in p for p in report.problems)
    assert check_package(copy).ok  # the default graph does not need that file
