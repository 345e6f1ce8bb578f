"""Recipes with scenarios: records stored in packaged models, added weights stored like any."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.io.digests import digest_bytes
from weightstore.resolve.runnable import runnable_variant
from weightstore.scenarios.api import replay_modification_scenario, scenario_names
from weightstore.store import WeightStore

from .helpers import store_index
from .samples import run_onnxruntime, sample_inputs
from .test_build import tree, write_recipe

LAYOUTS = """
  - {name: embedded, external_weight: embedded}
  - {name: separate, external_weight: separate, size_threshold: 1024}
  - {name: combined, external_weight: combined, size_threshold: 1024}
  - {name: tight, external_weight: combined, size_threshold: 0, alignment: 64}
"""
SCENARIOS = ("    scenarios:\n"
             "      - {name: fused, passes: [fuse-qkv, cleanup]}\n"
             "      - {name: half, passes: [cast-fp16, cleanup]}\n")
COMBINED = "\n  - {name: combined, external_weight: combined, size_threshold: 1024}\n"


def scenario_recipe(folder, src, layouts):
    """A recipe of the encoder at ``src`` with both scenarios, in ``folder``."""
    recipe = write_recipe(folder, {"encoder": src}, layouts)
    recipe.write_text(recipe.read_text().replace(
        f"  - {{name: encoder, source: {src}}}\n",
        f"  - name: encoder\n    source: {src}\n" + SCENARIOS))
    return recipe


def derived_objects(store, summary):
    """The store objects of the weights the scenarios derive, by the package summary."""
    ids = {w["id"] for w in summary["models"][0]["external_weights"] if "scenario" in w}
    return [o for k, o in store_index(store).items() if k in ids]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from .samples import make_encoder

    folder = tmp_path_factory.mktemp("scen")
    model = make_encoder()
    src = folder / "encoder.onnx"
    onnx.save(model, str(src))
    recipe = scenario_recipe(folder, src, LAYOUTS)
    store = folder / "store"
    result = build(recipe, BuildOptions(store=str(store), jobs=2))
    return folder, model, result, recipe, store


def test_packages_carry_scenarios(built):
    _, _, result, _, _ = built
    for package in result.packages:
        model = onnx.load(str(package.path / "encoder.onnx"), load_external_data=False)
        assert scenario_names(model) == ["fused", "half"]
        assert package.summary["models"][0]["scenarios"] == ["fused", "half"]
        for name in ("fused", "half"):
            replayed = replay_modification_scenario(model, name)  # metadata only
            assert len(replayed.graph.node) != len(model.graph.node) or name == "half"


@pytest.mark.parametrize("layout", ["embedded", "separate", "combined"])
def test_every_scenario_runs_from_the_package(built, layout):
    _, model, result, _, _ = built
    package = next(p for p in result.packages if p.layout == layout)
    inputs = sample_inputs(model, seed=4)
    expected = run_onnxruntime(model, inputs)
    base = run_onnxruntime(package.path / "encoder.onnx", inputs)
    assert all(e.tobytes() == a.tobytes() for e, a in zip(expected, base, strict=True))
    for name, rtol in (("fused", 1e-5), ("half", 1e-2)):
        variant = runnable_variant(package.path / "encoder.onnx", name)
        actual = run_onnxruntime(variant, inputs)
        for e, a in zip(expected, actual, strict=True):
            np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * 1e-1)


def test_added_weights_are_stored_and_placed(built):
    _, _, result, _, store = built
    index = store_index(WeightStore(store))
    package = next(p for p in result.packages if p.layout == "combined")
    added = [w for w in package.summary["models"][0]["external_weights"] if "scenario" in w]
    assert {w["scenario"] for w in added} == {"fused", "half"}
    for w in added:
        assert w["id"] in index
        data = (package.path / w["location"]).read_bytes()[w["offset"]:w["offset"] + w["size"]]
        algo, hexdigest = w["id"].split(":")
        assert digest_bytes(algo, data) == hexdigest
        assert w["offset"] % 512 == 0
    model = onnx.load(str(package.path / "encoder.onnx"), load_external_data=False)
    from weightstore.scenarios.storage import read_scenarios

    fused = next(s for s in read_scenarios(model) if s.scenario == "fused")
    tensors = [t for r in fused.rewrites for t in r.added_initializers]
    big = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    assert big and all({e.key for e in t.external_data} ==
                       {"location", "offset", "length"} for t in big)


def test_rebuild_is_identical_and_up_to_date(built, tmp_path):
    folder, _, _, recipe, store = built
    before = tree(folder / "out")
    # the module's build signed its action records under another test's key: the store
    # cannot prove the folders under this one, so they are rebuilt, to the same bytes
    build(recipe, BuildOptions(store=str(store), jobs=2))
    assert tree(folder / "out") == before
    again = build(recipe, BuildOptions(store=str(store), jobs=2))
    assert all(p.status == "up-to-date" for p in again.packages)
    rebuilt = build(recipe, BuildOptions(store=str(tmp_path / "cold"), jobs=1, force=True))
    assert all(p.status == "built" for p in rebuilt.packages)
    assert tree(folder / "out") == before


def test_changing_scenarios_changes_the_fingerprint(built):
    _, _, result, recipe, store = built
    text = recipe.read_text()
    recipe.write_text(text.replace("[cast-fp16, cleanup]", "[cast-fp16]"))
    try:
        from weightstore.errors import PackageError

        with pytest.raises(PackageError, match="different build"):
            build(recipe, BuildOptions(store=str(store), jobs=1))
    finally:
        recipe.write_text(text)
    summary = json.loads((result.packages[0].path / "summary.json").read_text())
    assert summary["fingerprint"] == result.packages[0].summary["fingerprint"]


def _recipe(folder, src, scenarios: str, layouts: str = "  - {name: c, external_weight: "
            "combined, size_threshold: 0}\n", devices: str = "") -> object:
    path = folder / "r.yaml"
    path.write_text(f"package: p\nversion: '1'\nstore: {{path: {folder / 'store'}}}\n"
                    f"models:\n  - name: m\n    source: {src}\n{scenarios}"
                    f"layouts:\n{layouts}{devices}output: {folder / 'out'}\n")
    return path


def test_source_scenarios_are_verified_rebased_and_kept(encoder_model, save_model, tmp_path,
                                                        capsys):
    from weightstore.cli import main

    src = save_model(encoder_model, "m.onnx")
    assert main(["scenario", "add", str(src), "fused", "--passes", "fuse-qkv,cleanup"]) == 0
    recipe = _recipe(tmp_path, src, "    scenarios:\n      - {name: half, passes: "
                                    "[cast-fp16, cleanup]}\n")
    package = build(recipe, BuildOptions(jobs=2)).packages[0]
    model = onnx.load(str(package.path / "m.onnx"), load_external_data=False)
    assert scenario_names(model) == ["fused", "half"]
    inputs = sample_inputs(encoder_model, seed=5)
    expected = run_onnxruntime(encoder_model, inputs)
    for name in ("fused", "half"):
        actual = run_onnxruntime(runnable_variant(package.path / "m.onnx", name), inputs)
        for e, a in zip(expected, actual, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-2, atol=1e-3)
    clash = _recipe(tmp_path, src, "    scenarios:\n      - {name: fused, passes: [cleanup]}\n")
    assert main(["build", str(clash), "--force"]) == 2
    assert "already holds a scenario" in capsys.readouterr().err


def test_dead_added_weights_are_not_packaged(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "m.onnx")
    recipe = _recipe(tmp_path, src, "    scenarios:\n      - {name: both, passes: "
                                    "[fuse-qkv, cast-fp16, cleanup]}\n")
    summary = build(recipe, BuildOptions(jobs=2)).packages[0].summary
    added = [w for w in summary["models"][0]["external_weights"] if "scenario" in w]
    assert added and all(w["dtype"] == "FLOAT16" or not w["name"].endswith(".fused_qkv")
                         for w in added)
    assert not any(w["name"].endswith(".fused_qkv") and w["dtype"] == "FLOAT" for w in added)


def test_moved_constants_are_packaged_and_run(tmp_path, save_model):
    """fold-constant-if moves a branch's weights into the parent graph: a device model,
    replayed from metadata, loads them from the package files."""
    from weightstore.packaging.bundles import assemble

    from .samples import make_encoder

    model = make_encoder()
    # the pooler switch becomes a Constant, so the If folds
    for node in model.graph.node:
        if node.op_type == "If":
            cond = node.input[0]
    model.graph.input.remove(next(i for i in model.graph.input if i.name == cond))
    model.graph.node.insert(0, onnx.helper.make_node(
        "Constant", [], [cond], value=onnx.numpy_helper.from_array(np.array(True))))
    src = save_model(model, "m.onnx")
    recipe = _recipe(tmp_path, src, "    scenarios:\n      - {name: folded, passes: "
                                    "[fold-constant-if, cleanup]}\n",
                     devices="devices:\n  - {name: d, scenario: folded}\n")
    package = build(recipe, BuildOptions(jobs=2)).packages[0]
    added = [w for w in package.summary["models"][0]["external_weights"] if "scenario" in w]
    assert added  # the moved branch weights are stored, not left without bytes
    assemble(package.path, "d", tmp_path / "bundle")
    inputs = sample_inputs(model, seed=3)
    inputs.pop(cond, None)
    expected = run_onnxruntime(model, inputs)
    actual = run_onnxruntime(tmp_path / "bundle" / "m.onnx", inputs)
    assert all(e.tobytes() == a.tobytes() for e, a in zip(expected, actual, strict=True))


def test_a_damaged_derived_weight_never_reaches_an_embedded_package(tmp_path, capsys):
    """An embedded layout keeps a scenario's derived weights inline, read from the store
    when another layout stored them: the read is checked against the key, and a damaged
    object is computed again from the source and rewritten, so every layout stays
    byte-identical to a build from a fresh store."""
    from .samples import make_encoder
    from .test_store import flip_byte

    src = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(), str(src))
    layouts = "\n  - {name: embedded, external_weight: embedded}" + COMBINED
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        build(scenario_recipe(tmp_path / folder, src, layouts),
              BuildOptions(store=str(tmp_path / folder / "store"), jobs=2))
    recipe, root = tmp_path / "a" / "recipe.yaml", tmp_path / "a" / "store"
    package = tmp_path / "a" / "out" / "pkg" / "1.0.0" / "combined"
    store = WeightStore(root)
    victims = derived_objects(store, json.loads((package / "summary.json").read_text()))
    assert victims
    for obj in victims:
        flip_byte(store.path_of(obj), obj.offset + obj.size // 2)
    capsys.readouterr()
    build(recipe, BuildOptions(store=str(root), jobs=2, force=True))
    assert "was damaged; rewritten from scenario" in capsys.readouterr().err
    assert tree(tmp_path / "a" / "out") == tree(tmp_path / "b" / "out")
    assert store.verify().ok


def test_a_damaged_derived_weight_copied_into_a_package_is_healed(tmp_path, capsys):
    """Without an inline reader first, the package copy finds the damage: the weight is
    computed again from the source and its object rewritten."""
    from .samples import make_encoder
    from .test_store import flip_byte

    src = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(), str(src))
    recipe, root = scenario_recipe(tmp_path, src, COMBINED), tmp_path / "store"
    result = build(recipe, BuildOptions(store=str(root), jobs=2))
    before = tree(tmp_path / "out")
    store = WeightStore(root)
    obj = derived_objects(store, result.packages[0].summary)[0]
    flip_byte(store.path_of(obj), obj.offset)
    capsys.readouterr()
    build(recipe, BuildOptions(store=str(root), jobs=2, force=True))
    assert "was damaged; rewritten from scenario" in capsys.readouterr().err
    assert tree(tmp_path / "out") == before
    assert store.verify().ok


def test_derived_weights_heal_into_a_sibling_when_their_combined_file_is_no_file(
        tmp_path):
    """A FIFO in place of the combined file: source weights and derived ones are both
    written again into a sibling file; the packages are as before."""
    import os

    from .samples import make_encoder

    src = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(), str(src))
    recipe, root = scenario_recipe(tmp_path, src, COMBINED), tmp_path / "store"
    build(recipe, BuildOptions(store=str(root), jobs=2))
    before = tree(tmp_path / "out")
    combined = root / "encoder_weight_combined"
    combined.unlink()
    os.mkfifo(combined)
    build(recipe, BuildOptions(store=str(root), jobs=2, force=True))
    assert tree(tmp_path / "out") == before
    assert (root / "encoder.1_weight_combined").is_file()


def test_a_pass_that_finds_nothing_to_rewrite_is_reported(tmp_path, capsys):
    """quantize-weights on a conv net (no MatMul): the build says so on stderr, naming
    the model, the scenario and the pass, and builds. A pass that rewrote something is
    not reported, nor cleanup finding the graph clean."""
    from weightstore.cli import main

    from .passes_models import conv_bn_model

    src = tmp_path / "net.onnx"
    onnx.save(conv_bn_model()[0], str(src))
    recipe = write_recipe(tmp_path, {"net": src}, COMBINED)
    recipe.write_text(recipe.read_text().replace(
        f"  - {{name: net, source: {src}}}\n",
        f"  - name: net\n    source: {src}\n    scenarios:\n"
        "      - {name: q4, passes: [{name: quantize-weights, bits: 4}]}\n"
        "      - {name: half, passes: [cast-fp16, cleanup]}\n"
        "      - {name: folded, passes: [fold-batchnorm, quantize-weights, cleanup]}\n"))
    capsys.readouterr()
    assert main(["build", str(recipe), "-q"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "weightstore: warning: model 'net', scenario 'q4': quantize-weights found nothing "
        "to rewrite; the scenario is the base graph",
        "weightstore: warning: model 'net', scenario 'folded': quantize-weights found "
        "nothing to rewrite"]
    package = tmp_path / "out" / "pkg" / "1.0.0" / "combined"
    assert scenario_names(onnx.load(str(package / "net.onnx"), load_external_data=False)) \
        == ["q4", "half", "folded"]
