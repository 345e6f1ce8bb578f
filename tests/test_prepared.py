"""Kernel requirements, prepared keys, ``weightstore prepare`` and prepared loading."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import weightstore
from tests import passes_models as pm
from tests import resolve_models as rm
from weightstore.cli import main
from weightstore.errors import IntegrityError, PackageError, ResolutionError
from weightstore.load import LoadReport, RecordingReader, WeightManager, plan_reads
from weightstore.load.executor import execute
from weightstore.load.prepare import prepare
from weightstore.resolve.binding import COSTLIER, PERSISTED, PORTABLE, prepared_key
from weightstore.resolve.kernels import CpuKernels, select_kernels
from weightstore.resolve.packing_probe import packing_reused
from weightstore.resolve.prepared import IN_ORDER, PreparedOptions
from weightstore.resolve.prepared_record import sign_record
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import WeightStore

from .samples import run_onnxruntime, sample_inputs


@pytest.fixture
def prepared(split_build, tmp_path):
    """A copy of the split package and its store, prepared for the ``cpu`` device."""
    package = tmp_path / "split"
    store = tmp_path / "store"
    shutil.copytree(split_build / "out" / "pk" / "1" / "split", package)
    shutil.copytree(split_build / "store", store)
    assert main(["prepare", str(package), "--device", "cpu", "--store", str(store)]) == 0
    return package, store


IN_ORDER_OPTIONS = PreparedOptions(prefer=IN_ORDER)  # persisted forms even where costlier


def _outputs_match(resolved, session, package):
    full = runnable_variant(package / "encoder.onnx", resolved.selected_scenario)
    feed = sample_inputs(full)
    for a, b in zip(session.run(None, feed), run_onnxruntime(full, feed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_cpu_catalogue_follows_onnxruntime_prepacking():
    model, _ = pm.gemm_model()
    conv, _ = pm.conv_bn_model()
    _, reqs = select_kernels(pm.metadata_copy(model), "cpu", CpuKernels())
    by = {(r.value, r.kernel, r.form) for r in reqs}
    assert ("l2.weight", "Gemm", (("transB", "1"),)) in by
    assert ("l3.weight", "Gemm", (("transB", "0"),)) in by
    shared = next(r for r in reqs if r.value == "l2.weight")
    assert shared.consumers == ("l2a", "l2b")  # identical requests deduplicated
    _, conv_reqs = select_kernels(pm.metadata_copy(conv), "cpu", CpuKernels())
    assert {r.value for r in conv_reqs} == {"c1.weight", "c2.weight", "c3.weight"}


def test_two_packed_forms_of_one_weight_are_two_requirements():
    w = pm._init("w", [16, 16])
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["a"], transB=1, name="g1"),
         helper.make_node("Gemm", ["a", "w"], ["y"], transB=0, name="g0")], "g",
        [pm._vi("x", TensorProto.FLOAT, [2, 16])], [pm._vi("y", TensorProto.FLOAT, [2, 16])],
        initializer=[w])
    _, reqs = select_kernels(pm._model(graph), "cpu", CpuKernels())
    assert sorted(dict(r.form)["transB"] for r in reqs) == ["0", "1"]
    keys = {prepared_key(r, ("blake3:00",), PreparedOptions()).digest for r in reqs}
    assert len(keys) == 2


def test_prepared_key_binds_every_part():
    model, _ = pm.gemm_model()
    _, reqs = select_kernels(pm.metadata_copy(model), "cpu", CpuKernels())
    key = prepared_key(reqs[0], ("blake3:aa",), PreparedOptions(runtime="onnxruntime 1"))
    for field, other in (("lineage", ("blake3:bb",)), ("runtime", "onnxruntime 2"),
                         ("cpu_features", ("x86_64",)), ("device", "npu"),
                         ("provider", "OtherEP"), ("packed_format", "v2"), ("dims", (1, 1)),
                         ("dtype", TensorProto.FLOAT16), ("optimization_level", "basic"),
                         ("form", (("kernel", "MatMul"),))):
        assert dataclasses.replace(key, **{field: other}).digest != key.digest


def test_prepare_records_packed_weights_by_key_in_the_store(prepared):
    package, store = prepared
    record = json.loads((package / "prepared" / "cpu" / "encoder.json").read_text())
    assert record["format_version"] == 2 and record["runtime"].startswith("onnxruntime")
    assert record["objects"]
    ws = WeightStore(store)
    for obj in record["objects"]:
        assert set(obj["key"]) >= {"lineage", "runtime", "cpu_features", "packed_format",
                                   "dims", "dtype", "optimization_level", "provider"}
        assert obj["identity"].startswith(obj["kernel"] + "+")
        assert ws.lookup(obj["store_key"]).size == obj["length"]
    # portable weights are referenced by digest, not copied into the companion
    companion = onnx.load(str(package / "prepared" / "cpu" / "encoder.onnx"),
                          load_external_data=False)
    assert all(e.key != "location" or e.value.startswith("weightstore-value:")
               for t in companion.graph.initializer for e in t.external_data)


def test_a_prepared_package_still_verifies(prepared, capsys):
    """``weightstore verify`` checks the prepared companion graph against the digest its
    record lists, instead of calling the files ``prepare`` adds unlisted."""
    package, _ = prepared
    companion = package / "prepared" / "cpu" / "encoder.onnx"
    record = json.loads(companion.with_suffix(".json").read_text())
    assert record["companion"]["file"] == "encoder.onnx"
    assert record["companion"]["size"] == companion.stat().st_size
    capsys.readouterr()
    assert main(["verify", str(package), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    data = bytearray(companion.read_bytes())
    data[-1] ^= 1
    companion.write_bytes(bytes(data))
    (package / "prepared" / "cpu" / "stray.bin").write_bytes(b"x")
    assert main(["verify", str(package), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [(p["kind"], p["path"]) for p in problems] == [
        ("digest", "prepared/cpu/encoder.onnx"), ("unexpected", "prepared/cpu/stray.bin")]
    companion.unlink()
    assert main(["verify", str(package), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert ("missing", "prepared/cpu/encoder.onnx") in [(p["kind"], p["path"])
                                                         for p in problems]


def test_a_changed_companion_graph_is_never_run(prepared, capsys):
    """The companion graph is what onnxruntime runs: resolution checks it against the
    digest its record lists, and a changed one fails naming it (never a wrong session)."""
    package, store = prepared
    companion = package / "prepared" / "cpu" / "encoder.onnx"
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.prepared_graph is not None  # this resolution uses the companion
    graph = onnx.load(str(companion), load_external_data=False)
    graph.graph.node[0].name += "-edited"
    companion.write_bytes(graph.SerializeToString())
    with pytest.raises(IntegrityError) as err:
        weightstore.resolve(package, device="cpu", store=store)
    assert err.value.context["file"] == str(companion)
    assert main(["resolve", str(package), "--device", "cpu", "--store", str(store)]) == 2
    assert "prepare" in capsys.readouterr().err


def test_package_documents_nested_too_deep_are_one_line_errors(prepared, capsys):
    """summary.json, a device's bundle.json or a prepared record nested past the JSON
    parser's depth is malformed input like any other: one line, exit 2, no traceback."""
    package, store = prepared
    deep = "[" * 100_000 + "]" * 100_000
    commands = [["resolve", str(package), "--device", "cpu", "--store", str(store)],
                ["check", str(package), "--device", "cpu"], ["verify", str(package)],
                ["bundle", str(package), "cpu", "--output", str(package.parent / "b")],
                ["diff", str(package), str(package)]]
    for name in ("summary.json", "devices/cpu/bundle.json", "prepared/cpu/encoder.json"):
        path = package / name
        kept = path.read_bytes()
        path.write_text(deep)
        for argv in commands:
            code = main(argv)
            err = capsys.readouterr().err
            assert "Traceback" not in err and "RecursionError" not in err, (name, argv)
            assert code in (0, 1, 2) and (code != 2 or err.count("\n") == 1), (name, argv)
        path.write_bytes(kept)
    path.write_text("[]")  # a record that is not an object
    assert main(commands[0]) == 2 and "prepared record" in capsys.readouterr().err


def test_store_gc_keeps_what_prepare_stored(encoder_model, save_model, tmp_path):
    """The packed blobs are rooted by the package they were prepared for, so a gc keeps
    them while that package lives: its root gains them, or a root is made for it."""
    from .test_build import write_recipe

    recipe = write_recipe(tmp_path, {"encoder": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    store = tmp_path / "store"
    assert main(["build", str(recipe), "--store", str(store)]) == 0
    built = tmp_path / "out" / "pkg" / "1.0.0" / "c"
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)  # a package folder this store has no root for
    for package in (built, copy):
        assert main(["prepare", str(package), "--store", str(store)]) == 0
    record = json.loads((built / "prepared" / "default" / "encoder.json").read_text())
    stored = {o["store_key"] for o in record["objects"]}
    ws = WeightStore(store)
    assert stored and not stored & {o.key for o in ws.plan_gc().garbage}
    assert len(ws.roots()) == 2 and all(r.live for r in ws.roots())
    shutil.rmtree(copy)  # its root dies; the built package's root still names the blobs
    assert not stored & {o.key for o in ws.plan_gc().garbage}


def test_compatible_packed_entry_is_bound_and_loads(prepared):
    package, store = prepared
    with weightstore.resolve(package, device="cpu", store=store,
                             prepared=IN_ORDER_OPTIONS) as r:
        assert r.prepared_graph is not None
        assert all(b.selected == PERSISTED for b in r.bindings)
        packed = [e for e in r.payload_manifest.active if e.origin == "prepared"]
        assert len(packed) == len(r.bindings)
        reader = RecordingReader()
        report = LoadReport()
        session = weightstore.load(r, reader=reader, report=report, manager=WeightManager())
        assert report.read_bytes == r.payload_manifest.active_bytes == reader.bytes_read
        assert not report.fell_back
        _outputs_match(r, session, package)


def test_compatible_packed_entry_skips_all_portable_sources_in_its_lineage(prepared):
    """For a runtime that consumes packed objects alone, the portable sources of a bound
    packed entry are dormant fallbacks: the read plan holds none of their ranges."""
    package, store = prepared

    class PackedOnly(CpuKernels):
        keeps_source = False

    with weightstore.resolve(package, device="cpu", store=store,
                             prepared=IN_ORDER_OPTIONS) as normal:
        assert normal.payload_manifest.dormant == ()  # onnxruntime reads sources anyway
    with weightstore.resolve(package, device="cpu", store=store, prepared=IN_ORDER_OPTIONS,
                             phases=_phases_with(PackedOnly())) as r:
        m = r.payload_manifest
        packed = {e.id for e in m.active if e.origin == "prepared"}
        dormant = m.dormant
        assert dormant and all(d.fallback_for in packed for d in dormant)
        lineage = {v for d in dormant for v in d.values}
        reader = RecordingReader()
        plan = plan_reads(m.active, package, r.source.path, store=r.source.store)
        execute(plan, {e.id: e for e in m.entries}, reader)
        for d in dormant:
            s = d.source
            assert all(not (p.name == s.file and o < s.offset + s.length and s.offset < o + n)
                       for p, o, n in reader.reads)
        assert lineage == {b.value for b in r.bindings}


def _phases_with(kernels):
    from weightstore.resolve.phases import DEFAULT_PHASES, Placement

    class WithKernels(Placement):
        def run(self, state):
            state.kernels = kernels
            return super().run(state)

    return [WithKernels() if p is Placement else p() for p in DEFAULT_PHASES]


@pytest.mark.parametrize("options", [PreparedOptions(runtime="onnxruntime 0.1"),
                                     PreparedOptions(cpu_features=("other-isa",))],
                         ids=["other-runtime", "other-isa"])
def test_incompatible_packed_entry_selects_the_portable_recipe(prepared, options):
    package, store = prepared
    with weightstore.resolve(package, device="cpu", store=store, prepared=options) as r:
        assert r.prepared_graph is None
        assert all(b.selected == PORTABLE for b in r.bindings)
        assert all(("persisted", "no compatible persisted payload") in b.rejected
                   for b in r.bindings)
        assert not [e for e in r.payload_manifest.entries if e.origin == "prepared"]
        _outputs_match(r, weightstore.load(r, manager=WeightManager()), package)


def test_missing_trusted_digest_makes_the_cache_entry_unverified(tmp_path):
    model, _ = pm.gemm_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.data",
              size_threshold=0)  # onnx writes no checksum
    with weightstore.resolve(path) as r:
        assert r.bindings and all(b.selected == PORTABLE and b.key is None
                                  for b in r.bindings)
        assert all("unverifiable" in b.rejected[0][1] for b in r.bindings)


def test_corrupt_packed_payload_activates_the_portable_fallback(prepared):
    package, store = prepared
    with weightstore.resolve(package, device="cpu", store=store,
                             prepared=IN_ORDER_OPTIONS) as r:
        victim = next(e for e in r.payload_manifest.active if e.origin == "prepared")
        ws = WeightStore(store)
        obj = ws.lookup(victim.source.store_key)
        with open(ws.path_of(obj), "r+b") as f:
            f.seek(obj.offset)
            f.write(b"\xff" * 16)
        report = LoadReport()
        session = weightstore.load(r, report=report, manager=WeightManager())
        assert report.fell_back == {victim.id: "portable"}
        _outputs_match(r, session, package)  # a correct session, never a wrong one


def test_prepare_refuses_what_it_cannot_prepare(prepared, tmp_path, capsys):
    package, store = prepared
    path = rm.save_package_model(rm.not_if_model(), tmp_path / "m")
    with pytest.raises(PackageError, match="not a package folder"):
        prepare(path.parent, store=store)
    assert main(["prepare", str(package), "--device", "nope", "--store", str(store)]) == 2
    assert "no such device" in capsys.readouterr().err


def test_resident_prepared_object_comes_first(prepared):
    package, store = prepared
    with weightstore.resolve(package, device="cpu", store=store,
                             prepared=IN_ORDER_OPTIONS) as r:
        persisted = {b.key.digest: b.active for b in r.bindings}
    options = PreparedOptions(resident=persisted)
    with weightstore.resolve(package, device="cpu", store=store, prepared=options) as r:
        assert {b.selected for b in r.bindings} == {"resident"}
        assert all(not b.rejected for b in r.bindings)
        _outputs_match(r, weightstore.load(r, manager=WeightManager()), package)


def _record_says(package, reused):
    path = package / "prepared" / "cpu" / "encoder.json"
    doc = json.loads(path.read_text())
    doc["packing_reused"] = reused
    path.write_text(json.dumps(sign_record("cpu", "encoder", doc)))  # as prepare signs it


def test_prepare_records_whether_the_runtime_reuses_packed_weights(prepared):
    package, _ = prepared
    record = json.loads((package / "prepared" / "cpu" / "encoder.json").read_text())
    assert record["packing_reused"] is packing_reused()
    assert isinstance(record["packing_reused"], bool)  # this onnxruntime persists packings


def test_probe_sees_the_runtime_pack_sources_again():
    """onnxruntime packs every source weight at session creation even when a persisted
    packed form is supplied (``SessionState::PrepackConstantInitializedTensors`` calls
    ``PrePack`` first and only then looks the packed bytes' hash up among the blobs read
    from disk; 1.32 also compares them). Up to 1.31 it then computes with the persisted
    blob, so a probe that changed the blob would see its bytes used and call the packing
    reused; the probe changes the source and keeps the blob, which tells them apart on
    every version: the installed one, whichever it is, is seen packing again."""
    import onnxruntime as ort

    major, minor = (int(x) for x in ort.__version__.split(".")[:2])
    if (major, minor) > (1, 32):
        pytest.skip(f"onnxruntime {ort.__version__} is newer than the versions checked")
    assert packing_reused() is False


def test_runtime_that_packs_again_gets_portable_weights_and_the_optimized_graph(prepared):
    """Where onnxruntime packs every source again to check a persisted form, the packed
    payloads are not read: the bindings are portable, and the session is created from the
    companion's optimized graph with the portable weights alone."""
    package, store = prepared
    _record_says(package, False)
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.bindings and all(b.selected == PORTABLE and (PERSISTED, COSTLIER) in b.rejected
                                  for b in r.bindings)
        assert not [e for e in r.payload_manifest.entries if e.origin == "prepared"]
        companion = onnx.load_from_string(r.prepared_graph)
        assert not [e for t in companion.graph.initializer for e in t.external_data
                    if e.key.startswith("prepacked")]
        assert any(n.domain == "com.microsoft" for n in companion.graph.node)  # optimized
        reader, report = RecordingReader(), LoadReport()
        session = weightstore.load(r, reader=reader, report=report, manager=WeightManager())
        assert reader.bytes_read == report.read_bytes == r.payload_manifest.active_bytes
        _outputs_match(r, session, package)


def test_runtime_that_reuses_packed_weights_gets_the_persisted_payloads(prepared):
    package, store = prepared
    _record_says(package, True)
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.bindings and all(b.selected == PERSISTED for b in r.bindings)
    _record_says(package, None)  # a record that predates the probe: in the seed's order
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.bindings and all(b.selected == PERSISTED for b in r.bindings)


def test_unknown_prepared_preference_is_an_error():
    with pytest.raises(ResolutionError, match="unknown prepared preference"):
        PreparedOptions(prefer="fastest")


WIDE_GELU_RECIPE = """\
package: wide
version: "1"
store: {{path: {store}}}
models: [{{name: encoder, source: {src}}}]
layouts: [{{name: release, external_weight: combined, alignment: 4096}}]
devices: [{{name: cpu, capabilities: {{device: cpu}}, scenario: null}}]
output: {out}
"""


def test_corrupt_runtime_made_value_gives_up_the_companion(tmp_path):
    """A value onnxruntime created for the companion graph (here the GELU function's
    channel scale, inlined and folded) that fails its checksum makes the load use the
    resolved graph and its portable weights: a correct session."""
    from weightstore.builder.run import BuildOptions, build

    from .samples import make_encoder

    src = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(ffn=1040), str(src))  # a channel scale above the small limit
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(WIDE_GELU_RECIPE.format(store=tmp_path / "store", src=src,
                                              out=tmp_path / "out"))
    build(recipe, BuildOptions(jobs=2))
    package, store = tmp_path / "out" / "wide" / "1" / "release", tmp_path / "store"
    assert main(["prepare", str(package), "--device", "cpu", "--store", str(store)]) == 0
    path = package / "prepared" / "cpu" / "encoder.json"
    doc = json.loads(path.read_text())
    doc["packing_reused"] = False  # whatever the installed runtime does
    path.write_text(json.dumps(doc))
    with weightstore.resolve(package, device="cpu", store=store) as r:
        made = [e for e in r.payload_manifest.active if e.origin == "runtime"]
        assert made and r.prepared_graph is not None
        ws = WeightStore(store)
        obj = ws.lookup(made[0].source.store_key)
        with open(ws.path_of(obj), "r+b") as f:
            f.seek(obj.offset)
            head = f.read(4)
            f.seek(obj.offset)
            f.write(bytes(b ^ 0xFF for b in head))
        report = LoadReport()
        session = weightstore.load(r, report=report, manager=WeightManager())
        assert report.fell_back == {made[0].id: "portable"}
        full = runnable_variant(package / "encoder.onnx", None)
        feed = sample_inputs(full)
        for a, b in zip(session.run(None, feed), run_onnxruntime(full, feed), strict=True):
            np.testing.assert_array_equal(a, b)


def _tamper_companion(package):
    """Edit the companion graph as an attacker who can write the folder would (+5.0 on
    every inline initializer, or a node's output renamed into another), then write its new
    size and digest into the record so that the two agree."""
    companion = package / "prepared" / "cpu" / "encoder.onnx"
    graph = onnx.load(str(companion), load_external_data=False)
    edited = 0
    for t in graph.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and t.data_type == TensorProto.FLOAT:
            value = onnx.numpy_helper.to_array(t) + np.float32(5.0)
            t.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), t.name))
            edited += 1
    assert edited
    data = graph.SerializeToString()
    companion.write_bytes(data)
    path = companion.with_suffix(".json")
    doc = json.loads(path.read_text())
    doc["companion"]["size"] = len(data)
    doc["companion"]["digest"] = "blake3:" + __import__("blake3").blake3(data).hexdigest()
    path.write_text(json.dumps(doc))
    return path


def _run_outputs(package, store, tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    if not inputs.exists():
        full = runnable_variant(package / "encoder.onnx", None)
        np.savez(inputs, **sample_inputs(full))
    out = tmp_path / "out.npz"
    capsys.readouterr()
    assert main(["run", str(package), "--device", "cpu", "--store", str(store),
                 "--inputs", str(inputs), "--output", str(out)]) == 0
    with np.load(out) as z:
        return {k: z[k] for k in z.files}, capsys.readouterr().err


def test_a_tampered_prepared_record_is_never_used(prepared, tmp_path, capsys):
    """A prepared record carries a MAC under the user's key: a companion graph edited
    with its record's size and digest fixed to match is unproven, so run falls back to
    the portable weights (one stderr line) and computes the source's outputs, and verify
    names the record as unproven in its text and --json."""
    package, store = prepared
    before, err = _run_outputs(package, store, tmp_path, capsys)
    assert "prepared" not in err
    assert main(["verify", str(package), "--json"]) == 0
    assert [p["proven"] for p in json.loads(capsys.readouterr().out)["prepared"]] == [
        "signed"]
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.prepared_graph is not None  # the proven record is used
    record = _tamper_companion(package)
    after, err = _run_outputs(package, store, tmp_path, capsys)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "prepared record" in lines[0] and str(record) in lines[0]
    assert main(["verify", str(package), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prepared"] == [{"record": "prepared/cpu/encoder.json",
                                   "companion": "prepared/cpu/encoder.onnx",
                                   "proven": None, "detail": report["prepared"][0]["detail"]}]
    assert "MAC" in report["prepared"][0]["detail"]
    assert main(["verify", str(package)]) == 0
    assert "unproven: prepared/cpu/encoder.json" in capsys.readouterr().out


def test_unsigned_and_foreign_prepared_records_are_unproven(prepared, capsys):
    """A record of format 1 (no MAC) and one signed under another user's key are not
    used (the source graph and portable weights are), each with one stderr line saying
    why, and verify reports both as unproven."""
    from weightstore.store.mac import key_path

    package, store = prepared
    path = package / "prepared" / "cpu" / "encoder.json"
    signed = json.loads(path.read_text())
    doc = {k: v for k, v in signed.items() if k != "mac"}
    cases = [({**doc, "format_version": 1}, "format_version 1"),
             ({**doc, "mac": "0" * 64}, "MAC does not hold")]
    for record, why in cases:
        path.write_text(json.dumps(record))
        capsys.readouterr()
        with weightstore.resolve(package, device="cpu", store=store) as r:
            assert r.prepared_graph is None
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0] and str(path) in err[0]
        assert main(["verify", str(package), "--json"]) == 0
        (entry,) = json.loads(capsys.readouterr().out)["prepared"]
        assert entry["proven"] is None and why in entry["detail"]
    from weightstore.store import mac

    own = key_path().read_bytes()
    key_path().write_bytes(bytes(32))  # another user's key (the file stays 0600)
    mac._key.cache_clear()
    path.write_text(json.dumps(sign_record("cpu", "encoder", doc)))
    assert "mac" in json.loads(path.read_text())
    key_path().write_bytes(own)
    mac._key.cache_clear()
    with weightstore.resolve(package, device="cpu", store=store) as r:
        assert r.prepared_graph is None
    assert "MAC does not hold" in capsys.readouterr().err
