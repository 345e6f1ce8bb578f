"""``combined: shared``: one weight file for all the models of a package, each payload once."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.errors import PackageError, RecipeError
from weightstore.package.fingerprint import layout_fingerprint
from weightstore.package.summary import FORMAT_VERSION
from weightstore.recipe.schema import Layout, parse_recipe_text

from .samples import make_encoder, run_onnxruntime, sample_inputs
from .test_build import runnable, tree, write_recipe

LAYOUTS = """
  - {name: per-model, external_weight: combined, alignment: 512}
  - {name: shared, external_weight: combined, alignment: 512, combined: shared}
  - {name: shared-fc, external_weight: combined, combined: shared, constants: file-constant}
"""


@pytest.fixture
def pair_build(shared_pair, save_model, tmp_path):
    a, b = shared_pair
    paths = {"a": save_model(a, "a.onnx"), "b": save_model(b, "b.onnx")}
    recipe = write_recipe(tmp_path, paths, LAYOUTS)
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    return {p.layout: p for p in result.packages}, {"a": a, "b": b}, recipe


def _payloads(summary: dict) -> dict[str, int]:
    return {w["id"]: w["size"] for m in summary["models"] for w in m["external_weights"]}


def test_shared_file_holds_each_payload_once_aligned(pair_build):
    packages, _, _ = pair_build
    shared = packages["shared"]
    summary = shared.summary
    assert [f["name"] for f in summary["files"]] == ["pkg_weight_combined"]
    unique = _payloads(summary)
    placed: dict[str, tuple[int, int]] = {}
    for model in summary["models"]:
        for w in model["external_weights"]:
            assert w["location"] == "pkg_weight_combined"
            assert w["offset"] % 512 == 0
            # a payload both models use sits at one place, referenced twice
            assert placed.setdefault(w["id"], (w["offset"], w["size"])) == (w["offset"],
                                                                            w["size"])
    data = (shared.path / "pkg_weight_combined").read_bytes()
    assert len(data) == summary["files"][0]["size"]
    ranges = sorted(placed.values())
    assert all(o1 + s1 <= o2 for (o1, s1), (o2, _) in itertools.pairwise(ranges))
    t = summary["totals"]
    assert t["stored_payload_bytes"] == t["unique_payload_bytes"] == sum(unique.values())
    assert t["weight_file_bytes"] == sum(unique.values()) + t["padding_bytes"]
    assert t["dedup_saved_bytes"] > 0
    # per-model writes the shared payloads twice
    per_model = packages["per-model"].summary["totals"]
    assert per_model["weight_files"] == 2
    assert per_model["stored_payload_bytes"] > t["stored_payload_bytes"]
    assert per_model["stored_payload_bytes"] - t["stored_payload_bytes"] == t["dedup_saved_bytes"]


def test_shared_layout_runs_bit_identically(pair_build, tmp_path):
    packages, models, _ = pair_build
    for name, model in models.items():
        inputs = sample_inputs(model, seed=3)
        inputs["use_pooler"] = np.array(True)
        expected = run_onnxruntime(model, inputs)
        for layout in ("shared", "shared-fc"):
            package = packages[layout].path
            path = runnable(package, f"{name}.onnx", tmp_path)
            if layout == "shared":
                assert path == package / f"{name}.onnx"  # run straight from the package
                onnx.checker.check_model(str(path))
            actual = run_onnxruntime(path, inputs)
            for e, x in zip(expected, actual, strict=True):
                assert e.tobytes() == x.tobytes(), (layout, name)


def test_shared_layout_is_deterministic(shared_pair, save_model, tmp_path):
    a, b = shared_pair
    paths = {"a": save_model(a, "a.onnx"), "b": save_model(b, "b.onnx")}
    trees = []
    for jobs in (1, 4):
        folder = tmp_path / f"j{jobs}"
        folder.mkdir()
        recipe = write_recipe(folder, paths, LAYOUTS)
        build(recipe, BuildOptions(store=str(folder / "store"), jobs=jobs))
        trees.append(tree(folder / "out"))
    assert trees[0] == trees[1]


def test_format_version_and_fingerprint_follow_the_key(pair_build):
    packages, _, _ = pair_build
    per_model, shared = packages["per-model"].summary, packages["shared"].summary
    # a layout that does not use the key records no key (its fingerprint is unchanged);
    # every package is format 4, for its file digests and external data without them
    assert per_model["format_version"] == 4 and "combined" not in per_model["layout"]
    assert shared["format_version"] == 4 and shared["layout"]["combined"] == "shared"
    explicit = Layout(name="l", external_weight="combined", combined="per-model")
    implicit = Layout(name="l", external_weight="combined")
    fp = [layout_fingerprint(package="p", version="1", hash_algo="blake3", layout=x,
                             models=[]) for x in (explicit, implicit)]
    assert fp[0] == fp[1]
    assert "combined" not in implicit.record()


def test_shared_rebuild_is_up_to_date(pair_build):
    packages, _, recipe = pair_build
    before = tree(packages["shared"].path)
    again = build(recipe, BuildOptions(store=str(Path(recipe).parent / "store"), jobs=2))
    assert {p.layout: p.status for p in again.packages}["shared"] == "up-to-date"
    assert tree(packages["shared"].path) == before


@pytest.mark.parametrize("layout, message", [
    ("{name: l, external_weight: separate, combined: shared}",
     "applies only to external_weight: combined"),
    ("{name: l, external_weight: embedded, combined: per-model}",
     "applies only to external_weight: combined"),
    ("{name: l, external_weight: combined, split: scenario, combined: per-model}",
     "combined: per-model cannot apply"),
    ("{name: l, external_weight: combined, combined: both}", "Input should be"),
])
def test_recipe_refuses_combinations_that_cannot_work(layout, message):
    text = ("package: p\nversion: '1'\nmodels: [{name: m, source: m.onnx}]\n"
            f"layouts:\n  - {layout}\n")
    with pytest.raises(RecipeError, match=message) as info:
        parse_recipe_text(text, "r.yaml")
    assert info.value.context["key"] == "layouts[0].combined"
    assert info.value.context["line"] == 5


def test_split_layout_accepts_shared(tmp_path, save_model):
    """Split group files are shared by construction: ``shared`` writes the same files."""
    model = make_encoder()
    src = save_model(model, "enc.onnx")
    split = "\n  - {name: s, external_weight: combined, split: scenario%s}\n"
    outs = []
    for i, extra in enumerate(("", ", combined: shared")):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        recipe = write_recipe(folder, {"m": src}, split % extra)
        outs.append(build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
                    .packages[0])
    files = [{k: v for k, v in tree(p.path).items() if k.endswith(".data")} for p in outs]
    assert files[0] == files[1] and files[0]
    assert json.loads((outs[1].path / "summary.json").read_text())["format_version"] == 4


def test_package_of_a_newer_format_is_refused(pair_build):
    packages, _, recipe = pair_build
    summary_path = packages["shared"].path / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["format_version"] = FORMAT_VERSION + 1
    summary_path.write_text(json.dumps(summary))
    store = str(Path(recipe).parent / "store")
    with pytest.raises(PackageError, match="format this weightstore does not know") as info:
        build(recipe, BuildOptions(store=store, jobs=2))
    assert info.value.context["format_version"] == FORMAT_VERSION + 1
    again = build(recipe, BuildOptions(store=store, jobs=2, force=True))
    assert {p.layout: p.status for p in again.packages}["shared"] == "built"
    assert json.loads(summary_path.read_text())["format_version"] == 4


def test_family_example_writes_the_documented_bytes(tmp_path):
    """recipes/tiny-bert-family.yaml, built from a copy pointing at the example models:
    the figures the first-package tutorial quotes for it."""
    repo = Path(__file__).resolve().parents[1]
    text = (repo / "recipes" / "tiny-bert-family.yaml").read_text()
    text = text.replace("../examples/", f"{repo / 'examples'}/")
    text = text.replace("output: ../dist", f"output: {tmp_path / 'dist'}")
    recipe = tmp_path / "family.yaml"
    recipe.write_text(text)
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    totals = {p.layout: p.summary["totals"] for p in result.packages}
    assert totals["release"]["weight_file_bytes"] == 2_738_176
    assert totals["shared"]["weight_file_bytes"] == 1_615_872
    assert totals["shared"]["unique_payload_bytes"] == 1_615_872
    page = (repo / "docs" / "tutorials" / "first-package.md").read_text()
    assert "2,738,176" in page and "1,615,872" in page
