"""The accuracy gate: a recipe's sample inputs, each scenario measured against the default
graph with onnxruntime, the figures in summary.json, bounds that fail the build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.errors import AccuracyError, PackageError, RecipeError
from weightstore.package.summary import check_structure

from .samples import make_encoder, sample_inputs

RECIPE = """\
package: pkg
version: "1.0.0"
store: {{path: store}}
samples: {samples}
models:
  - name: encoder
    source: encoder.onnx
    scenarios:
      - name: fused
        passes: [fuse-qkv, cleanup]
      - name: half
        passes: [cast-fp16, cleanup]
        bounds: {bounds}
layouts:
  - {{name: combined, external_weight: combined, size_threshold: 256}}
  - {{name: embedded, external_weight: embedded}}
devices:
  - {{name: gpu, scenario: half}}
output: out
"""
LOOSE = "{min_cosine: 0.99, max_abs: 0.5}"


def make_case(folder: Path, *, bounds: str = LOOSE, samples: str = "inputs.npz",
              seed: int = 4) -> Path:
    """The encoder, its samples (``seed``) and the recipe in ``folder``."""
    model = make_encoder(vocab=64, hidden=32, layers=1, seed=3)
    onnx.save(model, str(folder / "encoder.onnx"))
    np.savez(folder / "inputs.npz", **sample_inputs(model, seed=seed))
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(samples=samples, bounds=bounds))
    return recipe


def cli(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run([*prefix, sys.executable, "-m", "weightstore", *map(str, args)],
                          cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=600)


def summary_of(folder: Path, layout: str = "combined") -> dict:
    return json.loads((folder / "out" / "pkg" / "1.0.0" / layout / "summary.json")
                      .read_text())


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate")
    recipe = make_case(folder)
    result = build(recipe, BuildOptions(jobs=2))
    return folder, recipe, result


def test_figures_are_recorded_per_scenario_and_output(case):
    _, _, result = case
    summary = result.packages[0].summary
    assert summary["format_version"] == 6
    entries = {a["scenario"]: a for a in summary["accuracy"]}
    assert sorted(entries) == ["fused", "half"]
    digest = summary["accuracy"][0]["samples"]
    assert digest.startswith("blake3:")
    half, fused = entries["half"], entries["fused"]
    assert half["bounds"] == {"min_cosine": 0.99, "max_abs": 0.5}
    assert "bounds" not in fused
    assert [o["name"] for o in half["outputs"]] == ["hidden_states", "pooled"]
    for entry in (half, fused):
        assert entry["model"] == "encoder"
        for output in entry["outputs"]:
            assert 0.99 < output["cosine"] <= 1.0
            assert 0 <= output["max_abs"] < 0.5
            for figure in (output["cosine"], output["max_abs"]):
                assert float(f"{figure:.6g}") == figure  # 6 significant digits
    assert any(o["max_abs"] > 0 for o in half["outputs"])  # fp16 loses something
    # every layout records the same figures
    assert result.packages[1].summary["accuracy"] == summary["accuracy"]


def test_figures_are_what_onnxruntime_gives(case):
    """The recorded figures are the run of the default graph and of the scenario, as
    ``weightstore run --scenario`` resolves and loads them, compared in float64."""
    folder, _, result = case
    package = result.packages[0].path
    outputs = {}
    for scenario in (None, "half"):
        out = folder / f"run-{scenario}.npz"
        args = ["run", package, "--inputs", folder / "inputs.npz", "--output", out]
        done = cli(*args, *(["--scenario", scenario] if scenario else []), cwd=folder)
        assert done.returncode == 0, done.stderr
        with np.load(out) as npz:
            outputs[scenario] = {k: npz[k].astype(np.float64) for k in npz.files}
    half = next(a for a in result.packages[0].summary["accuracy"] if a["scenario"] == "half")
    for output in half["outputs"]:
        a, b = outputs[None][output["name"]].ravel(), outputs["half"][output["name"]].ravel()
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert output["cosine"] == pytest.approx(cosine, abs=1e-5)
        assert output["max_abs"] == pytest.approx(float(np.max(np.abs(a - b))), rel=1e-4)


def test_rebuilds_are_byte_identical_whatever_the_threads(case, tmp_path):
    """A second build elsewhere, on one CPU (onnxruntime's default thread count follows
    the CPUs a process may use), writes the same summary.json bytes."""
    folder, _, _ = case
    other = tmp_path / "again"
    other.mkdir()
    make_case(other)
    prefix = ("taskset", "-c", "0") if shutil.which("taskset") else ()
    done = cli("build", other / "recipe.yaml", "--jobs", "1", cwd=other, prefix=prefix,
               env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    for layout in ("combined", "embedded"):
        assert summary_of(other, layout)["accuracy"] == summary_of(folder, layout)["accuracy"]
        assert ((other / "out/pkg/1.0.0" / layout / "summary.json").read_bytes()
                == (folder / "out/pkg/1.0.0" / layout / "summary.json").read_bytes())


def test_an_unchanged_recipe_measures_nothing_and_new_samples_measure_again(tmp_path,
                                                                             monkeypatch):
    from weightstore.builder import accuracy

    from .helpers import record_calls

    recipe = make_case(tmp_path)
    first = build(recipe, BuildOptions(jobs=2))
    calls = record_calls(monkeypatch, accuracy, "measure_model")
    again = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
    assert calls == []
    model = onnx.load(str(tmp_path / "encoder.onnx"))
    np.savez(tmp_path / "inputs.npz", **sample_inputs(model, seed=11))
    with pytest.raises(PackageError, match="different build") as info:
        build(recipe, BuildOptions(jobs=2))
    assert "samples of model 'encoder'" in info.value.context["changed"]
    changed = build(recipe, BuildOptions(jobs=2, force=True))
    assert [p.status for p in changed.packages] == ["built", "built"]
    assert calls
    before, after = first.packages[0].summary, changed.packages[0].summary
    assert before["fingerprint"] != after["fingerprint"]
    assert before["accuracy"][0]["samples"] != after["accuracy"][0]["samples"]
    # the bounds are part of the build too
    recipe.write_text(recipe.read_text().replace(LOOSE, "{min_cosine: 0.98}"))
    with pytest.raises(PackageError) as info:
        build(recipe, BuildOptions(jobs=2))
    assert "bounds of scenario 'half'" in info.value.context["changed"]
    bounded = build(recipe, BuildOptions(jobs=2, force=True))
    half = next(a for a in bounded.packages[0].summary["accuracy"] if a["scenario"] == "half")
    assert half["bounds"] == {"min_cosine": 0.98}
    assert bounded.packages[0].summary["fingerprint"] != after["fingerprint"]


def test_a_missed_bound_fails_the_build_with_one_line(tmp_path):
    recipe = make_case(tmp_path, bounds="{max_abs: 1.0e-9}")
    done = cli("build", recipe, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in ("encoder", "half", "hidden_states", "max_abs", "1e-09"):
        assert word in lines[0]
    version = tmp_path / "out" / "pkg" / "1.0.0"
    assert not version.exists() or list(version.iterdir()) == []  # nothing half-published


def test_a_missed_cosine_bound_names_the_cosine(tmp_path):
    """Weights near fp16's smallest subnormals: cast to fp16, the product turns."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((64, 16)) * 1e-7).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "tiny.onnx"))
    np.savez(tmp_path / "x.npz", x=rng.standard_normal((4, 64)).astype(np.float32))
    (tmp_path / "recipe.yaml").write_text(
        "package: p\nversion: '1'\nstore: {path: store}\nsamples: x.npz\nmodels:\n"
        "  - name: tiny\n    source: tiny.onnx\n    scenarios:\n"
        "      - {name: half, passes: [cast-fp16], bounds: {min_cosine: 0.999}}\n"
        "layouts:\n  - {name: combined, external_weight: combined, size_threshold: 0}\n"
        "output: out\n")
    with pytest.raises(AccuracyError) as info:
        build(tmp_path / "recipe.yaml", BuildOptions(jobs=2))
    message = str(info.value)
    assert "model 'tiny' scenario 'half' output 'y': cosine" in message
    assert "below min_cosine 0.999" in message
    assert not (tmp_path / "out" / "p" / "1" / "combined").exists()


def test_per_model_samples_beat_the_top_level(tmp_path):
    recipe = make_case(tmp_path, samples="nothing-here.npz")
    text = recipe.read_text().replace("    source: encoder.onnx\n",
                                      "    source: encoder.onnx\n    samples: inputs.npz\n")
    recipe.write_text(text)
    result = build(recipe, BuildOptions(jobs=2))
    assert len(result.packages[0].summary["accuracy"]) == 2


def test_without_samples_the_summary_keeps_its_format(tmp_path):
    recipe = make_case(tmp_path)
    text = recipe.read_text().replace("samples: inputs.npz\n", "")
    recipe.write_text(text.replace(f"        bounds: {LOOSE}\n", ""))
    summary = build(recipe, BuildOptions(jobs=2)).packages[0].summary
    assert "accuracy" not in summary
    assert summary["format_version"] < 6


def _object_npz(path: Path) -> None:
    np.savez(path, input_ids=np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _bomb(path: Path) -> None:
    """A member whose header declares far more than the file holds."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("input_ids.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', "
                   b"'fortran_order': False, 'shape': (100000000000,), }" + b" " * 50 + b"\n")


@pytest.mark.parametrize("damage, words", [
    (lambda p, m: p.write_bytes(b"not a zip"), "npz"),
    (lambda p, m: _object_npz(p), "npz"),
    (lambda p, m: _bomb(p), "npz"),
    (lambda p, m: np.savez(p, **{**sample_inputs(m), "extra": np.zeros(2)}), "extra"),
    (lambda p, m: np.savez(p, input_ids=sample_inputs(m)["input_ids"]), "use_pooler"),
    (lambda p, m: np.savez(p, **{**sample_inputs(m),
                                 "input_ids": sample_inputs(m)["input_ids"].astype(np.int32)}),
     "int32"),
    (lambda p, m: np.savez(p, **{**sample_inputs(m),
                                 "input_ids": np.zeros((2, 3, 4), np.int64)}), "shape"),
])
def test_malformed_samples_are_refused(tmp_path, damage, words):
    recipe = make_case(tmp_path)
    model = onnx.load(str(tmp_path / "encoder.onnx"))
    damage(tmp_path / "inputs.npz", model)
    done = cli("build", recipe, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert words in lines[0] and "inputs.npz" in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "pkg" / "1.0.0" / "combined").exists()
    with pytest.raises(RecipeError):
        build(recipe, BuildOptions(jobs=2))


@pytest.mark.parametrize("bounds, words", [
    ("{min_cosine: 1.5}", "min_cosine"),
    ("{max_abs: -1.0}", "max_abs"),
    ("{max_rel: 0.1}", "max_rel"),
    ("{}", "bounds"),
])
def test_bounds_are_validated(tmp_path, bounds, words):
    recipe = make_case(tmp_path, bounds=bounds)
    with pytest.raises(RecipeError) as info:
        build(recipe, BuildOptions(jobs=2))
    assert words in str(info.value)


def test_bounds_without_samples_are_refused(tmp_path):
    recipe = make_case(tmp_path)
    recipe.write_text(recipe.read_text().replace("samples: inputs.npz\n", ""))
    with pytest.raises(RecipeError) as info:
        build(recipe, BuildOptions(jobs=2))
    assert "samples" in str(info.value)


@pytest.mark.parametrize("damage", [
    lambda s: s["accuracy"].append("x"),
    lambda s: s["accuracy"][0].pop("scenario"),
    lambda s: s["accuracy"][0]["outputs"][0].update(cosine="high"),
    lambda s: s["accuracy"][0].update(bounds={"min_cosine": "x"}),
    lambda s: s.update(format_version=5),
])
def test_verify_checks_the_figures_structure(case, damage):
    summary = json.loads(json.dumps(case[2].packages[0].summary))
    check_structure(summary, "summary.json")
    damage(summary)
    with pytest.raises(PackageError):
        check_structure(summary, "summary.json")


def test_report_shows_the_figures(case, tmp_path):
    folder, _, result = case
    page = tmp_path / "report.html"
    done = cli("report", result.packages[0].path, "--output", page, cwd=folder)
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    half = next(a for a in result.packages[0].summary["accuracy"] if a["scenario"] == "half")
    assert "min_cosine" in html and "hidden_states" in html
    for output in half["outputs"]:
        assert f"{output['cosine']:.6g}" in html
        assert f"{output['max_abs']:.6g}" in html


def test_diff_shows_changed_figures(case, tmp_path):
    folder, _, result = case
    other = tmp_path / "other"
    other.mkdir()
    make_case(other, seed=9)
    build(other / "recipe.yaml", BuildOptions(jobs=2))
    done = cli("diff", result.packages[0].path, other / "out/pkg/1.0.0/combined",
               cwd=folder)
    assert "accuracy" in done.stdout and "half" in done.stdout, done.stdout + done.stderr


def test_verify_refuses_a_summary_with_malformed_figures(case, tmp_path):
    """``weightstore verify`` reads the figures' structure like every reader: one line,
    exit 2, naming the key."""
    _, _, result = case
    copy = tmp_path / "package"
    shutil.copytree(result.packages[0].path, copy)
    done = cli("verify", copy, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((copy / "summary.json").read_text())
    summary["accuracy"][0]["outputs"][0]["max_abs"] = float("inf")
    (copy / "summary.json").write_text(json.dumps(summary))
    done = cli("verify", copy, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "accuracy[0].outputs[0].max_abs" in lines[0], done.stderr


def test_a_quantized_scenario_is_measured_and_gated(tmp_path):
    """Dynamic int8 (onnxruntime's quantize_dynamic form) loses more than fp16: its
    figures are recorded, a loose bound passes and a tight one fails the build."""
    recipe = make_case(tmp_path)
    text = recipe.read_text().replace("passes: [fuse-qkv, cleanup]",
                                      "passes: [quantize-dynamic, cleanup]\n"
                                      "        bounds: {min_cosine: 0.9}")
    recipe.write_text(text)
    summary = build(recipe, BuildOptions(jobs=2)).packages[0].summary
    int8 = next(a for a in summary["accuracy"] if a["scenario"] == "fused")
    half = next(a for a in summary["accuracy"] if a["scenario"] == "half")
    assert int8["bounds"] == {"min_cosine": 0.9}
    worst = max(o["max_abs"] for o in int8["outputs"])
    assert worst > max(o["max_abs"] for o in half["outputs"]) > 0
    recipe.write_text(text.replace("{min_cosine: 0.9}", f"{{max_abs: {worst / 2}}}"))
    done = cli("build", recipe, "--force", cwd=tmp_path)
    assert done.returncode == 2
    assert "scenario 'fused'" in done.stderr and "max_abs" in done.stderr
    assert summary_of(tmp_path)["accuracy"] == summary["accuracy"]  # the old one stays
