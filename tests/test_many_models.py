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

from weightstore.build import BuildOptions, build
from weightstore.cli import main
from weightstore.samples import run_onnxruntime

HIDDEN = 24  # 24 x 24 float32: 2304 bytes, above the default size threshold


def small_model(i: int) -> onnx.ModelProto:
    """Two MatMuls and a bias; the first weight is the same in every model."""
    rng = np.random.default_rng(i)
    shared = np.random.default_rng(10_000).standard_normal((HIDDEN, HIDDEN), dtype=np.float32)
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


def write_many(folder: Path, count: int, layouts: str) -> Path:
    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    lines = ["package: many", 'version: "1"', f"store: {{path: {folder / 'store'}}}",
             "models:"]
    for i in range(count):
        onnx.save(small_model(i), str(models / f"m{i:03d}.onnx"))
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
    sys.exit(main(["build", sys.argv[1], "--jobs", "4", "--json"]))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_200_models_build_under_64_open_files(tmp_path):
    recipe = write_many(tmp_path, 200, MANY_LAYOUTS)
    done = subprocess.run([sys.executable, "-c", LIMITED_BUILD, str(recipe)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    packages = {p["layout"]: p for p in json.loads(done.stdout)["packages"]}
    assert [p["status"] for p in packages.values()] == ["built"] * 3
    per_model = packages["per-model"]["summary"]["totals"]
    shared = packages["shared"]["summary"]["totals"]
    assert per_model["weight_files"] == 200 and shared["weight_files"] == 1
    assert per_model["unique_payloads"] == shared["unique_payloads"] == 1 + 200  # w0 shared, w1 each; biases stay inline
    # a few packaged models run, straight from their folders
    x = {"x": np.random.default_rng(0).standard_normal((2, HIDDEN), dtype=np.float32)}
    for i in (0, 117, 199):
        expected = run_onnxruntime(small_model(i), x)[0]
        for layout in packages.values():
            actual = run_onnxruntime(Path(layout["path"]) / f"m{i:03d}.onnx", x)[0]
            assert expected.tobytes() == actual.tobytes()


def test_parked_catalogue_reads_only_inside_opened(tmp_path):
    from weightstore.convert.weights import ModelWeights
    from weightstore.errors import ModelError

    path = tmp_path / "m.onnx"
    onnx.save(small_model(1), str(path))
    os.utime(path, ns=(10**18, 10**18))  # a rewrite below cannot land in the same tick
    mw = ModelWeights.open(path)
    weight = mw.select(1024, "external-data")[0]
    expected = mw.read(weight)
    mw.park()
    with pytest.raises(ModelError, match="parked"):
        mw.read(weight)
    with mw.opened():
        with mw.opened():  # nested blocks share the open file
            assert mw.read(weight) == expected
        assert mw.read(weight) == expected
    with pytest.raises(ModelError, match="parked"):
        mw.read(weight)
    onnx.save(small_model(2), str(path))  # replaced: the recorded byte ranges are stale
    with pytest.raises(ModelError, match="changed since the build catalogued it"), \
            mw.opened():
        pass
    mw.close()
    with pytest.raises(ModelError, match="closed"):
        mw.read(weight)
