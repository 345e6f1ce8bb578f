"""A single-file model over protobuf's 2 GiB limit: catalogued, built and run.

Needs about 7 GB of disk and a minute, so it runs only with WEIGHTSTORE_LARGE_TESTS=1
(CI sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from .samples import _large_chain, write_large_single_file

pytestmark = [
    pytest.mark.large,
    pytest.mark.skipif(os.environ.get("WEIGHTSTORE_LARGE_TESTS") != "1",
                       reason="set WEIGHTSTORE_LARGE_TESTS=1 to run"),
]

SIZE = int(2.2 * 2**30)
TENSOR = 128 << 20
MB = 1 << 20


def test_over_2gib_single_file(tmp_path):
    src = write_large_single_file(tmp_path / "big.onnx", SIZE, tensor_bytes=TENSOR)
    assert src.stat().st_size > 2**31
    report = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import json, resource
            from weightstore.catalogue.reader import read_catalogue
            from weightstore.catalogue.descriptors import weight_descriptors
            with read_catalogue({str(src)!r}) as c:
                total = sum(w.nbytes for w in weight_descriptors(c))
            print(json.dumps({{"bytes": total,
                "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
        """)], capture_output=True, text=True, check=True)
    catalogued = json.loads(report.stdout)
    assert catalogued["bytes"] > 2**31
    assert catalogued["rss"] <= 256 * MB

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""
        package: big
        version: "1"
        store: {{path: {tmp_path / 'store'}}}
        models: [{{name: m, source: {src}}}]
        layouts: [{{name: c, external_weight: combined}}]
        output: {tmp_path / 'out'}
    """))
    build = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import json, resource
            from weightstore.builder import build, BuildOptions
            result = build({str(recipe)!r}, BuildOptions(jobs=2))
            print(json.dumps({{"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                               "path": str(result.packages[0].path)}}))
        """)], capture_output=True, text=True, check=True)
    built = json.loads(build.stdout)
    assert built["rss"] <= 300 * MB
    src.unlink()  # the package must stand on its own

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(os.path.join(built["path"], "m.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    model, makers = _large_chain(SIZE, 0, TENSOR)
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(3).standard_normal((1, width)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = x
    for make in makers:
        table = make()
        expected = np.tanh(expected + (expected @ table.T).mean(axis=1, keepdims=True))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
