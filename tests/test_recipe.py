"""Recipe parsing, validation errors with file/line/key, path resolution, and the JSON Schema."""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from weightstore.errors import RecipeError
from weightstore.recipe.schema import (
    NAME_PATTERN,
    LoadedRecipe,
    Recipe,
    load_recipe,
    main,
    parse_recipe_text,
    recipe_json_schema,
    render_schema,
    write_schema,
)

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "recipe.schema.json"
EXAMPLE_RECIPES = sorted((SCHEMA_FILE.parents[1] / "recipes").glob("*.yaml"))

EXAMPLE = """\
package: tiny-bert
version: "1.0.0"
store: {path: .weightstore, hash: blake3}
models:
  - {name: encoder, source: ../examples/tiny_bert/model.onnx}
layouts:
  - {name: release, external_weight: combined, alignment: 512, size_threshold: 1024, constants: external-data}
output: dist
"""  # noqa: E501

MINIMAL = """\
package: p
version: "1"
models:
  - name: m
    source: m.onnx
layouts:
  - name: l
    external_weight: embedded
"""


def _dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _parse_error(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(text, "recipe.yaml")
    return info.value


# --- valid recipes ------------------------------------------------------------------------


def test_minimal_recipe_gets_defaults() -> None:
    recipe = parse_recipe_text(MINIMAL, "recipe.yaml")
    assert recipe.package == "p"
    assert recipe.version == "1"
    assert recipe.store.path is None
    assert recipe.store.hash == "blake3"
    assert recipe.output == "dist"
    assert recipe.devices == []
    assert recipe.models[0].scenarios == []
    layout = recipe.layouts[0]
    assert (layout.alignment, layout.size_threshold) == (512, 1024)
    assert (layout.constants, layout.split) == ("external-data", "none")


def test_documented_example_parses() -> None:
    recipe = parse_recipe_text(EXAMPLE, "recipe.yaml")
    assert recipe.store.path == ".weightstore"
    assert recipe.models[0].source == "../examples/tiny_bert/model.onnx"
    assert recipe.layouts[0].external_weight == "combined"


def test_example_recipes_are_found() -> None:
    assert len(EXAMPLE_RECIPES) >= 3


@pytest.mark.parametrize("path", EXAMPLE_RECIPES, ids=lambda p: p.name)
def test_example_recipe_is_valid(path: Path) -> None:
    """Every recipe under recipes/ validates and names model and companion files that
    exist."""
    loaded = load_recipe(path)
    for model in loaded.recipe.models:
        assert loaded.model_source(model).is_file(), model.source
    for entry in [*loaded.recipe.files, *(f for d in loaded.recipe.devices for f in d.files)]:
        if isinstance(entry.source, str):
            assert loaded.resolve(entry.source).exists(), entry.source


@pytest.mark.parametrize("version", ["1.0.0", "2024.1-rc1", "v2_beta", "0"])
def test_version_forms_accepted(version: str) -> None:
    text = MINIMAL.replace('version: "1"', f'version: "{version}"')
    assert parse_recipe_text(text, "recipe.yaml").version == version


def test_all_options_accepted() -> None:
    text = _dedent("""
        package: p
        version: "1"
        store: {hash: sha256}
        models:
          - {name: m, source: m.onnx}
        layouts:
          - name: l
            external_weight: separate
            alignment: 1
            size_threshold: 0
            constants: file-constant
            split: none
        output: build/out
        """)
    recipe = parse_recipe_text(text, "recipe.yaml")
    layout = recipe.layouts[0]
    assert (layout.external_weight, layout.alignment, layout.size_threshold) == ("separate", 1, 0)
    assert layout.constants == "file-constant"
    assert recipe.store.hash == "sha256"
    assert recipe.output == "build/out"


def test_anchors_and_merge_keys_are_not_duplicates() -> None:
    text = _dedent("""
        package: p
        version: "1"
        models:
          - {name: m, source: m.onnx}
        layouts:
          - &base {name: a, external_weight: combined, alignment: 4096}
          - <<: *base
            name: b
        """)
    recipe = parse_recipe_text(text, "recipe.yaml")
    assert [(x.name, x.alignment) for x in recipe.layouts] == [("a", 4096), ("b", 4096)]


def test_the_largest_alignment_is_one_mib() -> None:
    recipe = parse_recipe_text(MINIMAL + "    alignment: 1048576\n", "recipe.yaml")
    assert recipe.layouts[0].alignment == 1 << 20


def test_recipe_is_immutable() -> None:
    recipe = parse_recipe_text(MINIMAL, "recipe.yaml")
    with pytest.raises(ValidationError):
        recipe.package = "other"  # type: ignore[misc]


# --- paths --------------------------------------------------------------------------------


def test_relative_paths_resolve_against_recipe_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "recipes" / "r.yaml", EXAMPLE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    loaded = load_recipe(Path("..") / "recipes" / "r.yaml")

    assert isinstance(loaded, LoadedRecipe)
    assert loaded.path == tmp_path / "recipes" / "r.yaml"
    assert loaded.path.is_absolute()
    assert loaded.base_dir == tmp_path / "recipes"
    model = loaded.recipe.models[0]
    assert loaded.model_source(model) == tmp_path / "examples" / "tiny_bert" / "model.onnx"
    assert loaded.output_dir() == tmp_path / "recipes" / "dist"
    assert loaded.store_path() == tmp_path / "recipes" / ".weightstore"


def test_absolute_paths_are_kept_and_store_path_optional(tmp_path: Path) -> None:
    absolute = tmp_path / "models" / "m.onnx"
    text = MINIMAL.replace("source: m.onnx", f"source: '{absolute}'")
    loaded = load_recipe(_write(tmp_path / "r.yaml", text))
    assert loaded.model_source(loaded.recipe.models[0]) == absolute
    assert loaded.store_path() is None
    assert loaded.resolve(str(tmp_path / "x")) == tmp_path / "x"


def test_resolve_does_not_follow_a_model_symlink(tmp_path: Path) -> None:
    """A model symlinked into a cache keeps its own folder (external data lives beside it)."""
    blob = _write(tmp_path / "cache" / "blob", "x")
    (tmp_path / "model.onnx").symlink_to(blob)
    loaded = load_recipe(_write(tmp_path / "r.yaml", MINIMAL.replace("m.onnx", "model.onnx")))
    assert loaded.model_source(loaded.recipe.models[0]) == tmp_path / "model.onnx"


# --- file-level errors --------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(missing)
    assert info.value.context["file"] == str(missing)
    assert "not found" in info.value.message


def test_directory_is_not_a_recipe(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path)
    assert info.value.context["file"] == str(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"package: \xff\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.context["offset"] == 9


def test_errors_from_load_recipe_name_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.yaml", MINIMAL.replace("embedded", "inline"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.context == {
        "file": str(path), "line": 8, "key": "layouts[0].external_weight"}


# --- the bad-input table ------------------------------------------------------------------
# Each case: recipe text, expected context (line, key; None = must be absent), message fragment.

BAD: list[tuple[str, str, dict[str, Any], str]] = [
    ("yaml-syntax", """
        package: p
        models: [a, b
        layouts: []
        """, {"line": 3, "column": 8, "key": None}, "invalid YAML"),
    ("yaml-bad-indent", """
        package: p
          version: "1"
        """, {"line": 2, "column": 10}, "invalid YAML"),
    ("yaml-control-character", "package: p\nversion: \x07\n", {"line": 2, "column": 10},
     "unacceptable character"),
    ("yaml-python-tag", """
        package: !!python/object/apply:os.system ["true"]
        """, {"line": 1}, "could not determine a constructor"),
    ("yaml-two-documents", "package: p\n---\npackage: q\n", {"line": 2}, "single document"),
    ("empty-file", "", {"line": None}, "empty"),
    ("comments-only", "# nothing here\n", {"line": None}, "empty"),
    ("top-level-list", "- package: p\n", {"line": 1}, "must be a mapping"),
    ("top-level-scalar", "# one\n# two\njust text\n", {"line": 3}, "found a string"),
    ("unknown-top-level-key", MINIMAL + "colour: red\n", {"line": 9, "key": "colour"},
     "unknown key 'colour'"),
    ("unknown-nested-key", MINIMAL + "    colour: red\n",
     {"line": 9, "key": "layouts[0].colour"}, "unknown key 'colour'"),
    ("unknown-store-key", MINIMAL + "store: {hash: sha256, kind: s3}\n",
     {"line": 9, "key": "store.kind"}, "unknown key 'kind'"),
    # a misspelt required key: the unknown key is named (not the missing one), with a guess
    ("misspelt-key-flow", """
        package: p
        version: "1"
        models:
          - {name: m, sorce: m.onnx}
        layouts:
          - {name: l, external_weight: combined}
        """, {"line": 4, "key": "models[0].sorce"},
     "unknown key 'sorce' (did you mean 'source'?)"),
    ("misspelt-key-block", """
        package: p
        version: "1"
        models:
          - name: m
            sourc: m.onnx
        layouts:
          - {name: l, external_weight: combined}
        """, {"line": 5, "key": "models[0].sourc"},
     "unknown key 'sourc' (did you mean 'source'?)"),
    ("missing-model-source", """
        package: p
        version: "1"
        models:
          - name: m
        layouts:
          - {name: l, external_weight: combined}
        """, {"line": 4, "key": "models[0].source"}, "Field required"),
    ("missing-top-level-key", """
        # a comment first
        package: p
        version: "1"
        models:
          - {name: m, source: m.onnx}
        """, {"line": 2, "key": "layouts"}, "Field required"),
    ("missing-nested-mapping-key", """
        package: p
        version: "1"
        models:
          - {name: m, source: m.onnx}
        layouts:
          - name: l
            alignment: 64
        """, {"line": 6, "key": "layouts[0].external_weight"}, "Field required"),
    ("empty-models", MINIMAL.replace("models:\n  - name: m\n    source: m.onnx\n",
                                     "models: []\n"),
     {"line": 3, "key": "models"}, "at least 1"),
    ("alignment-zero", MINIMAL + "    alignment: 0\n", {"line": 9, "key": "layouts[0].alignment"},
     "greater than or equal to 1"),
    ("alignment-three", MINIMAL + "    alignment: 3\n", {"line": 9, "key": "layouts[0].alignment"},
     "power of two"),
    ("alignment-1000", MINIMAL + "    alignment: 1000\n",
     {"line": 9, "key": "layouts[0].alignment"}, "power of two"),
    ("alignment-2^21", MINIMAL + "    alignment: 2097152\n",
     {"line": 9, "key": "layouts[0].alignment"}, "at most 1048576 (1 MiB), got 2097152"),
    ("alignment-2^36", MINIMAL + "    alignment: 68719476736\n",
     {"line": 9, "key": "layouts[0].alignment"}, "at most 1048576 (1 MiB), got 68719476736"),
    ("alignment-2^62", MINIMAL + "    alignment: 4611686018427387904\n",
     {"line": 9, "key": "layouts[0].alignment"}, "got 4611686018427387904"),
    ("alignment-bool", MINIMAL + "    alignment: true\n",
     {"line": 9, "key": "layouts[0].alignment"}, "valid integer"),
    ("alignment-string", MINIMAL + "    alignment: '512'\n",
     {"line": 9, "key": "layouts[0].alignment"}, "valid integer"),
    ("negative-threshold", MINIMAL + "    size_threshold: -1\n",
     {"line": 9, "key": "layouts[0].size_threshold"}, "greater than or equal to 0"),
    ("bad-external-weight", MINIMAL.replace("embedded", "inline"),
     {"line": 8, "key": "layouts[0].external_weight"}, "'inline'"),
    ("bad-constants", MINIMAL + "    constants: inline\n",
     {"line": 9, "key": "layouts[0].constants"}, "'external-data' or 'file-constant'"),
    ("bad-hash", MINIMAL + "store:\n  path: s\n  hash: md5\n",
     {"line": 11, "key": "store.hash"}, "'blake3' or 'sha256'"),
    ("store-not-a-mapping", MINIMAL + "store: .weightstore\n",
     {"line": 9, "key": "store"}, "valid dictionary"),
    ("empty-output", MINIMAL + "output: ''\n", {"line": 9, "key": "output"}, "at least 1"),
    ("duplicate-model-names", """
        package: p
        version: "1"
        models:
          - {name: enc, source: a.onnx}
          - {name: dec, source: b.onnx}
          - {name: enc, source: c.onnx}
        layouts:
          - {name: l, external_weight: combined}
        """, {"line": 6, "key": "models[2].name"}, "duplicate model name 'enc'"),
    ("duplicate-layout-names", MINIMAL + "  - {name: l, external_weight: separate}\n",
     {"line": 9, "key": "layouts[1].name"}, "duplicate layout name 'l'"),
    ("duplicate-yaml-key-top-level", MINIMAL + "package: q\n", {"line": 9, "key": "package"},
     "duplicate key 'package' (first defined on line 1)"),
    ("duplicate-yaml-key-nested", MINIMAL + "    alignment: 64\n    alignment: 128\n",
     {"line": 10, "key": "layouts[0].alignment"}, "duplicate key 'alignment'"),
    ("duplicate-yaml-key-in-flow", MINIMAL + "store: {hash: sha256, hash: blake3}\n",
     {"line": 9, "key": "store.hash"}, "duplicate key 'hash'"),
    ("package-parent-path", MINIMAL.replace("package: p", "package: ../x"),
     {"line": 1, "key": "package"}, "starting with a letter or digit"),
    ("package-with-slash", MINIMAL.replace("package: p", "package: a/b"),
     {"line": 1, "key": "package"}, "'a/b'"),
    ("package-dot", MINIMAL.replace("package: p", "package: '.'"),
     {"line": 1, "key": "package"}, "file name"),
    ("package-dotdot", MINIMAL.replace("package: p", "package: '..'"),
     {"line": 1, "key": "package"}, "file name"),
    ("package-hidden", MINIMAL.replace("package: p", "package: .hidden"),
     {"line": 1, "key": "package"}, "file name"),
    ("package-trailing-newline", MINIMAL.replace("package: p", 'package: "p\\n"'),
     {"line": 1, "key": "package"}, "file name"),
    ("package-too-long", MINIMAL.replace("package: p", "package: " + "a" * 129),
     {"line": 1, "key": "package"}, "at most 128"),
    ("model-name-with-slash", MINIMAL.replace("name: m", "name: m/x"),
     {"line": 4, "key": "models[0].name"}, "file name"),
    ("layout-name-with-backslash", MINIMAL.replace("name: l", "name: 'l\\x'"),
     {"line": 7, "key": "layouts[0].name"}, "file name"),
    ("version-unquoted-number", MINIMAL.replace('version: "1"', "version: 1.0"),
     {"line": 2, "key": "version"}, "quote it"),
    ("version-with-space", MINIMAL.replace('version: "1"', "version: 1 0"),
     {"line": 2, "key": "version"}, "file name"),
    ("several-errors-first-in-file", """
        package: p
        version: "1"
        models:
          - {name: m, source: m.onnx, extra: 1}
        layouts:
          - {name: l, external_weight: combined, alignment: 3, size_threshold: -5}
        """, {"line": 4, "key": "models[0].extra"}, "(and 2 more errors)"),
    ("unknown-pass", MINIMAL.replace(
        "    source: m.onnx\n",
        "    source: m.onnx\n    scenarios:\n      - {name: s, passes: [fold]}\n"),
     {"line": 7, "key": "models[0].scenarios[0].passes[0]"}, "fuse-qkv"),
    ("no-passes", MINIMAL.replace(
        "    source: m.onnx\n", "    source: m.onnx\n    scenarios: [{name: s, passes: []}]\n"),
     {"line": 6, "key": "models[0].scenarios[0].passes"}, "at least 1"),
    ("split-embedded", MINIMAL + "  - {name: l2, external_weight: embedded, "
                                 "split: scenario}\n",
     {"line": 9, "key": "layouts[1].split"}, "keeps them embedded"),
    ("reserved-scenario-name", MINIMAL.replace(
        "    source: m.onnx\n",
        "    source: m.onnx\n    scenarios:\n      - {name: common, passes: [cleanup]}\n"),
     {"line": 7, "key": "models[0].scenarios[0].name"}, "reserved"),
    ("scenarios-with-file-constant", MINIMAL.replace(
        "    source: m.onnx\n",
        "    source: m.onnx\n    scenarios:\n      - {name: s, passes: [cleanup]}\n")
     + "  - {name: g, external_weight: combined, constants: file-constant}\n",
     {"line": 11, "key": "layouts[1].constants"}, "file-constant"),
    ("field-errors-first", MINIMAL + "    alignment: 3\ndevices: [{name: npu, scenario: x}]\n",
     {"line": 9, "key": "layouts[0].alignment"}, "power of two"),
    ("bad-scenario-entry", MINIMAL.replace(
        "    source: m.onnx\n", "    source: m.onnx\n    scenarios:\n      - {name: s}\n"),
     {"line": 7, "key": "models[0].scenarios[0].passes"}, "Field required"),
]


@pytest.mark.parametrize(("text", "expected", "fragment"),
                         [pytest.param(_dedent(t), e, f, id=i) for i, t, e, f in BAD])
def test_bad_recipe(text: str, expected: dict[str, Any], fragment: str) -> None:
    err = _parse_error(text)
    assert err.context["file"] == "recipe.yaml"
    for name, value in expected.items():
        assert err.context.get(name) == value, (name, err.context)
    assert fragment in err.message
    assert "\n" not in str(err)
    assert isinstance(err, ValueError)


def test_unsupported_features_are_accepted_by_the_models() -> None:
    """The format includes them; only the loader refuses, so the schema documents them."""
    data = {
        "package": "p", "version": "1",
        "models": [{"name": "m", "source": "m.onnx",
                    "scenarios": [{"name": "s", "passes": ["fuse-qkv"]}]}],
        "layouts": [{"name": "l", "external_weight": "combined", "split": "scenario"}],
        "devices": [{"name": "npu", "capabilities": {"fp16": True}, "scenario": "s"}],
    }
    recipe = Recipe.model_validate(data)
    assert recipe.devices[0].capabilities == {"fp16": True}


def test_cyclic_aliases_are_reported_not_crashing() -> None:
    err = _parse_error(MINIMAL + "devices: &d [*d]\n")
    assert err.context["key"] == "devices[0]"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_recipe_error(text: str) -> None:
    with contextlib.suppress(RecipeError):
        parse_recipe_text(text, "recipe.yaml")


@settings(max_examples=200, deadline=None)
@given(st.from_regex(NAME_PATTERN.replace("*$", "{0,40}$"), fullmatch=True))
def test_every_name_matching_the_pattern_is_accepted(name: str) -> None:
    text = MINIMAL.replace("package: p", f"package: '{name}'")
    assert parse_recipe_text(text, "recipe.yaml").package == name


# --- schema -------------------------------------------------------------------------------


def test_schema_file_is_up_to_date() -> None:
    current = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else ""
    assert current == render_schema(), (
        f"{SCHEMA_FILE.name} is stale: run "
        "`weightstore schema --output schemas/recipe.schema.json`")


def _schema_properties(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [(f"#/{name}", prop) for name, prop in schema.get("properties", {}).items()]
    for def_name, definition in schema.get("$defs", {}).items():
        found += [(f"{def_name}.{name}", prop)
                  for name, prop in definition.get("properties", {}).items()]
    return found


def test_every_schema_property_has_a_description() -> None:
    schema = recipe_json_schema()
    properties = _schema_properties(schema)
    assert len(properties) >= 20
    missing = [name for name, prop in properties if not prop.get("description")]
    assert missing == []
    undocumented = [name for name, d in schema["$defs"].items() if not d.get("description")]
    assert undocumented == []


def test_schema_header_and_constraints() -> None:
    schema = recipe_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"package", "version", "models", "layouts"}
    assert schema["properties"]["package"]["pattern"] == NAME_PATTERN
    layout = schema["$defs"]["Layout"]["properties"]
    assert layout["external_weight"]["enum"] == ["embedded", "separate", "combined"]
    assert (layout["alignment"]["minimum"], layout["alignment"]["maximum"]) == (1, 1 << 20)
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values())


def test_render_is_deterministic_json() -> None:
    text = render_schema()
    assert text == render_schema()
    assert text.endswith("}\n")
    assert json.loads(text) == recipe_json_schema()


def test_write_schema_creates_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "recipe.schema.json"
    assert write_schema(target) == target
    assert target.read_text(encoding="utf-8") == render_schema()


def test_module_entry_point_writes_schema(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.json"
    assert main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == render_schema()
    assert main(["a", "b"]) == 2
    capsys.readouterr()


def test_many_unknown_keys_are_refused_in_linear_time():
    """Each error is located through an index of its mapping's keys: 20,000 unknown keys
    (once 13.8 s of CPU, 50,000 took 136 s) cost about what reading them does."""
    import time

    text = ('package: p\nversion: "1"\nmodels:\n  - {name: m, source: m.onnx}\n'
            "layouts:\n  - {name: c, external_weight: combined}\n"
            + "".join(f"k{i}: {i}\n" for i in range(20000)))
    start = time.process_time()
    with pytest.raises(RecipeError) as err:
        parse_recipe_text(text, "r.yaml")
    assert time.process_time() - start < 6  # about 1 s here, most of it reading the YAML
    assert err.value.message == "invalid recipe: unknown key 'k0' (and 19999 more errors)"
    assert err.value.context == {"file": "r.yaml", "line": 7, "key": "k0"}
