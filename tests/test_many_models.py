"""Recipes with many models: bounded open files, partial builds, hashing only what changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main

from .samples import run_onnxruntime
from .test_build import tree

HIDDEN = 24  # 24 x 24 float32: 2304 bytes, above the default size threshold


def small_model(i: int, *, shared_weight: bool = True) -> onnx.ModelProto:
    """Two MatMuls and a bias; the first weight is the same in every model unless not
    ``shared_weight``."""
    rng = np.random.default_rng(i)
    first = np.random.default_rng(10_000 if shared_weight else 20_000 + i)
    shared = first.standard_normal((HIDDEN, HIDDEN), dtype=np.float32)
    inits = [numpy_helper.from_array(shared, "w0"),
             numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32),
                                     "w1"),
             numpy_helper.from_array(rng.standard_normal((HIDDEN,), dtype=np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["h1"]),
             helper.make_node("Add", ["h1", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, f"m{i}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def write_many(folder: Path, count: int, layouts: str, *, shared_weight: bool = True,
               ) -> Path:
    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    lines = ["package: many", 'version: "1"', f"store: {{path: {folder / 'store'}}}",
             "models:"]
    for i in range(count):
        onnx.save(small_model(i, shared_weight=shared_weight), str(models / f"m{i:03d}.onnx"))
        lines.append(f"  - {{name: m{i:03d}, source: models/m{i:03d}.onnx}}")
    recipe = folder / "recipe.yaml"
    recipe.write_text("\n".join(lines) + "\nlayouts:" + layouts + "output: out\n")
    return recipe


MANY_LAYOUTS = """
  - {name: per-model, external_weight: combined}
  - {name: shared, external_weight: combined, combined: shared}
  - {name: separate, external_weight: separate}
"""

LIMITED_BUILD = textwrap.dedent("""
    import resource, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    from weightstore.cli import main
    sys.exit(main(["build", sys.argv[1], "--jobs", "4", "--json", *sys.argv[2:]]))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_200_models_build_under_64_open_files(tmp_path):
    """One combined file per model: 200 sources and 200 weight files, built and then
    rebuilt from the payload-key cache (sampled checks, copies from the sources)."""
    recipe = write_many(tmp_path, 200, "\n  - {name: per-model, external_weight: combined}\n")
    runs = []
    for extra in ([], ["--force"]):
        done = subprocess.run([sys.executable, "-c", LIMITED_BUILD, str(recipe), *extra],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout))
    first, again = runs
    package = first["packages"][0]
    assert package["status"] == again["packages"][0]["status"] == "built"
    totals = package["summary"]["totals"]
    assert totals["weight_files"] == 200
    assert totals["unique_payloads"] == 1 + 200  # w0 is shared, w1 differs, biases inline
    assert again["store_report"]["written_objects"] == 0
    assert again["packages"][0]["summary"] == package["summary"]
    # a few packaged models run, straight from their folder
    x = {"x": np.random.default_rng(0).standard_normal((2, HIDDEN), dtype=np.float32)}
    for i in (0, 117, 199):
        expected = run_onnxruntime(small_model(i), x)[0]
        actual = run_onnxruntime(Path(package["path"]) / f"m{i:03d}.onnx", x)[0]
        assert expected.tobytes() == actual.tobytes()


def test_parked_catalogue_reads_a_file_it_checks(tmp_path):
    from weightstore.convert.weights import ModelWeights
    from weightstore.errors import ModelError

    path = tmp_path / "m.onnx"
    onnx.save(small_model(1), str(path))
    os.utime(path, ns=(10**18, 10**18))  # a rewrite below cannot land in the same tick
    mw = ModelWeights.open(path)
    weight = mw.select(1024, "external-data")[0]
    expected = mw.read(weight)
    mw.park()
    assert mw.catalogue._fd is None
    assert mw.read(weight) == expected  # opened for this read alone
    with mw.opened():
        fd = mw.catalogue._fd
        with mw.opened():  # nested blocks share the open file
            assert mw.read(weight) == expected and mw.catalogue._fd == fd
        assert mw.read(weight) == expected
    assert mw.catalogue._fd is None
    onnx.save(small_model(2), str(path))  # replaced: the recorded byte ranges are stale
    with pytest.raises(ModelError, match="changed since the build catalogued it"), \
            mw.opened():
        pass
    with pytest.raises(ModelError, match="changed since the build catalogued it"):
        mw.read(weight)
    mw.close()
    with pytest.raises(ModelError, match="closed"):
        mw.read(weight)


class HashedBytes:
    """Bytes hashed from each source file: payload keys and whole-file content digests."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import weightstore.convert.weights as weights_module
        import weightstore.package.fingerprint as fingerprint_module

        self.payloads: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.derived: list[str] = []
        digest, file_digest = weights_module.ModelWeights.digest, fingerprint_module.digest_file

        def payload(mw, weight, algo):
            desc = weight.payload
            name = Path(desc.file).name
            self.payloads[name] = self.payloads.get(name, 0) + desc.length
            return digest(mw, weight, algo)

        def whole_file(algo, path, *args):
            name = Path(path).name
            self.files[name] = self.files.get(name, 0) + Path(path).stat().st_size
            return file_digest(algo, path, *args)

        monkeypatch.setattr(weights_module.ModelWeights, "digest", payload)
        monkeypatch.setattr(fingerprint_module, "digest_file", whole_file)

    def reset(self) -> None:
        self.payloads.clear()
        self.files.clear()
        self.derived.clear()


def count_derivations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scenario-derived weights computed from now on, one per compute."""
    import weightstore.scenarios.package as scenario_module

    names: list[str] = []
    compute = scenario_module.AddedWeight.bytes

    def counting(weight):
        names.append(weight.name)
        return compute(weight)

    monkeypatch.setattr(scenario_module.AddedWeight, "bytes", counting)
    return names


def test_changing_one_model_rehashes_only_that_model(tmp_path, monkeypatch):

    # source files just written are too fresh for the digest cache (timestamps could miss
    # a rewrite within the same tick); this test rewrites files seconds apart by design
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)
    # no payload shared between models: the payload-key cache proves a key two models
    # claim by hashing the second claim (see weightstore.caches.payload_keys)
    recipe = write_many(tmp_path, 5, MANY_LAYOUTS, shared_weight=False)
    hashed = HashedBytes(monkeypatch)
    build(recipe, BuildOptions(jobs=2))
    every = {f"m{i:03d}.onnx" for i in range(5)}
    assert set(hashed.payloads) == set(hashed.files) == every
    hashed.reset()
    onnx.save(small_model(99, shared_weight=False), str(tmp_path / "models" / "m002.onnx"))
    result = build(recipe, BuildOptions(jobs=2, force=True))
    assert [p.status for p in result.packages] == ["built"] * 3
    assert set(hashed.files) == {"m002.onnx"}
    assert hashed.payloads == {"m002.onnx": 2 * HIDDEN * HIDDEN * 4}  # w0 and w1, once
    hashed.reset()
    check = build(recipe, BuildOptions(jobs=2))  # hashes the new package files once
    assert [p.status for p in check.packages] == ["up-to-date"] * 3
    assert hashed.payloads == {}
    hashed.reset()
    again = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date"] * 3
    assert hashed.payloads == hashed.files == {}


def test_changed_model_alone_recomputes_its_scenario_weights(tmp_path, monkeypatch):
    """Weights a scenario derives (fp16 copies here) are found again by key for the models
    that did not change; the package equals one built from an empty store."""

    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)
    computed = count_derivations(monkeypatch)
    scenario = ", scenarios: [{name: half, passes: [cast-fp16, cleanup]}]}"
    layouts = ("\n  - {name: shared, external_weight: combined, combined: shared}"
               "\n  - {name: split, external_weight: combined, split: scenario}\n")
    recipe = write_many(tmp_path, 4, layouts, shared_weight=False)
    recipe.write_text(recipe.read_text().replace(".onnx}", ".onnx" + scenario))
    hashed = HashedBytes(monkeypatch)
    build(recipe, BuildOptions(jobs=2))
    assert len(computed) == 4 * 2  # w0 and w1 of each model in fp16
    computed.clear()
    hashed.reset()
    onnx.save(small_model(77, shared_weight=False), str(tmp_path / "models" / "m001.onnx"))
    build(recipe, BuildOptions(jobs=2, force=True))
    assert sorted(computed) == ["w0.fp16", "w1.fp16"]
    assert set(hashed.payloads) == set(hashed.files) == {"m001.onnx"}
    rebuilt = tree(tmp_path / "out")
    fresh = build(recipe, BuildOptions(store=str(tmp_path / "empty"), jobs=2, force=True))
    assert [p.status for p in fresh.packages] == ["built"] * 2
    assert tree(tmp_path / "out") == rebuilt


def test_build_part_of_a_recipe(tmp_path, capsys):
    recipe = write_many(tmp_path, 4, MANY_LAYOUTS)
    out = tmp_path / "out" / "many" / "1"
    assert main(["build", str(recipe), "--layout", "shared", "--model", "m003",
                 "--model", "m001", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["layout"] for p in report["packages"]] == ["shared"]
    summary = report["packages"][0]["summary"]
    assert [m["name"] for m in summary["models"]] == ["m001", "m003"]  # recipe order
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["shared"]
    assert sorted(p.name for p in (out / "shared").glob("*.onnx")) == ["m001.onnx",
                                                                      "m003.onnx"]
    # the other layouts, every model: the selected package stays as it was
    assert main(["build", str(recipe), "--layout", "per-model", "--layout",
                 "separate"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["per-model", "separate",
                                                                   "shared"]
    assert len(list((out / "per-model").glob("*.onnx"))) == 4
    capsys.readouterr()
    # the whole recipe is another build than the selection: replaced only with --force
    assert main(["build", str(recipe)]) == 2
    assert "different build" in capsys.readouterr().err
    assert main(["build", str(recipe), "--force"]) == 0
    assert len(list((out / "shared").glob("*.onnx"))) == 4


@pytest.mark.parametrize("args, message", [
    (["--model", "m01"], "--model 'm01' names no model of the recipe (4 models); "
                         "did you mean 'm001'?"),
    (["--layout", "release"], "--layout 'release' names no layout of the recipe (3 layouts)"),
    (["--model", "m000", "--layout", "nope"], "--layout 'nope' names no layout"),
])
def test_unknown_selection_is_a_one_line_error(tmp_path, capsys, args, message):
    recipe = write_many(tmp_path, 4, MANY_LAYOUTS)
    assert main(["build", str(recipe), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


def test_part_of_a_recipe_runs_on_devices_as_the_whole_would(tmp_path):
    """A device naming a scenario only a left-out model defines runs the default graph of
    the packaged models, as in the build of the whole recipe."""
    recipe = write_many(tmp_path, 2, "\n  - {name: c, external_weight: combined}\n")
    text = recipe.read_text().replace(
        "m000.onnx}", "m000.onnx, scenarios: [{name: half, passes: [cast-fp16, cleanup]}]}")
    recipe.write_text(text + "devices:\n  - {name: npu, scenario: half}\n"
                      "  - {name: any, scenario: auto}\n")
    part = build(recipe, BuildOptions(jobs=2, models=("m001",))).packages[0]
    device_part = {n: (part.path / "devices" / n / "m001.onnx").read_bytes()
                   for n in ("npu", "any")}
    bundle = json.loads((part.path / "devices/npu/bundle.json").read_text())
    assert [(m["name"], m["scenario"]) for m in bundle["models"]] == [("m001", None)]
    whole = build(recipe, BuildOptions(jobs=2, force=True)).packages[0]
    assert [m["name"] for m in whole.summary["models"]] == ["m000", "m001"]
    for name, data in device_part.items():
        assert (whole.path / "devices" / name / "m001.onnx").read_bytes() == data
    assert json.loads((whole.path / "devices/any/bundle.json").read_text())[
        "models"][0]["scenario"] == "half"
