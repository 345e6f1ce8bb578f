"""Passes take parameters in the recipe: validated per pass, canonical, part of what a
scenario is (its digest, its stored record, the build's fingerprint)."""

from __future__ import annotations

import json

import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import RecipeError, ScenarioError
from weightstore.passes.registry import PASSES, get_pass
from weightstore.recipe.pass_params import PASS_PARAMS, PassParams
from weightstore.recipe.schema import parse_recipe_text, recipe_json_schema
from weightstore.scenarios.operations import list_scenarios

from .test_build import write_recipe

LAYOUT = "\n  - {name: c, external_weight: combined, size_threshold: 0}\n"


def _recipe_text(passes: str) -> str:
    return ("package: p\nversion: '1'\nmodels:\n  - name: m\n    source: m.onnx\n"
            "    scenarios:\n      - name: s\n        passes:\n" + passes +
            "layouts: [{name: e, external_weight: embedded}]\n")


def _passes(passes: str) -> list:
    recipe = parse_recipe_text(_recipe_text(passes), "r.yaml")
    return recipe.models[0].scenarios[0].canonical_passes()


def test_bare_names_and_mappings_are_one_canonical_form():
    bare = _passes("          - cast-fp16\n          - cleanup\n")
    mapped = _passes("          - {name: cast-fp16, min_elements: 1024}\n"
                     "          - {name: cleanup}\n")
    assert bare == mapped == [{"name": "cast-fp16", "min_elements": 1024}, "cleanup"]
    assert _passes("          - {name: cast-fp16, min_elements: 64}\n") == [
        {"name": "cast-fp16", "min_elements": 64}]


@pytest.mark.parametrize(("passes", "message", "key"), [
    ("          - {name: cast-fp16, min_element: 4}\n", "unknown key 'min_element'",
     "passes[0].min_element"),
    ("          - {name: cast-fp16, min_elements: -1}\n", "greater than or equal to 0, got -1",
     "passes[0].min_elements"),
    ("          - {name: cast-fp16, min_elements: '4'}\n", "valid integer, got '4'",
     "passes[0].min_elements"),
    ("          - {name: cleanup, level: 2}\n", "unknown key 'level'", "passes[0].level"),
    ("          - cleanup\n          - {name: cast-fp17}\n", "unknown pass", "passes[1].name"),
    ("          - cast-fp17\n", "got 'cast-fp17'", "passes[0]"),
    # onnxruntime's quantization kernels take blocks of 16 to 256 weights
    ("          - {name: quantize-weights, block_size: 512}\n",
     "less than or equal to 256, got 512", "passes[0].block_size"),
    ("          - {name: quantize-weights, block_size: 48}\n", "power of two",
     "passes[0].block_size"),
])
def test_a_bad_parameter_is_one_clear_line(passes, message, key):
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(_recipe_text(passes), "r.yaml")
    text = str(info.value)
    assert message in text and "\n" not in text
    assert info.value.context["key"] == f"models[0].scenarios[0].{key}"
    assert info.value.context["line"] == 9 + key.count("[1]")


def test_the_schema_lists_each_pass_and_its_parameters():
    schema = recipe_json_schema()
    text = json.dumps(schema)
    assert "min_elements" in text and '"cast-fp16"' in text
    entry = schema["$defs"]["CastFp16Pass"]
    assert entry["additionalProperties"] is False
    assert set(entry["properties"]) == {"name", "min_elements"}


def test_every_pass_takes_the_parameters_the_recipe_validates():
    assert list(PASSES) == list(PASS_PARAMS)
    for name, cls in PASSES.items():
        assert getattr(cls, "Params", PassParams) is PASS_PARAMS[name]
    assert get_pass("cast-fp16", {"min_elements": 8}).params.min_elements == 8
    with pytest.raises(ScenarioError, match="bad parameter of pass 'cast-fp16': unknown "
                                            "parameter") as info:
        get_pass("cast-fp16", {"bits": 4})
    assert info.value.context["parameter"] == "bits"
    with pytest.raises(ScenarioError, match="unknown pass"):
        get_pass("cast-fp17")


def _build(folder, passes: str, **options):
    recipe = write_recipe(folder, {"encoder": folder / "encoder.onnx"}, LAYOUT)
    recipe.write_text(recipe.read_text().replace(
        f"  - {{name: encoder, source: {folder / 'encoder.onnx'}}}\n",
        f"  - name: encoder\n    source: {folder / 'encoder.onnx'}\n"
        f"    scenarios:\n      - {{name: half, passes: {passes}}}\n"))
    result = build(recipe, BuildOptions(store=str(folder / "store"), jobs=1, **options))
    package = result.packages[0]
    (stored,) = list_scenarios(package.path / "encoder.onnx")
    return package, stored


def test_parameters_are_part_of_the_scenario(tmp_path, encoder_model):
    onnx.save(encoder_model, str(tmp_path / "encoder.onnx"))
    first, stored = _build(tmp_path, "[cast-fp16, cleanup]")
    assert first.status == "built"
    assert stored["passes"] == [{"name": "cast-fp16", "min_elements": 1024}, "cleanup"]
    # the same passes written out in full: the same build, up to date
    same, again = _build(tmp_path, "[{name: cast-fp16, min_elements: 1024}, {name: cleanup}]")
    assert same.status == "up-to-date" and again == stored
    # a parameter that casts the biases too: other records, another digest, rebuilt
    biases, other = _build(tmp_path, "[{name: cast-fp16, min_elements: 16}, cleanup]",
                           force=True)
    assert biases.status == "built"
    assert biases.summary["fingerprint"] != first.summary["fingerprint"]
    assert other["scenario_digest"] != stored["scenario_digest"]
    assert other["records"] > stored["records"]
    # a parameter that selects the same weights still makes another scenario
    alike, third = _build(tmp_path, "[{name: cast-fp16, min_elements: 2048}, cleanup]",
                          force=True)
    assert alike.status == "built" and third["records"] == stored["records"]
    assert third["scenario_digest"] != stored["scenario_digest"]
    assert third["passes"][0] == {"name": "cast-fp16", "min_elements": 2048}
    unchanged, _ = _build(tmp_path, "[{name: cast-fp16, min_elements: 2048}, cleanup]")
    assert unchanged.status == "up-to-date"


def test_a_bad_parameter_on_the_command_line_exits_2(tmp_path, encoder_model, capsys):
    onnx.save(encoder_model, str(tmp_path / "encoder.onnx"))
    recipe = write_recipe(tmp_path, {"encoder": tmp_path / "encoder.onnx"}, LAYOUT)
    recipe.write_text(recipe.read_text().replace(
        "source: " + str(tmp_path / "encoder.onnx") + "}",
        "source: " + str(tmp_path / "encoder.onnx") +
        ", scenarios: [{name: s, passes: [{name: cast-fp16, min_elements: x}]}]}"))
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "passes[0].min_elements" in err
    assert not (tmp_path / "out").exists()


def test_scenario_add_takes_parameters(tmp_path, encoder_model, capsys):
    m = tmp_path / "m.onnx"
    onnx.save(encoder_model, str(m))
    passes = json.dumps([{"name": "cast-fp16", "min_elements": 16}, "cleanup"])
    assert main(["scenario", "add", str(m), "half", "--passes", passes]) == 0
    assert "from cast-fp16, cleanup" in capsys.readouterr().out
    (stored,) = list_scenarios(m)
    assert stored["passes"] == [{"name": "cast-fp16", "min_elements": 16}, "cleanup"]
    before = m.read_bytes()
    bad = json.dumps([{"name": "cast-fp16", "min_elements": "16"}])
    assert main(["scenario", "add", str(m), "other", "--passes", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad parameter of pass 'cast-fp16'" in err
    assert main(["scenario", "add", str(m), "other", "--passes", "[oops"]) == 2
    assert "not a JSON list" in capsys.readouterr().err
    assert m.read_bytes() == before
