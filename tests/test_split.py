"""Scenario-split packages, device bundles and post-replay validation."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import ExternalDataError, PackageError, PathEscapeError, ScenarioError
from weightstore.packaging.bundles import assemble, satisfies
from weightstore.packaging.check import check_package, variant_of
from weightstore.resolve.files import file_problems
from weightstore.resolve.runnable import runnable_variant
from weightstore.resolve.source import store_keys_of
from weightstore.resolve.variant import variant_graph
from weightstore.scenarios.resolve import live_payloads

from . import resolve_models as rm
from .helpers import relist, relocated_away
from .samples import make_encoder, run_onnxruntime, sample_inputs
from .test_build import tree

RECIPE = """\
package: pk
version: "1"
store: {{path: {store}}}
models:
  - name: encoder
    source: {src}
    scenarios:
      - {{name: fused, passes: [fuse-qkv, cleanup], requires: {{cpu: true}}}}
      - {{name: half, passes: [cast-fp16, cleanup], requires: {{accelerator: [npu, gpu]}}}}
      - {{name: both, passes: [fuse-qkv, cast-fp16, cleanup]}}
layouts:
  - {{name: split, external_weight: combined, split: scenario, alignment: 4096}}
  - {{name: split-sep, external_weight: separate, split: scenario}}
devices:
  - {{name: npu, capabilities: {{accelerator: npu}}, scenario: auto}}
  - {{name: cpu, capabilities: {{cpu: true}}, scenario: auto}}
  - {{name: plain, scenario: null}}
  - {{name: anything, scenario: auto}}
  - {{name: pinned, scenario: both}}
output: {out}
"""


def _write(folder, model):
    src = folder / "encoder.onnx"
    onnx.save(model, str(src))
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(store=folder / "store", src=src, out=folder / "out"))
    return recipe


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    model = make_encoder()
    recipe = _write(folder, model)
    result = build(recipe, BuildOptions(jobs=2))
    return folder, model, recipe, {p.layout: p for p in result.packages}


def _keys(package) -> dict[tuple[str, int], str]:
    """The summary's store key of every (location, offset) of the package's model: the
    external data names the range only."""
    return store_keys_of(package.summary["models"][0])


def _locations(model: onnx.ModelProto, keys: dict[tuple[str, int], str]) -> dict[str, str]:
    """store key -> location of every external tensor, base and scenario-added."""
    from weightstore.catalogue.sites import iter_tensor_sites
    from weightstore.scenarios.storage import read_scenarios

    out = {}
    tensors = [s.tensor for s in iter_tensor_sites(model)]
    tensors += [t for s in read_scenarios(model) for r in s.rewrites
                for t in r.added_initializers]
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        if "location" in info:
            out[keys[(info["location"], int(info["offset"]))]] = info["location"]
    return out


def test_file_membership_is_reconstructible_from_external_data(package):
    _, _, _, packages = package
    path = packages["split"].path
    model = onnx.load(str(path / "encoder.onnx"), load_external_data=False)
    keys = _keys(packages["split"])
    users: dict[str, set[str]] = {}
    for name in (None, "fused", "half", "both"):
        for p in live_payloads(variant_graph(model, name), name):
            users.setdefault(keys[(p.location, p.offset)], set()).add(name or "default")
    where = _locations(model, keys)
    for key, location in where.items():
        u = users.get(key, {"default"})
        expected = next(iter(u)) if len(u) == 1 else "common"
        assert location == f"pk.{expected}.data", (key, u)
    # each payload once in the package, at aligned offsets
    summary = packages["split"].summary
    ids = [(w["location"], w["id"]) for w in summary["models"][0]["external_weights"]]
    assert len({i for _, i in ids}) == len(set(ids))
    assert all(w["offset"] % 4096 == 0 for w in summary["models"][0]["external_weights"])
    assert {f["name"] for f in summary["files"]} == {
        "pk.common.data", "pk.default.data", "pk.fused.data", "pk.half.data", "pk.both.data"}


def test_group_rules(package):
    _, _, _, packages = package
    model = onnx.load(str(packages["split"].path / "encoder.onnx"), load_external_data=False)
    names = {p.name: p.location for p in live_payloads(variant_graph(model, None))}
    # the Q/K/V weights are fused (or cast) by every scenario: only the default graph
    assert names["encoder.layer.0.attention.self.query.weight"] == "pk.default.data"
    fused = {p.name: p.location for p in live_payloads(variant_graph(model, "fused"), "fused")}
    both = {p.name: p.location for p in live_payloads(variant_graph(model, "both"), "both")}
    # the fused fp32 weight is used by one scenario only
    fused_name = next(n for n in fused if n.endswith(".fused_qkv"))
    assert fused[fused_name] == "pk.fused.data"
    # a payload live in the default graph and in a scenario is shared: common
    keys = _keys(packages["split"])
    default_keys = {keys[(p.location, p.offset)]: p.location
                    for p in live_payloads(variant_graph(model, None))}
    fused_keys = {keys[(p.location, p.offset)]
                  for p in live_payloads(variant_graph(model, "fused"), "fused")}
    shared = set(default_keys) & fused_keys
    assert shared and {default_keys[k] for k in shared} == {"pk.common.data"}
    assert both  # the third scenario resolves too


def test_scenario_weights_shared_by_two_scenarios_go_to_common(package):
    _, _, _, packages = package
    model = onnx.load(str(packages["split"].path / "encoder.onnx"), load_external_data=False)
    keys = _keys(packages["split"])
    half = {keys[(p.location, p.offset)]: p
            for p in live_payloads(variant_graph(model, "half"), "half")}
    both = {keys[(p.location, p.offset)]: p
            for p in live_payloads(variant_graph(model, "both"), "both")}
    default = {keys[(p.location, p.offset)] for p in live_payloads(variant_graph(model, None))}
    two_scenarios = (set(half) & set(both)) - default
    assert two_scenarios  # fp16 copies of weights both cast scenarios keep
    assert all(half[k].location == "pk.common.data" for k in two_scenarios)


@pytest.mark.parametrize("layout", ["split", "split-sep"])
def test_bundles_run_like_the_replayed_model(package, tmp_path, layout):
    _, model, _, packages = package
    path = packages[layout].path
    inputs = sample_inputs(model, seed=9)
    expected = {s: run_onnxruntime(runnable_variant(path / "encoder.onnx", s), inputs)
                for s in (None, "fused", "half", "both")}
    # auto: the first scenario whose requirements hold; "both" requires nothing
    chosen = {"npu": "half", "cpu": "fused", "plain": None, "anything": "both",
              "pinned": "both"}
    for device, scenario in chosen.items():
        record = json.loads((path / "devices" / device / "bundle.json").read_text())
        assert record["models"][0]["scenario"] == scenario
        out = tmp_path / layout / device
        assemble(path, device, out)
        assert sorted(p.name for p in out.iterdir()) == sorted(
            {"encoder.onnx", "bundle.json",
             *(f["name"].split("/")[0] for f in record["files"])})
        # the device folder's own record: the package's, its live weights (and their
        # keys) at their places in the folder's own weight files
        own = json.loads((out / "bundle.json").read_text())
        assert relocated_away(own) == relocated_away(record)
        assert {f["name"] for f in own["files"]} == {f["name"] for f in record["files"]}
        assert all(f["size"] == (out / f["name"]).stat().st_size for f in own["files"])
        assert record["format_version"] == 2 and record["models"][0]["external_weights"]
        actual = run_onnxruntime(out / "encoder.onnx", inputs)
        for e, a in zip(expected[scenario], actual, strict=True):
            assert e.tobytes() == a.tobytes(), (device, scenario)


def test_missing_default_file_only_matters_to_the_default_graph(package, tmp_path):
    _, model, _, packages = package
    path = tmp_path / "copy"
    shutil.copytree(packages["split"].path, path)
    os.remove(path / "pk.default.data")
    assert check_package(path, scenario="half").ok
    assert check_package(path, device="cpu").ok
    report = check_package(path)
    assert not report.ok
    assert all("scenario=(default)" in p and "location=pk.default.data" in p
               for p in report.problems)
    assemble(path, "npu", tmp_path / "npu")
    inputs = sample_inputs(model, seed=1)
    for e, a in zip(run_onnxruntime(model, inputs),
                    run_onnxruntime(tmp_path / "npu" / "encoder.onnx", inputs), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-2, atol=1e-3)
    with pytest.raises(PackageError, match="missing"):
        assemble(path, "plain", tmp_path / "plain")


def test_missing_scenario_file_fails_only_that_scenario(package, tmp_path):
    _, _, _, packages = package
    path = tmp_path / "copy"
    shutil.copytree(packages["split"].path, path)
    os.remove(path / "pk.fused.data")
    assert check_package(path).ok and check_package(path, scenario="half").ok
    report = check_package(path, scenario="fused")
    assert not report.ok
    assert all("scenario=fused" in p and "location=pk.fused.data" in p and "initializer=" in p
               for p in report.problems)
    live = variant_of(path / "encoder.onnx", "fused").external
    with pytest.raises(ExternalDataError) as err:
        file_problems(path, live, "fused", verify=False, strict=True)
    assert err.value.context["scenario"] == "fused"
    assert err.value.context["location"] == "pk.fused.data"


def test_truncated_file_and_corrupt_bytes(package, tmp_path):
    _, _, _, packages = package
    path = tmp_path / "copy"
    shutil.copytree(packages["split"].path, path)
    half = path / "pk.half.data"
    data = bytearray(half.read_bytes())
    data[5000] ^= 0xFF
    half.write_bytes(bytes(data))
    assert check_package(path, scenario="half").ok  # sizes and ranges are fine
    assert not check_package(path, scenario="half", verify=True).ok
    half.write_bytes(bytes(data[:1000]))
    report = check_package(path, scenario="half")
    assert report.problems and "outside its file" in report.problems[0]


def test_unknown_scenario_and_device(package, capsys):
    _, _, _, packages = package
    path = packages["split"].path
    with pytest.raises(ScenarioError, match="unknown scenario"):
        check_package(path, scenario="nope")
    assert main(["check", str(path), "--device", "nope"]) == 2
    assert "no such device" in capsys.readouterr().err
    assert main(["check", str(path), "--scenario", "half"]) == 0
    assert main(["bundle", str(path), "nope", "--output", "/nonexistent/x"]) == 2


def test_split_packages_are_deterministic(package, tmp_path):
    folder, _, recipe, _ = package
    before = tree(folder / "out")
    again = build(recipe, BuildOptions(store=str(tmp_path / "cold"), jobs=1, force=True))
    assert all(p.status == "built" for p in again.packages)
    assert tree(folder / "out") == before


def test_capability_rules():
    assert satisfies({"accelerator": "npu", "mem": 8}, {"accelerator": "npu"})
    assert not satisfies({"accelerator": "gpu"}, {"accelerator": "npu"})
    assert satisfies({"abi": ["v1", "v2"]}, {"abi": "v2"})
    assert not satisfies({}, {"cpu": True})
    assert satisfies({"x": [1, 2]}, {"x": [1, 2]})
    assert satisfies({"accelerator": "gpu"}, {"accelerator": ["npu", "gpu"]})
    assert not satisfies({"accelerator": "cpu"}, {"accelerator": ["npu", "gpu"]})


def test_two_models_share_a_file_group(shared_pair, save_model, tmp_path):
    recipe = _two_models(tmp_path, shared_pair, save_model, b_scenarios=True)
    summary = build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=2)).packages[0].summary
    stored = {(w["location"], w["id"]) for m in summary["models"] for w in m["external_weights"]}
    ids = [i for _, i in stored]
    assert len(ids) == len(set(ids))  # a payload shared by both models is stored once
    assert summary["totals"]["dedup_saved_bytes"] > 0


def test_auto_without_a_match_runs_the_default_graph():
    from weightstore.packaging.bundles import select_scenario
    from weightstore.recipe.schema import Device

    offered = [("half", {"accelerator": "npu"}), ("fused", {"kernels": ["fa"]})]
    assert select_scenario(Device(name="d", capabilities={"cpu": True}, scenario="auto"),
                           offered) is None
    assert select_scenario(Device(name="d", capabilities={"kernels": ["x", "fa"]},
                                  scenario="auto"), offered) == "fused"
    assert satisfies({"abi": ["v1", "v2"]}, {"abi": ["v2", "v3"]})  # lists: any overlap


def _two_models(tmp_path, shared_pair, save_model, *, b_scenarios=False):
    """A package of two models sharing weights; only ``a`` has scenario "fused" unless
    ``b_scenarios``; a device pinned to "fused"."""
    a, b = shared_pair
    pa, pb = save_model(a, "a.onnx"), save_model(b, "b.onnx")
    fused = ", scenarios: [{name: fused, passes: [fuse-qkv, cleanup]}]"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""\
package: two
version: "1"
models:
  - {{name: a, source: {pa}{fused}}}
  - {{name: b, source: {pb}{fused if b_scenarios else ""}}}
layouts:
  - {{name: s, external_weight: combined, split: scenario}}
devices:
  - {{name: d, scenario: fused}}
output: {tmp_path / 'out'}
""")
    return recipe


def test_a_model_without_the_scenario_runs_its_default_in_that_variant(
        shared_pair, save_model, tmp_path):
    recipe = _two_models(tmp_path, shared_pair, save_model)
    package = build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=2)).packages[0]
    b = onnx.load(str(package.path / "b.onnx"), load_external_data=False)
    # b's weights are live in the default variant and (as b's default) in "fused"
    assert {p.location for p in live_payloads(variant_graph(b, None))} <= {"two.common.data"}
    os.remove(package.path / "two.default.data")
    assert check_package(package.path, scenario="fused").ok
    assemble(package.path, "d", tmp_path / "bundle")


def test_scenario_names_from_sources_are_checked(encoder_model, save_model, tmp_path, capsys):
    from weightstore._proto import weightstore_pb2 as pb
    from weightstore.scenarios.storage import read_scenarios, write_scenarios

    src = save_model(encoder_model, "m.onnx")
    assert main(["scenario", "add", str(src), "default", "--passes", "cleanup"]) == 2
    assert "not usable" in capsys.readouterr().err
    assert main(["scenario", "add", str(src), "ok", "--passes", "fuse-qkv"]) == 0
    model = onnx.load(str(src))
    (record,) = read_scenarios(model)
    evil = pb.ModelModificationScenarioProto()
    evil.CopyFrom(record)
    evil.scenario = "../../evil"
    write_scenarios(model, [evil])
    onnx.save(model, str(src))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}}}]\n"
                      "layouts: [{name: s, external_weight: combined, split: scenario}]\n"
                      f"output: {tmp_path / 'out'}\n")
    assert main(["build", str(recipe), "--store", str(tmp_path / "st")]) == 2
    assert "not usable" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*evil*"))


def test_hostile_bundle_records_are_refused(package, tmp_path):
    _, _, _, packages = package
    path = tmp_path / "copy"
    shutil.copytree(packages["split"].path, path)
    record_path = path / "devices" / "npu" / "bundle.json"
    record = json.loads(record_path.read_text())
    record["files"].append({"name": "../secret.txt", "size": 1})
    record_path.write_text(json.dumps(record))
    with pytest.raises(PathEscapeError):
        assemble(path, "npu", tmp_path / "out")
    record_path.write_text(json.dumps({"format_version": 1}))
    with pytest.raises(PackageError, match="malformed"):
        assemble(path, "npu", tmp_path / "out2")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_devices_can_run_scenarios_the_source_holds(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "m.onnx")
    assert main(["scenario", "add", str(src), "held", "--passes", "fuse-qkv,cleanup"]) == 0
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""\
package: p
version: "1"
models:
  - {{name: m, source: {src}, scenarios: [{{name: half, passes: [cast-fp16],
      requires: {{accelerator: npu}}}}]}}
layouts: [{{name: s, external_weight: combined, split: scenario}}]
devices:
  - {{name: pinned, scenario: held}}
  - {{name: npu, capabilities: {{accelerator: npu}}, scenario: auto}}
  - {{name: other, capabilities: {{cpu: true}}, scenario: auto}}
output: {tmp_path / 'out'}
""")
    package = build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=2)).packages[0]
    chosen = {d["name"]: d["scenario"] for d in package.summary["devices"]}
    # recipe scenarios are offered first; "held" requires nothing, so it matches "other"
    assert chosen == {"pinned": "held", "npu": "half", "other": "held"}
    bad = recipe.read_text().replace("scenario: held}", "scenario: nope}")
    recipe.write_text(bad)
    with pytest.raises(Exception, match="no model defines or holds"):
        build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=2, force=True))


def test_deleted_device_folder_is_not_up_to_date(package):
    _, _, recipe, packages = package
    path = packages["split"].path
    saved = path.parent / "devices-saved"
    shutil.move(str(path / "devices"), saved)
    try:
        with pytest.raises(PackageError, match="damaged"):
            build(recipe, BuildOptions(jobs=1))
    finally:
        shutil.move(str(saved), path / "devices")
    # the module's build signed its action records under another test's key: the store
    # cannot prove the folders under this one, so a build rebuilds them once
    build(recipe, BuildOptions(jobs=1))
    assert all(p.status == "up-to-date" for p in build(recipe, BuildOptions(jobs=1)).packages)


def test_file_constant_packages_list_and_check_their_files(encoder_model, save_model,
                                                           tmp_path):
    src = save_model(encoder_model, "m.onnx")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}}}]\n"
                      "layouts: [{name: g, external_weight: combined, "
                      "constants: file-constant}]\n"
                      f"devices: [{{name: d}}]\noutput: {tmp_path / 'out'}\n")
    package = build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=1)).packages[0]
    record = json.loads((package.path / "devices/d/bundle.json").read_text())
    assert [f["name"] for f in record["files"]] == ["m_weight_combined"]
    os.remove(package.path / "m_weight_combined")
    report = check_package(package.path)
    assert not report.ok and "model=m.onnx" in report.problems[0]


@pytest.mark.parametrize("build_model", [rm.shape_if_model, rm.not_if_model],
                         ids=["equal-gather-shape", "not-constant"])
def test_dead_if_branch_weights_are_not_required(build_model, tmp_path):
    """check and bundle resolve like a load: an If whose condition is known from metadata
    keeps only its live branch, so the dead branch's weight file may go missing."""
    model = build_model()
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}}}]\n"
                      "layouts: [{name: s, external_weight: separate}]\n"
                      f"devices: [{{name: d}}]\noutput: {tmp_path / 'out'}\n")
    package = build(recipe, BuildOptions(store=str(tmp_path / "st"), jobs=1)).packages[0]
    where = {w["name"]: w["location"] for w in package.summary["models"][0]["external_weights"]}
    record = json.loads((package.path / "devices/d/bundle.json").read_text())
    assert where["w_then"] in {f["name"] for f in record["files"]}
    assert where["w_else"] not in {f["name"] for f in record["files"]}
    os.remove(package.path / where["w_else"])
    report = check_package(package.path, verify=True)
    assert report.ok, report.problems
    assert where["w_else"] not in report.models[0]["files"]
    assemble(package.path, "d", tmp_path / "bundle")
    inputs = {"x": sample_inputs(model, seed=3)["x"]}
    for e, a in zip(run_onnxruntime(model, inputs),
                    run_onnxruntime(tmp_path / "bundle" / "m.onnx", inputs), strict=True):
        assert e.tobytes() == a.tobytes()
    os.remove(package.path / where["w_then"])  # the live branch's file still matters
    report = check_package(package.path)
    assert not report.ok and "initializer=w_then" in report.problems[0]


def test_check_needs_exactly_what_a_load_resolves(package):
    """One liveness: check's payloads for each variant are the load's manifest entries."""
    import weightstore

    _, _, _, packages = package
    path = packages["split"].path
    for scenario in (None, "fused", "half", "both"):
        report = check_package(path, scenario=scenario)
        checked = {(e.source.file, e.source.offset, e.source.length)
                   for e in variant_of(path / "encoder.onnx", scenario).external}
        with weightstore.resolve(path, scenario=scenario) as r:
            loaded = {(e.source.file, e.source.offset, e.source.length)
                      for e in r.payload_manifest.active if e.source.file}
        assert checked == loaded, scenario
        assert report.models[0]["files"] == sorted({f for f, _, _ in loaded})


def test_a_live_weight_without_an_eligible_payload_is_a_problem(package, tmp_path):
    _, _, _, packages = package
    path = tmp_path / "copy"
    shutil.copytree(packages["split"].path, path)
    model = onnx.load(str(path / "encoder.onnx"), load_external_data=False)
    victim = next(t for t in model.graph.initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL)
    for e in victim.external_data:
        if e.key == "length":
            e.value = str(int(e.value) + 4)
    onnx.save(model, str(path / "encoder.onnx"))
    relist(path, "encoder.onnx")  # an edit the package's summary agrees with
    report = check_package(path)
    assert not report.ok
    assert report.problems == [
        f"live weight has no eligible payload (scenario=(default), initializer={victim.name}, "
        f"location={next(e.value for e in victim.external_data if e.key == 'location')}, "
        "model=encoder.onnx)"]
