"""Loading: only manifest ranges, each once, verified; mapped into onnxruntime."""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil

import numpy as np
import onnx
import pytest

import weightstore
from tests import passes_models as pm
from tests import resolve_models as rm
from weightstore.cli import main
from weightstore.errors import IntegrityError, LoadError
from weightstore.load import CHUNK, LoadReport, RecordingReader, WeightManager, plan_reads
from weightstore.load import mapped as mapped_module
from weightstore.load.executor import execute, lanes
from weightstore.load.mapped import MappedData, layout
from weightstore.load.session import packed_only
from weightstore.resolve.runnable import runnable_variant

from .helpers import relist
from .samples import run_onnxruntime, sample_inputs


@pytest.fixture
def built(split_build):
    return split_build


@pytest.fixture
def split(built):
    return built / "out" / "pk" / "1" / "split"


def _reference(package, scenario):
    full = runnable_variant(package / "encoder.onnx", scenario)
    feed = sample_inputs(full)
    return feed, run_onnxruntime(full, feed)


def _intervals(reads):
    return sorted((str(p), o, o + n) for p, o, n in reads)


def _union(intervals):
    """Sorted (path, start, end) intervals merged where they touch."""
    out: list[list] = []
    for path, start, end in sorted(intervals):
        if out and out[-1][0] == path and start <= out[-1][2]:
            out[-1][2] = max(out[-1][2], end)
        else:
            out.append([path, start, end])
    return [tuple(i) for i in out]


def _manifest_intervals(resolved, folder):
    return _union((str((folder / e.source.file).resolve()), e.source.offset,
                   e.source.offset + e.source.length)
                  for e in resolved.payload_manifest.active)


@pytest.mark.parametrize("scenario", [None, "fused", "half"])
def test_every_read_belongs_to_the_frozen_manifest(split, scenario):
    with weightstore.resolve(split, scenario=scenario) as r:
        reader = RecordingReader()
        report = LoadReport()
        session = weightstore.load(r, reader=reader, manager=WeightManager(), report=report)
        reads = _intervals(reader.reads)
        for (p1, _, e1), (p2, s2, _) in itertools.pairwise(reads):
            assert p1 != p2 or e1 <= s2  # each byte once
        assert _union(reads) == _manifest_intervals(r, split)  # the manifest, all of it
        assert report.read_bytes == report.live_bytes == r.payload_manifest.active_bytes
        feed, expected = _reference(split, scenario)
        for a, b in zip(session.run(None, feed), expected, strict=True):
            np.testing.assert_array_equal(a, b)


def test_removed_or_dead_initializer_is_never_read(tmp_path):
    model = rm.closure_model()
    path = rm.save_package_model(model, tmp_path, checksum=False)
    dead = {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer
            if t.name in ("w_dead", "w_dead_reader")}
    with weightstore.resolve(path) as r:
        reader = RecordingReader()
        session = weightstore.load(r, reader=reader, manager=WeightManager(), in_place=False)
        for t in dead.values():
            info = {e.key: e.value for e in t.external_data}
            start, end = int(info["offset"]), int(info["offset"]) + int(info["length"])
            assert all(e <= start or s >= end for _, s, e in _intervals(reader.reads))
        feed = {"x": pm._rand([1, rm.H]), "flag": np.array(True)}
        np.testing.assert_array_equal(session.run(None, feed)[0],
                                      run_onnxruntime(model, feed)[0])


def test_replacement_initializer_and_derived_sources_are_read_exactly_once(tmp_path):
    model, inputs = pm.attention_block()
    path = rm.save_package_model(model, tmp_path, checksum=False)
    with weightstore.resolve(path, transformations=["fuse-qkv"]) as r:
        m = r.payload_manifest
        assert {d.operation for d in m.derivations} == {"concat"}
        sources = {s for d in m.derivations for s in d.sources}
        by_value = {v: e for e in m.active for v in e.values}
        assert sources <= set(by_value)
        assert all(e.origin == "derived-source" or e.reasons for e in m.active)
        reader = RecordingReader()
        session = weightstore.load(r, reader=reader, manager=WeightManager(), in_place=False)
        ranges = [(s, e) for _, s, e in _intervals(reader.reads)]
        for name in sources:
            src = by_value[name].source
            covering = [1 for s, e in ranges if s <= src.offset and src.offset + src.length <= e]
            assert covering == [1]
        assert reader.bytes_read == m.active_bytes
        for feed in inputs:
            for a, b in zip(session.run(None, feed), run_onnxruntime(model, feed), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reads_are_coalesced_and_chunked(split):
    with weightstore.resolve(split) as r:
        active = r.payload_manifest.active
        plan = plan_reads(active, split, r.source.path, chunk=4096)
        assert len(plan.runs) < len(active)  # adjacent ranges coalesced
        assert all(c.length <= 4096 for c in plan.chunks)
        assert plan.read_bytes == r.payload_manifest.active_bytes
        assert CHUNK == 10 << 20
        default = plan_reads(active, split, r.source.path)
        assert all(c.length <= CHUNK for c in default.chunks)


@pytest.mark.parametrize("chunk", [4096, 3000])
def test_entries_are_verified_as_their_chunks_land_in_memory_and_in_a_mapped_file(split, chunk):
    """Small chunks cut entries across chunks and lanes; every entry is still hashed in
    order, and the mapped file's slots hold exactly the bytes read."""
    with weightstore.resolve(split) as r:
        active = r.payload_manifest.active
        entries = {e.id: e for e in r.payload_manifest.entries}
        plan = plan_reads(active, split, r.source.path, chunk=chunk)
        assert any(c.length == chunk for c in plan.chunks)
        assert len(lanes(plan)) < len(plan.chunks)  # entries spanning chunks share a lane
        plain = execute(plan, entries, RecordingReader())
        slots, end = layout([run.length for run in plan.runs])
        with MappedData(end) as mapped:
            sunk = execute(plan, entries, RecordingReader(), sink=(mapped, slots))
            assert set(plain.data) == set(sunk.data) == {e.id for e in active}
            for e in active:
                raw = (split / e.source.file).read_bytes()[
                    e.source.offset:e.source.offset + e.source.length]
                assert bytes(plain.data[e.id]) == bytes(sunk.data[e.id]) == raw
            folder = mapped.folder
            del sunk
        assert not folder.exists()


def test_a_load_leaves_no_data_file_behind(split, monkeypatch):
    made = []
    real = mapped_module._temp_dir

    def spy(size=0):
        made.append(real(size))
        return made[-1]

    monkeypatch.setattr(mapped_module, "_temp_dir", spy)
    with weightstore.resolve(split) as r:
        session = weightstore.load(r, manager=WeightManager(), in_place=False)
        assert made and not any(folder.exists() for folder in made)
        feed, expected = _reference(split, None)
        np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])


def test_a_shared_memory_folder_without_room_sends_the_data_file_elsewhere(monkeypatch):
    monkeypatch.setattr(mapped_module, "_room", lambda folder: 1 << 20)
    with MappedData(2 << 20) as small:
        assert small.folder.parent != mapped_module.SHM
    with MappedData(1000) as tiny:
        usable = mapped_module.SHM.is_dir() and os.access(mapped_module.SHM, os.W_OK)
        assert (tiny.folder.parent == mapped_module.SHM) == usable


def test_corrupt_portable_payload_fails_naming_scenario_initializer_and_location(split,
                                                                                tmp_path):
    copy = tmp_path / "pkg"
    shutil.copytree(split, copy)
    with weightstore.resolve(copy, scenario="fused") as r:
        victim = r.payload_manifest.active[0]
        with open(copy / victim.source.file, "r+b") as f:
            f.seek(victim.source.offset)
            byte = f.read(1)
            f.seek(victim.source.offset)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(IntegrityError) as info:
            weightstore.load(r, manager=WeightManager())
        ctx = info.value.context
        assert ctx["scenario"] == "fused" and ctx["initializer"] == victim.values[0]
        assert ctx["location"] == victim.source.file


def test_caller_buffers_win_over_the_package_folder(split):
    with weightstore.resolve(split) as r:
        buffers = {"pk.common.data": (split / "pk.common.data").read_bytes()}
        reader = RecordingReader()
        session = weightstore.load(r, buffers=buffers, reader=reader, manager=WeightManager())
        assert all(p.name != "pk.common.data" for p, _, _ in reader.reads)
        feed, expected = _reference(split, None)
        np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])
        with pytest.raises(LoadError, match="too small"):
            weightstore.load(r, buffers={"pk.common.data": buffers["pk.common.data"][:100]},
                             manager=WeightManager())


def test_caller_buffers_of_packed_weights_are_handed_over_without_copies(split,
                                                                        monkeypatch):
    import weightstore.load.session as session_module

    handed: dict = {}
    bind = session_module.bind_payloads

    def spy(*args, **kwargs):
        out = bind(*args, **kwargs)
        handed.update(kwargs["handed"])
        return out

    monkeypatch.setattr(session_module, "bind_payloads", spy)
    with weightstore.resolve(split) as r:
        memory = np.fromfile(split / "pk.common.data", dtype=np.uint8)
        session = weightstore.load(r, buffers={"pk.common.data": memory},
                                   manager=WeightManager())
        packed = packed_only(r, r.frozen_model())
        from_buffer = {v for e in r.payload_manifest.active
                       if e.source.file == "pk.common.data" for v in e.values}
        main = {t.name for t in r.frozen_model().graph.initializer}  # not the If's
        assert handed and set(handed) == packed & from_buffer & main
        assert all(np.shares_memory(a, memory) for a in handed.values())
        feed, expected = _reference(split, None)
        np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])


def test_package_folder_with_only_models_runs_from_the_store(built, split, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("encoder.onnx", "summary.json"):
        shutil.copyfile(split / name, bare / name)
    with weightstore.resolve(bare, scenario="fused", store=built / "store") as r:
        reader = RecordingReader()
        session = weightstore.load(r, reader=reader, manager=WeightManager())
        assert reader.reads and all(str(built / "store") in str(p) for p, _, _ in reader.reads)
        feed, expected = _reference(split, "fused")
        np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])



def test_weights_in_neither_folder_nor_store_name_the_store_searched(built, split, tmp_path,
                                                                    capsys):
    """The package folder lacks its weight files and the store given is not the one that
    built it: the one-line error says which store was searched and how to give another."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("encoder.onnx", "summary.json"):
        shutil.copyfile(split / name, bare / name)
    empty = tmp_path / "other-store"
    weightstore.WeightStore(empty)
    assert main(["resolve", str(bare), "--store", str(empty)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "the store does not hold its bytes" in err and f"store={empty}" in err
    assert "--store" in err.split("hint=", 1)[1]
    assert main(["resolve", str(bare), "--store", str(built / "store")]) == 0

def test_sessions_share_buffers_through_the_weight_manager(split):
    """Weights onnxruntime maps are held once and shared; a weight every consumer
    pre-packs is not held (onnxruntime drops it once packed), so a later load reads it."""
    manager = WeightManager()
    with weightstore.resolve(split) as r:
        packed = packed_only(r, r.frozen_model())
        held = [e for e in r.payload_manifest.active if not packed & set(e.values)]
        again = [e for e in r.payload_manifest.active if packed & set(e.values)]
        assert held and again
        first = weightstore.load(r, manager=manager, in_place=False)
        digest = held[0].source.checksum
        assert manager.refcount(digest) == 1
        assert all(manager.refcount(e.source.checksum) == 0 for e in again)
        report = LoadReport()
        second = weightstore.load(r, manager=manager, report=report, in_place=False)
        assert report.entries_shared == len(held)
        assert report.read_bytes == sum(e.source.length for e in again)
        assert manager.refcount(digest) == 2
        feed, expected = _reference(split, None)
        for session in (first, second):
            np.testing.assert_array_equal(session.run(None, feed)[0], expected[0])
        del first, second, session
        gc.collect()
        assert manager.refcount(digest) == 0 and manager.held_bytes == 0


def test_constant_node_export_folds_batchnorm_and_loads(tmp_path):
    """A Conv->BatchNormalization export keeping weights in Constant nodes (typed
    float_data, inline in the model file) resolves with fold-batchnorm and runs."""
    model, inputs = pm.conv_bn_constant_model()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with weightstore.resolve(path, transformations=["fold-batchnorm"]) as r:
        m = r.payload_manifest
        assert len(m.derivations) == 4  # two folds: weight and bias each
        assert {e.source.encoding for e in m.active} == {"float_data"}
        reader = RecordingReader()
        session = weightstore.load(r, reader=reader, manager=WeightManager())
        assert {p.name for p, _, _ in reader.reads} == {"model.onnx"}
        ops = [n.op_type for n in r.metadata_model.graph.node]
        assert ops.count("BatchNormalization") == 1  # bn3 does not fold (c3 read twice)
        for feed in inputs:
            np.testing.assert_allclose(session.run(None, feed)[0],
                                       run_onnxruntime(model, feed)[0], rtol=1e-5, atol=1e-5)


def test_run_command(split, tmp_path, capsys):
    feed, expected = _reference(split, "fused")
    np.savez(tmp_path / "in.npz", **feed)
    assert main(["run", str(split), "--device", "cpu", "--inputs", str(tmp_path / "in.npz"),
                 "--output", str(tmp_path / "out.npz"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "fused" and doc["read_bytes"] == doc["live_bytes"]
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out[out.files[0]], expected[0])
    (tmp_path / "bad.npz").write_bytes(b"nope")
    assert main(["run", str(split), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "cannot read the inputs" in capsys.readouterr().err


@pytest.fixture(scope="module")
def file_constant_build(tmp_path_factory):
    from .helpers import file_constant_package
    from .samples import make_encoder

    folder = tmp_path_factory.mktemp("file-constant")
    onnx.save(make_encoder(), str(folder / "encoder.onnx"))
    return file_constant_package(folder, folder / "encoder.onnx")


@pytest.mark.parametrize("layout", ["ge", "ge-separate"])
def test_file_constant_packages_load_exactly_their_live_payloads(file_constant_build, layout):
    """GE's form runs in onnxruntime too: each FileConstant node becomes the Constant it
    stands for, its payload read from the manifest's range (in subgraphs as well), and
    the outputs are those of the runnable model (weights inline), bit for bit."""
    package = file_constant_build / layout
    model = onnx.load(str(package / "encoder.onnx"), load_external_data=False)
    nodes = [n for s in [model.graph, *[a.g for n in model.graph.node for a in n.attribute
                                         if a.type == onnx.AttributeProto.GRAPH]]
             for n in s.node]
    assert sum(n.op_type == "FileConstant" for n in nodes) >= 3
    assert any(n.op_type == "FileConstant" for n in nodes[len(model.graph.node):])  # an If
    with weightstore.resolve(package) as r:
        assert all(e.dtype for e in r.payload_manifest.active)  # types from the node
        reader = RecordingReader()
        report = LoadReport()
        session = weightstore.load(r, reader=reader, manager=WeightManager(), report=report)
        assert _union(_intervals(reader.reads)) == _manifest_intervals(r, package)
        assert report.read_bytes == report.live_bytes == r.payload_manifest.active_bytes
    source = onnx.load(str(file_constant_build.parents[2] / "encoder.onnx"))
    feed = sample_inputs(source)
    for a, b in zip(session.run(None, feed), run_onnxruntime(source, feed), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("attribute", "change"), [
    ("length", lambda a: setattr(a, "i", a.i - 4)),
    ("offset", lambda a: setattr(a, "i", -1)),
    ("dtype", lambda a: setattr(a, "i", 0)),  # no ONNX element type
    ("dtype", lambda a: setattr(a, "i", onnx.TensorProto.STRING)),
    ("shape", lambda a: a.ints.extend([-1])),
])
def test_a_file_constant_whose_range_does_not_fit_its_type_is_refused(file_constant_build,
                                                                      tmp_path, attribute,
                                                                      change):
    shutil.copytree(file_constant_build / "ge-separate", tmp_path / "p")
    path = tmp_path / "p" / "encoder.onnx"
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "FileConstant")
    change(next(a for a in node.attribute if a.name == attribute))
    path.write_bytes(model.SerializeToString())
    relist(path.parent, path.name)  # an edit the package's summary agrees with
    with pytest.raises(weightstore.WeightstoreError, match="no eligible payload") as info:
        weightstore.resolve(path)
    assert info.value.context["initializer"] == node.output[0]


def test_another_tools_file_constant_is_refused_at_load_naming_it(tmp_path):
    """A GE-made node (GE's domain, a file_id) is not in the manifest: onnxruntime would
    refuse the model, so the load says what to do instead."""
    from onnx import helper

    model, _ = pm.gemm_model()
    node = helper.make_node("FileConstant", [], ["ge_value"], name="ge_const", domain="ge",
                            file_id="w1", dtype=onnx.TensorProto.FLOAT, shape=[2])
    model.graph.node.insert(0, node)
    model.graph.output.append(helper.make_tensor_value_info("ge_value",
                                                            onnx.TensorProto.FLOAT, [2]))
    model.opset_import.append(helper.make_opsetid("ge", 1))
    onnx.save(model, str(tmp_path / "in.onnx"))
    with (weightstore.resolve(tmp_path / "in.onnx") as r,
          pytest.raises(LoadError, match="convert to-inline") as info):
        weightstore.load(r, manager=WeightManager())
    assert info.value.context["node"] == "ge_const"


def test_prepare_says_why_a_file_constant_package_has_nothing_to_prepare(file_constant_build):
    with pytest.raises(weightstore.WeightstoreError, match="FileConstant weights"):
        weightstore.prepare(file_constant_build / "ge",
                            store=file_constant_build.parents[2] / "store")


def _function_model(domain: str, clash: bool) -> tuple[onnx.ModelProto, dict]:
    """A main graph calling a model-local function ``Lin`` of ``domain`` whose Constant is
    named ``w``; with ``clash``, the main graph's own initializer ``w`` holds other values."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    opset = [helper.make_opsetid("", 18)]
    inner = rng.standard_normal((4, 4)).astype(np.float32)
    lin = helper.make_function(domain, "Lin", ["a"], ["b"], [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(inner, "")),
        helper.make_node("MatMul", ["a", "w"], ["b"])], opset)
    nodes = [helper.make_node("Lin", ["x"], ["h" if clash else "y"], domain=domain)]
    inits = []
    if clash:
        nodes.append(helper.make_node("MatMul", ["h", "w"], ["y"]))
        inits.append(numpy_helper.from_array(
            rng.standard_normal((4, 4)).astype(np.float32), "w"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, functions=[lin], opset_imports=[
        *opset, helper.make_opsetid(domain, 1)], ir_version=8)
    return model, {"x": rng.standard_normal((1, 4)).astype(np.float32)}


@pytest.mark.parametrize("form", ["external-data", "file-constant"])
@pytest.mark.parametrize(("domain", "clash"), [("local", True), ("weightstore", False)])
def test_a_functions_names_are_its_own(tmp_path, form, domain, clash):
    """A function's Constant ``w`` and the main graph's initializer ``w`` are two values:
    each gets its own manifest entry and its own bytes (they used to share one). A
    function in our own domain keeps its opset import when its FileConstant is lowered."""
    from weightstore.convert.api import convert_to_external

    model, feed = _function_model(domain, clash)
    onnx.save(model, str(tmp_path / "in.onnx"))
    convert_to_external(tmp_path / "in.onnx", tmp_path / "out.onnx", form=form, threshold=16)
    expected = run_onnxruntime(model, feed)
    with weightstore.resolve(tmp_path / "out.onnx") as r:
        values = sorted(v for e in r.payload_manifest.active for v in e.values)
        session = weightstore.load(r, manager=WeightManager())
    assert values == ([f"{domain}:Lin/w", "w"] if clash else ["w"])
    for a, b in zip(session.run(None, feed), expected, strict=True):
        np.testing.assert_array_equal(a, b)
    replayed = runnable_variant(tmp_path / "in.onnx", None)  # inline source: base values
    for a, b in zip(run_onnxruntime(replayed, feed), expected, strict=True):
        np.testing.assert_array_equal(a, b)


def _sibling_model(kind: str) -> tuple[onnx.ModelProto, list[dict]]:
    """Sibling scopes reusing a weight's name, as exporters may: ``if``, both branches of
    an If define initializer ``W`` (1.0 and 100.0); ``loops``, two Loop bodies each hold
    their own ``L``; ``shadow``, a branch's initializer ``W`` shadows the main graph's."""
    from onnx import helper, numpy_helper

    n = 64
    f32 = onnx.TensorProto.FLOAT

    def info(name, elem=f32, shape=(n,)):
        return helper.make_tensor_value_info(name, elem, list(shape))

    def branch(name, value, op="Add"):
        w = numpy_helper.from_array(np.full(n, value, np.float32), "W")
        return helper.make_graph([helper.make_node(op, ["x", "W"], ["o"])], name, [],
                                 [info("o")], [w])

    opset = [helper.make_opsetid("", 18)]
    if kind == "if":
        graph = helper.make_graph([helper.make_node(
            "If", ["cond"], ["y"], then_branch=branch("then", 1.0),
            else_branch=branch("else", 100.0))], "g",
            [info("x"), info("cond", onnx.TensorProto.BOOL, ())], [info("y")])
        feeds = [{"x": np.arange(n, dtype=np.float32), "cond": np.array(c)}
                 for c in (True, False)]
    elif kind == "shadow":
        graph = helper.make_graph([
            helper.make_node("Mul", ["x", "W"], ["h"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", 3.0, "Sub"),
                             else_branch=branch("else", 5.0))],
            "g", [info("x"), info("cond", onnx.TensorProto.BOOL, ())], [info("y"), info("h")],
            [numpy_helper.from_array(np.full(n, 2.0, np.float32), "W")])
        feeds = [{"x": np.arange(n, dtype=np.float32), "cond": np.array(c)}
                 for c in (True, False)]
    else:
        def body(value):
            return helper.make_graph(
                [helper.make_node("Identity", ["c"], ["c_out"]),
                 helper.make_node("Mul", ["v", "L"], ["v_out"])], "body",
                [info("i", onnx.TensorProto.INT64, ()), info("c", onnx.TensorProto.BOOL, ()),
                 info("v")], [info("c_out", onnx.TensorProto.BOOL, ()), info("v_out")],
                [numpy_helper.from_array(np.full(n, value, np.float32), "L")])
        graph = helper.make_graph([
            helper.make_node("Loop", ["trips", "", "x"], ["a"], body=body(2.0)),
            helper.make_node("Loop", ["trips", "", "a"], ["y"], body=body(3.0))],
            "g", [info("x"), info("trips", onnx.TensorProto.INT64, ())], [info("y")])
        feeds = [{"x": np.arange(n, dtype=np.float32), "trips": np.array(2, np.int64)}]
    return helper.make_model(graph, opset_imports=opset, ir_version=8), feeds


@pytest.mark.parametrize("form", ["external-data", "file-constant"])
@pytest.mark.parametrize("kind", ["if", "loops", "shadow"])
def test_sibling_scopes_reusing_a_weight_name_load_their_own_bytes(tmp_path, form, kind):
    """Each definition of a name that several scopes use is its own manifest entry (keyed
    by its scope chain outside the main graph): both branches used to get one payload,
    and a shadowing initializer in the file-constant form became a second Constant
    output of the main graph's name, which onnxruntime refuses."""
    from weightstore.convert.api import convert_to_external

    model, feeds = _sibling_model(kind)
    onnx.save(model, str(tmp_path / "in.onnx"))
    convert_to_external(tmp_path / "in.onnx", tmp_path / "out.onnx", form=form, threshold=16)
    with weightstore.resolve(tmp_path / "out.onnx") as r:
        values = [v for e in r.payload_manifest.active for v in e.values]
        session = weightstore.load(r, manager=WeightManager())
    assert len(values) == len(set(values)) == (2 if kind != "shadow" else 3)
    for feed in feeds:
        for a, b in zip(session.run(None, feed), run_onnxruntime(model, feed), strict=True):
            np.testing.assert_array_equal(a, b)


def _module_function_model() -> tuple[onnx.ModelProto, dict]:
    """As torch exports with ``export_modules_as_functions``: each call of the local
    function ``Linear`` carries its layer's weight as an unnamed tensor attribute (the
    body computes with the weight passed in as an initializer); two calls, two weights."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(11)
    n = 64
    opset = [helper.make_opsetid("", 17)]
    linear = helper.make_function("torch_modules", "Linear", ["a", "w"], ["b"], [
        helper.make_node("MatMul", ["a", "w"], ["b"])], opset, attributes=["weight"])
    calls, inits = [], []
    for i, (src, dst) in enumerate([("x", "h"), ("h", "y")]):
        weight = rng.standard_normal((n, n)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"onnx::MatMul_{i}"))
        call = helper.make_node("Linear", [src, f"onnx::MatMul_{i}"], [dst],
                                name=f"/layer{i}/Linear", domain="torch_modules")
        attr = call.attribute.add()
        attr.name, attr.type = "weight", onnx.AttributeProto.TENSOR
        attr.t.CopyFrom(numpy_helper.from_array(weight.T.copy()))  # bytes of its own
        attr.t.ClearField("name")  # as the exporter leaves it
        calls.append(call)
    graph = helper.make_graph(calls, "g", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [2, n])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [2, n])], inits)
    model = helper.make_model(graph, functions=[linear], opset_imports=[
        *opset, helper.make_opsetid("torch_modules", 1)], ir_version=8)
    onnx.checker.check_model(model)
    return model, {"x": rng.standard_normal((2, n)).astype(np.float32)}


def test_weights_held_by_call_attributes_resolve_load_and_replay(tmp_path, capsys):
    """Unnamed attribute tensors are told apart (each its own manifest entry and bytes),
    from the model file and from a package, through a scenario replay too; nothing of
    the names resolution gives them reaches a file written for the user."""
    from weightstore.scenarios.operations import add_scenario

    model, feed = _module_function_model()
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    expected = run_onnxruntime(model, feed)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}}}]\n"
                      "layouts: [{name: c, external_weight: combined, size_threshold: 1024}]\n"
                      "output: out\n")
    weightstore.build(recipe, weightstore.BuildOptions(store=str(tmp_path / "s"), jobs=1))
    for where in (src, tmp_path / "out/p/1/c"):
        with weightstore.resolve(where) as r:
            entries = r.payload_manifest.active
            assert len(entries) == 4, where  # two initializers, two attribute tensors
            assert len({e.source.checksum or (e.source.file, e.source.offset)
                        for e in entries}) == 4, where
            session = weightstore.load(r, manager=WeightManager())
        for a, b in zip(session.run(None, feed), expected, strict=True):
            np.testing.assert_array_equal(a, b)
    add_scenario(src, "same", ["cleanup"], output=tmp_path / "s.onnx")
    replayed = tmp_path / "replayed.onnx"
    assert main(["scenario", "replay", str(tmp_path / "s.onnx"), "same",
                 "--output", str(replayed)]) == 0
    written = onnx.load(str(replayed))
    assert [n.attribute[0].t for n in written.graph.node] == \
        [n.attribute[0].t for n in model.graph.node]  # unnamed, as they were
    for a, b in zip(run_onnxruntime(written, feed), expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_only_attribute_tensors_resolution_must_find_are_named(tmp_path):
    """A small attribute value (a ConstantOfShape fill) is metadata: it stays unnamed, so
    the resolved graph, its digest and a prepared companion are as before. An attribute
    tensor that keeps a name of its own is not looked up by it: a namesake initializer
    stays the one a scenario's weights come from."""
    from onnx import helper, numpy_helper

    from weightstore.catalogue.sites import ATTRIBUTE_NAME_PREFIX

    model, feed = _module_function_model()
    fill = helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                            value=numpy_helper.from_array(np.ones(1, np.float32)))
    fill.attribute[0].t.ClearField("name")
    model.graph.initializer.append(numpy_helper.from_array(np.array([2, 64], np.int64),
                                                           "shape"))
    model.graph.node.extend([fill, helper.make_node("Add", ["y", "ones"], ["z"])])
    model.graph.output[0].name = "z"
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    with weightstore.resolve(src) as r:
        assert ATTRIBUTE_NAME_PREFIX.encode() in r.model_bytes  # the calls' weights
        frozen = onnx.load_from_string(r.model_bytes)
        assert not frozen.graph.node[2].attribute[0].t.HasField("name")  # the fill
        session = weightstore.load(r, manager=WeightManager())
    for a, b in zip(session.run(None, feed), run_onnxruntime(model, feed), strict=True):
        np.testing.assert_array_equal(a, b)
    # the first call's weight named like the second layer's initializer
    model.graph.node[0].attribute[0].t.name = "onnx::MatMul_1"
    onnx.save(model, str(src))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}, "
                      "scenarios: [{name: half, passes: [cast-fp16]}]}]\n"
                      "layouts: [{name: c, external_weight: combined}]\noutput: out\n")
    weightstore.build(recipe, weightstore.BuildOptions(store=str(tmp_path / "s"), jobs=1))
    replayed = runnable_variant(tmp_path / "out/p/1/c/m.onnx", "half")
    for a, b in zip(run_onnxruntime(replayed, feed), run_onnxruntime(model, feed),
                    strict=True):  # the attribute tensor's own name is a name, no more
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)
