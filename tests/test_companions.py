"""Companion files (recipe ``files:``): configs, tokenizers, licences shipped in every
package, stored, listed in summary.json (format 5), fingerprinted and verified."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import PackageError, RecipeError
from weightstore.io.digests import digest_file, make_key
from weightstore.package.summary import read_summary_file
from weightstore.packaging.inventory import verify_package
from weightstore.recipe.companions import default_kind
from weightstore.recipe.schema import parse_recipe_text
from weightstore.store import WeightStore

from .helpers import file_tree, record_calls
from .registry_server import needs_registry, running_registry
from .test_pinned_sources import served  # noqa: F401 (a fixture)

LAYOUTS = """
  - {name: embedded, external_weight: embedded}
  - {name: separate, external_weight: separate, size_threshold: 64}
  - {name: combined, external_weight: combined, size_threshold: 64}
"""

OPTIMUM = {
    "config.json": json.dumps({"architectures": ["BertModel"], "hidden_size": 32}, indent=2),
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "WordPiece",
                                                               "vocab": {"[UNK]": 0, "a": 1}}}),
    "tokenizer_config.json": json.dumps({"model_max_length": 128, "do_lower_case": True}),
    "generation_config.json": json.dumps({"max_length": 20}),
}
CLASSIC = {"labels.txt": "cat\ndog\nbird\n", "LICENSE": "Apache License 2.0\n",
           "README.md": "# tiny encoder\n\nA model card.\n"}


def write_recipe(folder: Path, files: str, *, layouts: str = LAYOUTS,
                 models: str = "  - {name: encoder, source: models/encoder.onnx}\n",
                 extra: str = "") -> Path:
    text = ('package: pkg\nversion: "1.0.0"\nmodels:\n' + models + "layouts:" + layouts
            + "output: out\n" + (f"files:\n{files}" if files else "") + extra)
    path = folder / "recipe.yaml"
    path.write_text(text)
    return path


def write_tree(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def project(encoder_model, save_model, tmp_path):
    """An encoder, an Optimum-style export folder and a classic model's files."""
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", OPTIMUM)
    write_tree(tmp_path / "classic", CLASSIC)
    files = ("  - {source: hf, path: .}\n"
             "  - {source: classic/labels.txt}\n"
             "  - {source: classic/LICENSE}\n"
             "  - {source: classic/README.md, path: docs/README.md}\n")
    return write_recipe(tmp_path, files)


def opts(tmp_path: Path, store: str = "store", jobs: int = 2, **kwargs) -> BuildOptions:
    return BuildOptions(store=str(tmp_path / store), jobs=jobs, **kwargs)


EXPECTED = {**OPTIMUM, "labels.txt": CLASSIC["labels.txt"], "LICENSE": CLASSIC["LICENSE"],
            "docs/README.md": CLASSIC["README.md"]}


def test_every_layout_ships_the_files_byte_identical(project, tmp_path):
    result = build(project, opts(tmp_path))
    assert [p.status for p in result.packages] == ["built"] * 3
    for package in result.packages:
        for path, text in EXPECTED.items():
            assert (package.path / path).read_bytes() == text.encode(), (package.layout, path)
        summary = json.loads((package.path / "summary.json").read_text())
        assert summary["format_version"] == 5
        listed = {c["path"]: c for c in summary["contents"]}
        assert [c["path"] for c in summary["companions"]] == sorted(EXPECTED)
        for c in summary["companions"]:
            file = package.path / c["path"]
            assert c["size"] == file.stat().st_size
            assert c["digest"] == make_key("blake3", digest_file("blake3", file))
            assert listed[c["path"]]["digest"] == c["digest"]
        kinds = {c["path"]: c["kind"] for c in summary["companions"]}
        assert kinds == {"config.json": "config", "tokenizer.json": "config",
                         "tokenizer_config.json": "config",
                         "generation_config.json": "config", "labels.txt": "doc",
                         "LICENSE": "doc", "docs/README.md": "doc"}
        report = verify_package(package.path, store=tmp_path / "store")
        assert report.ok and report.recorded, report.problems


def test_each_file_is_one_store_object(project, tmp_path):
    result = build(project, opts(tmp_path))
    summary = result.packages[0].summary
    store = WeightStore(tmp_path / "store")
    found = store.locate(c["digest"] for c in summary["companions"])
    assert len(found) == len(EXPECTED)
    for c in summary["companions"]:
        assert store.read(found[c["digest"]]) == EXPECTED[c["path"]].encode()


def test_a_package_without_companions_keeps_format_4(encoder_model, save_model, tmp_path):
    save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, "")
    summary = build(recipe, opts(tmp_path)).packages[1].summary
    assert summary["format_version"] == 4 and "companions" not in summary


def test_unchanged_is_up_to_date_an_edit_rebuilds(project, tmp_path):
    first = build(project, opts(tmp_path))
    before = {p.layout: file_tree(p.path) for p in first.packages}
    again = build(project, opts(tmp_path))
    assert [p.status for p in again.packages] == ["up-to-date"] * 3
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    with pytest.raises(PackageError) as caught:
        build(project, opts(tmp_path))
    assert "companion 'tokenizer_config.json'" in caught.value.context["changed"]
    rebuilt = build(project, opts(tmp_path, force=True))
    assert [p.status for p in rebuilt.packages] == ["built"] * 3
    for p in rebuilt.packages:
        assert p.summary["fingerprint"] != first.packages[0].summary["fingerprint"]
        assert (p.path / "tokenizer_config.json").read_bytes() == b'{"model_max_length": 64}'
        assert file_tree(p.path)["encoder.onnx"] == before[p.layout]["encoder.onnx"]


def test_a_file_added_to_a_folder_rebuilds(project, tmp_path):
    build(project, opts(tmp_path))
    (tmp_path / "hf" / "preprocessor_config.json").write_text("{}")
    with pytest.raises(PackageError) as caught:
        build(project, opts(tmp_path))
    assert "companion 'preprocessor_config.json' added" in caught.value.context["changed"]


def test_an_action_cache_hit_materializes_them(project, tmp_path, monkeypatch):
    first = build(project, opts(tmp_path))
    before = {p.layout: file_tree(p.path) for p in first.packages}
    for p in first.packages:
        if p.layout != "embedded":
            shutil.rmtree(p.path)
    from weightstore.packaging import write

    calls = record_calls(monkeypatch, write, "write_package")
    again = build(project, opts(tmp_path))
    assert calls == []  # nothing converted: the store served every file
    assert [p.status for p in again.packages] == ["up-to-date", "built", "built"]
    for p in again.packages:
        assert file_tree(p.path) == before[p.layout]


def test_two_builds_are_byte_identical_fresh_or_warm_store(project, tmp_path):
    first = build(project, opts(tmp_path))
    trees = {p.layout: file_tree(p.path) for p in first.packages}
    shutil.rmtree(tmp_path / "out")
    warm = build(project, opts(tmp_path, force=True))  # converted again, store warm
    assert {p.layout: file_tree(p.path) for p in warm.packages} == trees
    shutil.rmtree(tmp_path / "out")
    fresh = build(project, opts(tmp_path, store="other-store", jobs=1))
    assert {p.layout: file_tree(p.path) for p in fresh.packages} == trees


def test_an_edited_companion_is_refused_as_an_edited_model(project, tmp_path, capsys):
    result = build(project, opts(tmp_path))
    folder = result.packages[2].path
    config = folder / "config.json"
    data = bytearray(config.read_bytes())
    data[5] ^= 0x01  # same size, other bytes
    config.write_bytes(bytes(data))
    report = verify_package(folder)
    assert [(p.kind, p.path) for p in report.problems] == [("digest", "config.json")]
    assert main(["verify", str(folder)]) == 1
    assert "digest: config.json" in capsys.readouterr().out
    (folder / "extra.json").write_text("{}")
    assert ("unexpected", "extra.json") in [(p.kind, p.path)
                                            for p in verify_package(folder).problems]
    with pytest.raises(PackageError):  # and a build does not take it as the package
        build(project, opts(tmp_path))


# --- recipe validation ------------------------------------------------------------------

RECIPE_HEAD = ('package: pkg\nversion: "1"\nmodels: [{name: encoder, source: m.onnx}]\n'
               "layouts: [{name: c, external_weight: combined}]\n")


@pytest.mark.parametrize("entry, key, words", [
    ("{source: a.json, path: ../a.json}", "files[0].path", "normalised"),
    ("{source: a.json, path: /etc/a.json}", "files[0].path", "not absolute"),
    ("{source: a.json, path: a//b.json}", "files[0].path", "normalised"),
    ("{source: a.json, path: ./a.json}", "files[0].path", "normalised"),
    ("{source: a.json, path: .hidden}", "files[0].path", "hidden"),
    ("{source: a.json, path: summary.json}", "files[0].path", "keeps for itself"),
    ("{source: a.json, path: devices/cpu/a.json}", "files[0].path", "keeps for itself"),
    ("{source: a.json, path: payloads/a.json}", "files[0].path", "keeps for itself"),
    # a reserved file as a folder, and in another case (one file on macOS and Windows)
    ("{source: a.json, path: bundle.json/x}", "files[0].path", "keeps for itself"),
    ("{source: a.json, path: Summary.JSON}", "files[0].path", "keeps for itself"),
    ("{source: a.json, path: Devices/cpu/a.json}", "files[0].path", "keeps for itself"),
    ("{source: a.json, path: 'WEIGHT_" + "A" * 64 + "'}", "files[0].path", "weight file"),
    ("{source: a.json, path: X_Weight_Combined}", "files[0].path", "weight file"),
    ("{source: a.json, path: encoder.onnx}", "files[0].path", "collides with 'encoder.onnx'"),
    ("{source: a.json, path: encoder.onnx/x}", "files[0].path", "collides"),
    ("{source: x/encoder_weight_combined}", "files[0].source", "weight file"),
    ("{source: a.json, path: 'weight_" + "0" * 64 + "'}", "files[0].path", "weight file"),
    ("{source: a.json, kind: licence}", "files[0].kind", "config"),
    ("{source: a.json, size: 3}", "files[0].size", "unknown key"),
])
def test_recipe_paths_are_checked(entry, key, words):
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(RECIPE_HEAD + f"files:\n  - {entry}\n", "r.yaml")
    assert caught.value.context["key"] == key
    assert words in str(caught.value)


@pytest.mark.parametrize("path", [
    "", "/a", "a\\b", "a\x00b", "a//b", "a/", "./a", "a/..", "..", ".git/x", "a/.cache",
    "a", "a/b.json", "a..b/c", 7, None])
def test_a_companion_path_stays_inside_as_every_package_path(path):
    """The companion path rule is the package's one rule of a relative path inside its
    folder, hidden parts refused, with a message saying which part of it fails."""
    from weightstore.io.files import is_relative_inside
    from weightstore.recipe.companions import path_problem

    assert (path_problem(path) is None) == is_relative_inside(path, hidden=False)


def test_two_entries_at_one_path_are_refused():
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(RECIPE_HEAD + "files:\n  - {source: a/config.json}\n"
                          "  - {source: b/x.json, path: config.json}\n", "r.yaml")
    assert caught.value.context["key"] == "files[1].path"
    assert "collides with 'config.json'" in str(caught.value)


@pytest.mark.parametrize("files, key, path, other", [
    ("  - {source: a/LICENSE}\n  - {source: b/license}\n", "files[1].source", "license",
     "LICENSE"),
    ("  - {source: a/config.json, path: Docs/config.json}\n  - {source: b/docs}\n",
     "files[1].source", "docs", "Docs/config.json"),
    ("  - {source: a/Encoder.onnx}\n", "files[0].source", "Encoder.onnx", "encoder.onnx"),
])
def test_paths_that_differ_only_in_case_collide(files, key, path, other):
    """One file on the case-insensitive file systems of macOS and Windows."""
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(RECIPE_HEAD + "files:\n" + files, "r.yaml")
    assert caught.value.context["key"] == key
    assert f"companion path '{path}' collides with '{other}'" in str(caught.value)


def test_folder_files_that_differ_only_in_case_collide_at_build(encoder_model, save_model,
                                                                tmp_path, capsys):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", {"LICENSE": "MIT\n", "license": "Apache 2.0\n"})
    recipe = write_recipe(tmp_path, "  - {source: hf, path: .}\n")
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'license' collides with 'LICENSE'" in err[0]
    assert not (tmp_path / "out").exists()


def test_folder_files_are_checked_at_build(encoder_model, save_model, tmp_path, capsys):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", {"config.json": "{}", "summary.json": "{}"})
    recipe = write_recipe(tmp_path, "  - {source: hf, path: .}\n")
    with pytest.raises(RecipeError) as caught:
        build(recipe, opts(tmp_path))
    assert caught.value.context["key"] == "files[0]" and "summary.json" in str(caught.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()
    (tmp_path / "hf" / "summary.json").unlink()
    write_tree(tmp_path / "more", {"config.json": "{}"})
    write_recipe(tmp_path, "  - {source: hf, path: .}\n  - {source: more/config.json}\n")
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "collides with 'config.json'" in err[0]


@pytest.mark.parametrize("special", ["link", "folder-link", "fifo"])
def test_links_and_special_files_in_a_folder_are_refused(special, encoder_model, save_model,
                                                         tmp_path, capsys):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", {"config.json": "{}"})
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("private")
    if special == "link":
        os.symlink(tmp_path / "secret" / "key", tmp_path / "hf" / "tokenizer.json")
    elif special == "folder-link":
        os.symlink(tmp_path / "secret", tmp_path / "hf" / "sub")
    else:
        os.mkfifo(tmp_path / "hf" / "pipe")
    recipe = write_recipe(tmp_path, "  - {source: hf}\n")
    with pytest.raises(RecipeError) as caught:
        build(recipe, opts(tmp_path))
    assert caught.value.context["key"] == "files[0].source"
    assert "link or a special file" in str(caught.value)
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_hidden_files_of_a_folder_are_left_out(encoder_model, save_model, tmp_path):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", {"config.json": "{}", ".gitattributes": "*.bin lfs",
                                 ".cache/huggingface/x": "y", "sub/vocab.txt": "a\nb\n"})
    recipe = write_recipe(tmp_path, "  - {source: hf}\n")
    summary = build(recipe, opts(tmp_path)).packages[0].summary
    assert [(c["path"], c["kind"]) for c in summary["companions"]] == [
        ("hf/config.json", "config"), ("hf/sub/vocab.txt", "config")]


@pytest.mark.parametrize("entry, key", [
    ("{source: nowhere.json}", "files[0].source"),  # a missing source
    ("{source: a.json, path: .}", "files[0].path"),  # the root is for a folder
])
def test_a_source_the_build_cannot_take_is_a_recipe_error(entry, key, encoder_model,
                                                          save_model, tmp_path):
    save_model(encoder_model, "models/encoder.onnx")
    (tmp_path / "a.json").write_text("{}")
    recipe = write_recipe(tmp_path, f"  - {entry}\n")
    with pytest.raises(RecipeError) as caught:
        build(recipe, opts(tmp_path))
    assert caught.value.context["key"] == key


def test_a_separate_layouts_weight_folder_is_not_taken(encoder_model, save_model, tmp_path):
    """A split separate layout's group folder (<package>.<group>/) collides too."""
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "x", {"pkg.default/a.json": "{}"})
    recipe = write_recipe(tmp_path, "  - {source: x, path: .}\n", layouts="""
  - {name: split, external_weight: separate, split: scenario, size_threshold: 64}
""")
    with pytest.raises(RecipeError) as caught:
        build(recipe, opts(tmp_path))
    assert "collides" in str(caught.value) and "pkg.default" in str(caught.value)


@pytest.mark.parametrize("path, kind", [
    ("LICENSE", "doc"), ("LICENSE.txt", "doc"), ("COPYING", "doc"), ("NOTICE", "doc"),
    ("README.md", "doc"), ("docs/usage.rst", "doc"), ("labels.txt", "doc"),
    ("vocab.txt", "config"), ("merges.txt", "config"), ("config.json", "config"),
    ("tokenizer.json", "config"), ("genai_config.json", "config"),
    ("chat_template.jinja", "config"), ("spiece.model", "config"), ("run.py", "code"),
    ("setup.sh", "code"), ("model.safetensors", "weights"), ("pytorch_model.bin", "weights"),
    ("model.onnx.data", "weights"), ("w.pt", "weights")])
def test_default_kinds(path, kind):
    assert default_kind(path) == kind


# --- summary structure ------------------------------------------------------------------

@pytest.mark.parametrize("change, key", [
    (lambda s: s.update(companions={}), "companions"),
    (lambda s: s["companions"][0].pop("digest"), "companions[0].digest"),
    (lambda s: s["companions"][0].update(kind="model"), "companions[0].kind"),
    (lambda s: s["companions"][0].update(size=-1), "companions[0].size"),
    (lambda s: s["companions"][0].update(digest="md5:00"), "companions[0].digest"),
    (lambda s: s["companions"][0].update(path="../../etc/passwd"), "companions[0].path"),
    (lambda s: s["companions"][0].update(path="/etc/passwd"), "companions[0].path"),
    (lambda s: s["companions"][0].update(path="summary.json"), "companions[0].path"),
    (lambda s: s["companions"].append(dict(s["companions"][0])), "companions[7].path"),
    (lambda s: s["companions"].append({**s["companions"][0], "path": "license"}),
     "companions[7].path"),  # LICENSE and license: one file on macOS and Windows
    (lambda s: s["companions"].append({**s["companions"][0], "path": "LICENSE/x"}),
     "companions[7].path"),
    (lambda s: s.update(format_version=4), "companions"),
    (lambda s: s["companions"][0].update(size=1), "companions[0]"),
])
def test_malformed_companions_are_refused(project, tmp_path, change, key, capsys):
    folder = build(project, opts(tmp_path)).packages[2].path
    summary = json.loads((folder / "summary.json").read_text())
    change(summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(PackageError) as caught:
        verify_package(folder)
    assert caught.value.context["key"] == key
    assert main(["verify", str(folder)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_read_summary_file_checks_companions(project, tmp_path):
    folder = build(project, opts(tmp_path)).packages[1].path
    summary = json.loads((folder / "summary.json").read_text())
    summary["companions"][0]["path"] = "a/../../b"
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(PackageError):
        read_summary_file(folder)


def test_check_names_a_missing_or_edited_companion(project, tmp_path, capsys):
    from weightstore.packaging.check import check_package

    folder = build(project, opts(tmp_path)).packages[1].path
    assert check_package(folder, verify=True).ok
    tokenizer = folder / "tokenizer.json"
    data = bytearray(tokenizer.read_bytes())
    data[0] ^= 0x01
    tokenizer.write_bytes(bytes(data))
    assert check_package(folder).ok  # sizes only
    assert check_package(folder, verify=True).problems == [
        "companion file tokenizer.json differs from its digest"]
    tokenizer.unlink()
    assert check_package(folder).problems == ["companion file tokenizer.json is missing"]
    assert main(["check", str(folder)]) == 1
    assert "tokenizer.json is missing" in capsys.readouterr().out


# --- model file names, device companions, bundles ---------------------------------------

RUNTIME = """
  - {name: combined, external_weight: combined, size_threshold: 64}
  - {name: embedded, external_weight: embedded}
"""


@pytest.fixture
def runtime(encoder_model, save_model, tmp_path):
    """A runtime folder's recipe: the model as model.onnx, a config every device gets, a
    device that replaces it and adds one."""
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", {"genai_config.json": '{"filename": "model.onnx"}',
                                 "tokenizer.json": '{"v": 1}'})
    write_tree(tmp_path / "npu", {"genai_config.json": '{"filename": "model.onnx", "npu": 1}',
                                  "npu_options.json": "{}"})
    return write_recipe(
        tmp_path, "  - {source: hf, path: .}\n", layouts=RUNTIME,
        models="  - {name: decoder, source: models/encoder.onnx, file: model.onnx}\n",
        extra="devices:\n  - {name: cpu}\n"
              "  - {name: npu, files: [{source: npu/genai_config.json},"
              " {source: npu/npu_options.json}]}\n")


def test_a_model_takes_the_file_name_its_runtime_opens(runtime, tmp_path, capsys):
    from weightstore.packaging.check import check_package

    result = build(runtime, opts(tmp_path))
    folder = result.packages[0].path
    summary = result.packages[0].summary
    assert [m["file"] for m in summary["models"]] == ["model.onnx"]
    assert (folder / "model.onnx").is_file() and not (folder / "decoder.onnx").exists()
    assert (folder / "devices" / "cpu" / "model.onnx").is_file()
    assert (result.packages[1].path / "model.onnx").is_file()
    assert check_package(folder, verify=True).ok
    assert check_package(folder, device="npu", verify=True).ok
    assert main(["resolve", str(folder), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("models, words", [
    ("  - {name: a, source: m.onnx, file: model}\n", "ends in .onnx"),
    ("  - {name: a, source: m.onnx, file: sub/model.onnx}\n", "letters, digits"),
    ("  - {name: a, source: m.onnx, file: model.onnx}\n"
     "  - {name: b, source: m.onnx, file: model.onnx}\n", "another model's file"),
    ("  - {name: a, source: m.onnx}\n  - {name: b, source: m.onnx, file: a.onnx}\n",
     "another model's file"),
])
def test_model_file_names_are_checked(models, words):
    text = ('package: pkg\nversion: "1"\nmodels:\n' + models
            + "layouts: [{name: c, external_weight: combined}]\n")
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(text, "r.yaml")
    assert words in str(caught.value)


def test_a_companion_cannot_take_the_models_file_name():
    text = ('package: pkg\nversion: "1"\nmodels: [{name: a, source: m.onnx, file: model.onnx}]\n'
            "layouts: [{name: c, external_weight: combined}]\n"
            "files: [{source: x/model.onnx}]\n")
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(text, "r.yaml")
    assert "collides with 'model.onnx'" in str(caught.value)


def test_a_device_replaces_and_adds_companions(runtime, tmp_path):
    result = build(runtime, opts(tmp_path))
    folder, summary = result.packages[0].path, result.packages[0].summary
    devices = {d["name"]: d for d in summary["devices"]}
    assert [c["path"] for c in devices["cpu"]["companions"]] == ["genai_config.json",
                                                                  "tokenizer.json"]
    npu = {c["path"]: c for c in devices["npu"]["companions"]}
    assert sorted(npu) == ["genai_config.json", "npu_options.json", "tokenizer.json"]
    own = folder / "devices" / "npu" / "genai_config.json"
    assert own.read_text() == '{"filename": "model.onnx", "npu": 1}'
    assert npu["genai_config.json"]["digest"] == make_key("blake3", digest_file("blake3", own))
    assert "devices/npu/genai_config.json" in devices["npu"]["files"]
    assert [c["path"] for c in summary["companions"]] == ["genai_config.json",
                                                          "tokenizer.json"]
    record = json.loads((folder / "devices" / "npu" / "bundle.json").read_text())
    assert record["format_version"] == 3 and record["companions"] == devices["npu"]["companions"]
    assert verify_package(folder, store=tmp_path / "store").ok
    # an embedded layout's package holds the device's own files as every layout's does
    embedded = result.packages[1].path
    assert (embedded / "devices" / "npu" / "genai_config.json").read_bytes() == own.read_bytes()
    assert result.packages[1].summary["devices"] == summary["devices"]
    assert verify_package(embedded, store=tmp_path / "store").ok
    # an edited device file rebuilds
    (tmp_path / "npu" / "npu_options.json").write_text('{"x": 1}')
    with pytest.raises(PackageError) as caught:
        build(runtime, opts(tmp_path))
    assert "companion 'npu_options.json' of device 'npu'" in caught.value.context["changed"]


def test_bundle_writes_a_complete_runtime_folder(runtime, tmp_path, capsys):
    folder = build(runtime, opts(tmp_path)).packages[0].path
    out = tmp_path / "npu-folder"
    assert main(["bundle", str(folder), "npu", "--output", str(out)]) == 0
    assert "3 companion files" in capsys.readouterr().out
    files = file_tree(out)
    assert files["genai_config.json"] == b'{"filename": "model.onnx", "npu": 1}'
    assert files["tokenizer.json"] == b'{"v": 1}' and files["npu_options.json"] == b"{}"
    assert {"model.onnx", "bundle.json", "decoder_weight_combined"} <= set(files)
    cpu = tmp_path / "cpu-folder"
    assert main(["bundle", str(folder), "cpu", "--output", str(cpu)]) == 0
    assert (cpu / "genai_config.json").read_bytes() == b'{"filename": "model.onnx"}'
    assert not (cpu / "npu_options.json").exists()
    import onnx

    from .samples import run_onnxruntime, sample_inputs  # the folder runs as it is

    inputs = sample_inputs(onnx.load(str(cpu / "model.onnx"), load_external_data=False))
    assert run_onnxruntime(cpu / "model.onnx", inputs)


def test_bundle_refuses_an_edited_companion(runtime, tmp_path, capsys):
    folder = build(runtime, opts(tmp_path)).packages[0].path
    own = folder / "devices" / "npu" / "genai_config.json"
    data = bytearray(own.read_bytes())
    data[2] ^= 0x01
    own.write_bytes(bytes(data))
    out = tmp_path / "npu-folder"
    assert main(["bundle", str(folder), "npu", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "genai_config.json" in err[0] and "digest" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_bundle_takes_each_companion_from_the_file_the_summary_names(runtime, tmp_path,
                                                                      capsys):
    """A device's own version of a file is the one the summary lists at
    devices/<device>/<path>, not whatever lies there: a stray copy beside a device that
    has none is not taken, and a listed one that is gone is missing, not the package's."""
    folder = build(runtime, opts(tmp_path)).packages[0].path
    stray = folder / "devices" / "cpu" / "genai_config.json"
    stray.write_bytes((folder / "devices" / "npu" / "genai_config.json").read_bytes())
    out = tmp_path / "cpu-folder"
    assert main(["bundle", str(folder), "cpu", "--output", str(out)]) == 0
    assert (out / "genai_config.json").read_bytes() == b'{"filename": "model.onnx"}'
    stray.unlink()
    (folder / "devices" / "npu" / "genai_config.json").unlink()
    capsys.readouterr()
    assert main(["bundle", str(folder), "npu", "--output", str(tmp_path / "npu-out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "companion file the device needs is missing" in err[0]
    assert not (tmp_path / "npu-out").exists()


def test_device_companion_paths_are_checked(encoder_model, save_model, tmp_path):
    text = (RECIPE_HEAD + "files: [{source: hf/cfg, path: cfg}]\n"
            "devices: [{name: d, files: [{source: a.json, path: cfg}]}]\n")
    save_model(encoder_model, "m.onnx")
    write_tree(tmp_path, {"hf/cfg/x.json": "{}", "a.json": "{}"})
    (tmp_path / "recipe.yaml").write_text(text.replace("output", "out") + "output: out\n")
    with pytest.raises(RecipeError) as caught:
        build(tmp_path / "recipe.yaml", opts(tmp_path))
    assert caught.value.context["key"] == "devices[0].files[0]"
    with pytest.raises(RecipeError) as caught:
        parse_recipe_text(RECIPE_HEAD + "devices: [{name: d, files: [{source: a.json, "
                          "path: ../a.json}]}]\n", "r.yaml")
    assert caught.value.context["key"] == "devices[0].files[0].path"


# --- pinned sources ---------------------------------------------------------------------

def test_a_pinned_url_companion_is_fetched_once(served, encoder_model, save_model,  # noqa: F811
                                                tmp_path, capsys):
    import hashlib

    licence = served["file"].parent / "LICENSE"
    licence.write_text("MIT License\n")
    digest = hashlib.sha256(licence.read_bytes()).hexdigest()
    url = served["url"].rpartition("/")[0] + "/LICENSE"
    save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, f"  - {{source: {{url: '{url}', sha256: '{digest}'}}}}\n"
                                    f"  - {{source: {{url: '{url}', sha256: '{digest}', "
                                    "size: 12}, path: legal/COPYING}\n")
    first = build(recipe, opts(tmp_path))
    for p in first.packages:
        assert (p.path / "LICENSE").read_bytes() == b"MIT License\n"
        assert (p.path / "legal" / "COPYING").read_bytes() == b"MIT License\n"
        assert {c["path"]: c["kind"] for c in p.summary["companions"]} == {
            "LICENSE": "doc", "legal/COPYING": "doc"}
    assert served["requests"] == ["/LICENSE"]  # once, for both entries and every layout
    before = {p.layout: file_tree(p.path) for p in first.packages}
    licence.write_text("changed on the server\n")  # never fetched again: pinned
    assert [p.status for p in build(recipe, opts(tmp_path)).packages] == ["up-to-date"] * 3
    shutil.rmtree(first.packages[2].path)
    again = build(recipe, opts(tmp_path))  # from the store's action record
    assert {p.layout: file_tree(p.path) for p in again.packages} == before
    assert served["requests"] == ["/LICENSE"]
    # a fresh store fetches, and the changed bytes are refused in one line
    assert main(["build", str(recipe), "--store", str(tmp_path / "fresh"), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pinned digest" in err[0] and "files[0]" in err[0]


@needs_registry
def test_a_pinned_ref_companion_is_a_file_of_the_artifact(encoder_model, save_model,
                                                          tmp_path):
    from weightstore.registry.push import push

    save_model(encoder_model, "plain/models/encoder.onnx")
    plain = build(write_recipe(tmp_path / "plain", ""), opts(tmp_path))
    source = plain.packages[1].path
    with running_registry(tmp_path / "registry") as registry:
        report = push(source, f"{registry.host}/models/encoder:1",
                      store=WeightStore(tmp_path / "store"))
        ref = f"{registry.host}/models/encoder@{report.manifest_digest}"
        save_model(encoder_model, "models/encoder.onnx")
        recipe = write_recipe(tmp_path, f"  - {{source: {{ref: '{ref}', path: encoder.onnx}},"
                                        " path: reference/encoder.onnx}\n")
        built = build(recipe, opts(tmp_path, store="other"))
    for p in built.packages:
        assert (p.path / "reference" / "encoder.onnx").read_bytes() == \
            (source / "encoder.onnx").read_bytes()
        assert p.summary["companions"][0]["kind"] == "config"
    with pytest.raises(RecipeError) as caught:  # a ref names its file
        parse_recipe_text(RECIPE_HEAD + f"files: [{{source: {{ref: '{ref}'}}}}]\n", "r.yaml")
    assert caught.value.context["key"] == "files[0].source"


# --- the remote build cache -------------------------------------------------------------

@needs_registry
def test_a_build_cache_entry_covers_the_companions(project, tmp_path, monkeypatch):
    from weightstore.signing.keys import TRUSTED_KEYS_ENV, generate

    key = tmp_path / "ci.pem"
    monkeypatch.setenv(TRUSTED_KEYS_ENV, generate(key).text)
    with running_registry(tmp_path / "registry") as registry:
        repo = f"{registry.host}/cache/companions"
        first = build(project, opts(tmp_path, cache_to=repo, cache_key=str(key)))
        trees = {p.layout: file_tree(p.path) for p in first.packages}
        shutil.rmtree(tmp_path / "out")
        hit = build(project, opts(tmp_path, store="runner-b", cache_from=(repo,)))
    fetched = [p for p in hit.packages if p.cache == repo]
    # every layout, embedded included (its entry is the folder itself)
    assert {p.layout for p in fetched} == {"separate", "combined", "embedded"}
    for p in hit.packages:
        assert file_tree(p.path) == trees[p.layout]
        assert verify_package(p.path, store=tmp_path / "runner-b").ok
    store = WeightStore(tmp_path / "runner-b")  # the pull put each file into the store
    assert len(store.locate(c["digest"] for c in first.packages[1].summary["companions"])) \
        == len(EXPECTED)


# --- the example recipe -----------------------------------------------------------------

def test_the_runtime_folder_recipe_packages_the_builder_folder(tmp_path, capsys):
    """recipes/runtime-folder.yaml: onnxruntime-genai's builder output as a package whose
    folder, and the cpu device's bundle, hold every file the runtime opens."""
    from .helpers import build_example

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny_llm"
    folder = build_example(tmp_path, "runtime-folder") / "tiny-llm" / "1.0.0" / "runtime"
    summary = json.loads((folder / "summary.json").read_text())
    assert [m["file"] for m in summary["models"]] == ["model.onnx"]
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (tiny / "fp32" / name).read_bytes()
    assert (folder / "README.md").read_bytes() == (tiny / "README.md").read_bytes()
    assert verify_package(folder).ok
    out = tmp_path / "cpu"
    assert main(["bundle", str(folder), "cpu", "--output", str(out)]) == 0
    capsys.readouterr()
    assert {"model.onnx", "genai_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md"} <= {p.name for p in out.iterdir()}
    pytest.importorskip("onnxruntime_genai")
    from .tiny_llm import assert_generates_as_builder

    for runtime in (folder, out):  # the package folder and the device's, as they are
        assert_generates_as_builder(runtime, "fp32")


def test_a_device_alone_may_have_companions(encoder_model, save_model, tmp_path, capsys):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "npu", {"options.json": "{}"})
    recipe = write_recipe(tmp_path, "", layouts=RUNTIME,
                          extra="devices:\n  - {name: npu, files: [{source: npu/options.json}]}\n")
    first = build(recipe, opts(tmp_path))
    summary = first.packages[0].summary
    assert summary["format_version"] == 5 and "companions" not in summary
    assert summary["devices"][0]["companions"][0]["path"] == "options.json"
    embedded = first.packages[1]  # an embedded layout's devices have their files too
    assert embedded.summary["format_version"] == 5
    assert (embedded.path / "devices" / "npu" / "options.json").read_bytes() == b"{}"
    assert verify_package(first.packages[0].path, store=tmp_path / "store").ok
    assert [p.status for p in build(recipe, opts(tmp_path)).packages] == ["up-to-date"] * 2
    (tmp_path / "npu" / "options.json").write_text('{"a": 1}')
    with pytest.raises(PackageError):  # no build stamp may take it for up to date
        build(recipe, opts(tmp_path))
    out = tmp_path / "b"
    assert main(["bundle", str(first.packages[0].path), "npu", "--output", str(out)]) == 0
    assert (out / "options.json").read_bytes() == b"{}"


def test_a_renamed_model_file_is_a_change(encoder_model, save_model, tmp_path):
    save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, "", layouts=RUNTIME)
    plain = build(recipe, opts(tmp_path))
    before = (plain.packages[0].path / "encoder.onnx").read_bytes()
    write_recipe(tmp_path, "", layouts=RUNTIME,
                 models="  - {name: encoder, source: models/encoder.onnx, file: model.onnx}\n")
    with pytest.raises(PackageError) as caught:
        build(recipe, opts(tmp_path))
    assert "file name of model 'encoder'" in caught.value.context["changed"]
    renamed = build(recipe, opts(tmp_path, force=True))
    assert renamed.packages[0].summary["fingerprint"] != plain.packages[0].summary["fingerprint"]
    folder = renamed.packages[0].path
    assert (folder / "model.onnx").read_bytes() == before  # the same graph, another name
    assert not (folder / "encoder.onnx").exists()


def test_a_dry_run_counts_the_companion_objects(project, encoder_model, tmp_path):
    dry = build(project, opts(tmp_path, dry_run=True))
    shutil.copytree(tmp_path / "models", tmp_path / "plain" / "models")
    plain = write_recipe(tmp_path / "plain", "")
    without = build(plain, opts(tmp_path, dry_run=True))
    extra = {k: dry.store_report[k] - without.store_report[k]
             for k in ("written_objects", "written_bytes")}
    assert extra == {"written_objects": len(EXPECTED),
                     "written_bytes": sum(len(t.encode()) for t in EXPECTED.values())}
    assert not (tmp_path / "store").exists() and not (tmp_path / "out").exists()
    build(project, opts(tmp_path))
    warm = build(project, opts(tmp_path, dry_run=True, force=True))
    assert warm.store_report["written_objects"] == 0


@pytest.mark.parametrize("layout", [
    "{name: ge, external_weight: combined, constants: file-constant, size_threshold: 64}",
    "{name: ge-separate, external_weight: separate, constants: file-constant}",
    "{name: split, external_weight: combined, split: scenario, size_threshold: 64}",
    "{name: split-separate, external_weight: separate, split: scenario, size_threshold: 64}",
    "{name: shared, external_weight: combined, combined: shared, alignment: 4096}",
])
def test_every_other_layout_ships_them_too(layout, encoder_model, save_model, tmp_path):
    save_model(encoder_model, "models/encoder.onnx")
    write_tree(tmp_path / "hf", OPTIMUM)
    recipe = write_recipe(tmp_path, "  - {source: hf, path: .}\n", layouts=f"\n  - {layout}\n",
                          extra="devices:\n  - {name: cpu}\n")
    package = build(recipe, opts(tmp_path)).packages[0]
    for path, text in OPTIMUM.items():
        assert (package.path / path).read_bytes() == text.encode()
    assert package.summary["devices"][0]["companions"] == package.summary["companions"]
    assert verify_package(package.path, store=tmp_path / "store").ok


def test_an_unchanged_build_is_decided_by_its_stamp(project, tmp_path, monkeypatch):
    """A no-op build with companion files parses no recipe (the build stamp records what
    each companion source gave); any change to a source falls through to the full check."""
    from weightstore.recipe import schema

    build(project, opts(tmp_path))
    calls = record_calls(monkeypatch, schema, "load_recipe_bytes")
    assert [p.status for p in build(project, opts(tmp_path)).packages] == ["up-to-date"] * 3
    assert calls == []
    (tmp_path / "hf" / "extra.json").write_text("{}")  # a file added to a folder
    with pytest.raises(PackageError):
        build(project, opts(tmp_path))
    assert len(calls) == 1
    (tmp_path / "hf" / "extra.json").unlink()
    config = tmp_path / "hf" / "config.json"
    data = bytearray(config.read_bytes())
    data[3] ^= 0x01  # same size, other bytes
    config.write_bytes(bytes(data))
    with pytest.raises(PackageError):
        build(project, opts(tmp_path))
    assert len(calls) == 2
    data[3] ^= 0x01
    config.write_bytes(bytes(data))
    os.symlink(tmp_path / "classic" / "LICENSE", tmp_path / "hf" / "LICENSE")
    with pytest.raises(RecipeError):
        build(project, opts(tmp_path))
    assert len(calls) == 3
    (tmp_path / "hf" / "LICENSE").unlink()
    assert [p.status for p in build(project, opts(tmp_path)).packages] == ["up-to-date"] * 3


def test_bundle_refuses_a_record_whose_companions_are_not_the_summarys(runtime, tmp_path,
                                                                       capsys):
    # the summary is what every byte is checked against: a device record edited to
    # name other bytes (and those bytes put in place) is not the package's
    folder = build(runtime, opts(tmp_path)).packages[0].path
    own = folder / "devices" / "npu" / "genai_config.json"
    own.write_bytes(b'{"filename": "other.onnx"}')
    path = folder / "devices" / "npu" / "bundle.json"
    record = json.loads(path.read_text())
    for c in record["companions"]:
        if c["path"] == "genai_config.json":
            c["size"] = own.stat().st_size
            c["digest"] = make_key("blake3", digest_file("blake3", own))
    path.write_text(json.dumps(record))
    out = tmp_path / "npu-folder"
    assert main(["bundle", str(folder), "npu", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "devices/npu/bundle.json" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_bundle_refuses_an_edited_device_model(runtime, tmp_path, capsys):
    # the folder's models are made from the device's: their bytes are the summary's
    import onnx

    folder = build(runtime, opts(tmp_path)).packages[0].path
    path = folder / "devices" / "npu" / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    model.doc_string = "edited"
    onnx.save(model, str(path))
    out = tmp_path / "npu-folder"
    assert main(["bundle", str(folder), "npu", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.onnx" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_check_of_a_device_verifies_the_companions_its_runtime_opens(runtime, tmp_path,
                                                                      capsys):
    # the device's own files (a package's devices/<d>/<path>, a device folder's root) are
    # what its runtime opens: check --device / of a device folder verifies those
    from weightstore.packaging.check import check_package

    folder = build(runtime, opts(tmp_path)).packages[0].path
    out = tmp_path / "npu-folder"
    assert main(["bundle", str(folder), "npu", "--output", str(out)]) == 0
    for where in (folder / "devices" / "npu", out):
        own = where / "npu_options.json"
        own.write_bytes(b"[]")
    report = check_package(folder, device="npu", verify=True)
    assert report.problems == ["companion file devices/npu/npu_options.json differs from "
                               "its digest"]
    assert check_package(out, verify=True).problems == [
        "companion file npu_options.json differs from its digest"]
    assert check_package(folder, device="cpu", verify=True).ok
    (out / "tokenizer.json").unlink()
    assert "companion file tokenizer.json is missing" in check_package(out).problems


def test_colliding_judges_each_path_against_the_taken_and_the_earlier_ones():
    """The one pass a build makes over a folder's thousands of files: each path against
    the models' files (``taken``, not judged among themselves) and the paths before it,
    as :func:`collision` judges one path."""
    from weightstore.recipe.companions import colliding, collision

    models = ["encoder.onnx", "encoder.onnx", "sub/m.onnx"]
    assert colliding(["a", "b/c", "d"], models) is None
    assert colliding(["a", "Encoder.ONNX"], models) == (1, "encoder.onnx")
    assert colliding(["a", "sub"], models) == (1, "sub/m.onnx")
    assert colliding(["x/y", "X"], models) == (1, "x/y")
    assert colliding(["x", "x/y"]) == (1, "x")
    paths = [f"f{i}/g" for i in range(3000)] + ["F2999"]
    assert colliding(paths, models) == (3000, "f2999/g")
    assert collision("F2999", paths[:3000]) == "f2999/g"
