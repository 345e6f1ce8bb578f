"""Many models in one recipe: bytes and time of a shared combined file against per-model
files, a rebuild after one model changed, and a build under a 64-file limit.

Usage: ``python bench/many_models.py [--models 40] [--model-mb 8] [--runs 3]
[--workdir DIR] [--keep] [--json]``

The models are generated once (in a subprocess, cached in the workdir): ``--models``
models of ``--model-mb`` MB (10^6 bytes) of float32 weights each; half of each model's
bytes are an embedding table identical in every model (a family of fine-tuned models),
the other half its own two MatMul weights. One recipe has two combined layouts,
``per-model`` (GE's: one ``<model>_weight_combined`` per model) and ``shared``
(``combined: shared``), alignment 512; each run selects one with ``--layout``.

Variants, each a fresh ``weightstore build`` process timed around the process with its
peak RSS, interleaved over ``--runs`` runs (the table gives the median):

* ``per-model cold``: a fresh store, ``--layout per-model``;
* ``shared cold``: a fresh store, ``--layout shared``;
* ``shared, one model changed``: a warm store, one model rewritten with other weights
  (a different one each run), ``--layout shared --force``;
* ``shared cold, ulimit -n 64``: as ``shared cold``, with the open-file limit at 64.

Bytes come from the packages' ``summary.json``: the weight files per-model writes, those
shared writes, and the unique payload bytes. The machine may be shared with other jobs:
figures are medians, and the ratios are taken within one run of this script.
The exit code is 0 whatever the figures (a measurement, not a gate), 2 if a build fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, BenchError, Target

PACKAGE = "family"

# Writes the models (or one model with other weights, when a seed is given) and prints
# their names as JSON. Kept in a child so that this process stays small (see harness).
GENERATE = """\
import json, sys
from pathlib import Path
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
folder, count, model_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
only, seed = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (None, 0)
hidden = 256
rows = max(1, model_bytes // 2 // (4 * hidden))            # the shared embedding table
side = max(1, model_bytes // 4 // (4 * hidden))              # each of the two own weights
table = np.random.default_rng(0).standard_normal((rows, hidden), dtype=np.float32)
names = []
for i in range(count) if only is None else [only]:
    rng = np.random.default_rng([i, seed])
    inits = [numpy_helper.from_array(table, "embedding"),
             numpy_helper.from_array(rng.standard_normal((hidden, side), dtype=np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((side, hidden), dtype=np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, f"m{i}", [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    name = f"m{i:03d}"
    onnx.save(model, str(folder / f"{name}.onnx.partial"))
    (folder / f"{name}.onnx.partial").replace(folder / f"{name}.onnx")
    names.append(name)
print(json.dumps(names))
"""

LIMITED = """\
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
from weightstore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def weightstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "weightstore", *args]


def make_models(workdir: Path, count: int, model_mb: int) -> tuple[Path, list[str]]:
    folder = workdir / f"models-{count}x{model_mb}mb"
    listing = folder / "names.json"
    if listing.exists():
        return folder, json.loads(listing.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    harness.log(f"generating {count} models of {model_mb} MB in {folder} ...")
    run = harness.run_process([sys.executable, "-c", GENERATE, str(folder), str(count),
                               str(model_mb * MB)], workdir, "generate")
    listing.write_text(run.output)
    return folder, json.loads(run.output)


def write_recipe(workdir: Path, folder: Path, names: list[str]) -> Path:
    lines = [f"package: {PACKAGE}", 'version: "1"', "store: {hash: blake3}", "models:"]
    lines += [f"  - {{name: {n}, source: {folder / (n + '.onnx')}}}" for n in names]
    lines += ["layouts:",
              "  - {name: per-model, external_weight: combined, alignment: 512}",
              "  - {name: shared, external_weight: combined, alignment: 512, "
              "combined: shared}",
              f"output: {workdir / 'out'}"]
    recipe = workdir / "recipe.yaml"
    recipe.write_text("\n".join(lines) + "\n")
    return recipe


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def build(workdir: Path, recipe: Path, store: Path, layout: str, log_name: str,
          *, limited: bool = False, force: bool = False) -> tuple[harness.Process, dict]:
    args = ["build", str(recipe), "--store", str(store), "--layout", layout, "--json"]
    args += ["--force"] if force else []
    argv = ([sys.executable, "-c", LIMITED, *args] if limited else weightstore(*args))
    run = harness.run_process(argv, workdir, log_name)
    try:
        package = json.loads(run.output)["packages"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchError(f"build printed no readable JSON ({exc}):\n{run.output}") from None
    if package["status"] != "built":
        raise BenchError(f"expected {layout} built, got {package['status']}")
    return run, package["summary"]


def measure(workdir: Path, count: int, model_mb: int, runs: int) -> dict[str, Any]:
    folder, names = make_models(workdir, count, model_mb)
    recipe = write_recipe(workdir, folder, names)
    times: dict[str, list[float]] = {}
    rss: dict[str, list[int]] = {}
    summaries: dict[str, dict] = {}

    def record(variant: str, run: harness.Process) -> None:
        times.setdefault(variant, []).append(run.seconds)
        rss.setdefault(variant, []).append(run.peak_rss)

    warm = workdir / "store-warm"
    _fresh(warm)
    build(workdir, recipe, warm, "shared", "warm-up")
    for i in range(runs):
        harness.log(f"run {i + 1}/{runs} ...")
        for layout in ("per-model", "shared"):
            store = workdir / f"store-{layout}"
            _fresh(store)
            _fresh(workdir / "out")
            os.sync()
            run, summaries[layout] = build(workdir, recipe, store, layout, layout)
            record(f"{layout} cold", run)
        changed = i % len(names)
        harness.run_process([sys.executable, "-c", GENERATE, str(folder), str(count),
                             str(model_mb * MB), str(changed), str(i + 1)], workdir,
                            "regenerate")
        os.sync()
        run, _ = build(workdir, recipe, warm, "shared", "changed", force=True)
        record("shared, one model changed", run)
        store = workdir / "store-limited"
        _fresh(store)
        _fresh(workdir / "out")
        os.sync()
        run, _ = build(workdir, recipe, store, "shared", "limited", limited=True)
        record("shared cold, ulimit -n 64", run)
    per_model, shared = summaries["per-model"]["totals"], summaries["shared"]["totals"]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "models": count, "model_mb": model_mb, "runs": runs,
        "seconds_median": med,
        "seconds_all": times,
        "peak_rss_mb_median": {k: statistics.median(v) / MB for k, v in rss.items()},
        "bytes": {"per_model_weight_files": per_model["weight_file_bytes"],
                  "shared_weight_file": shared["weight_file_bytes"],
                  "unique_payload_bytes": shared["unique_payload_bytes"],
                  "referenced_bytes": shared["referenced_bytes"],
                  "shared_padding": shared["padding_bytes"]},
        "ratios": {
            "shared / per-model bytes": shared["weight_file_bytes"]
            / per_model["weight_file_bytes"],
            "shared / per-model time": med["shared cold"] / med["per-model cold"],
            "one changed / cold (shared)": med["shared, one model changed"]
            / med["shared cold"],
            "ulimit 64 / unlimited (shared)": med["shared cold, ulimit -n 64"]
            / med["shared cold"],
        },
    }


def report(result: dict[str, Any]) -> list[str]:
    b = result["bytes"]
    lines = [f"{result['models']} models of {result['model_mb']} MB, half of each shared; "
             f"medians of {result['runs']} runs (a shared, noisy machine)", ""]
    lines.append(f"{'variant':<32}{'seconds':>10}{'peak RSS MB':>14}")
    for name, seconds in result["seconds_median"].items():
        lines.append(f"{name:<32}{seconds:>10.2f}"
                     f"{result['peak_rss_mb_median'][name]:>14.0f}")
    lines += ["", f"weight bytes: per-model {b['per_model_weight_files']:,}, shared "
              f"{b['shared_weight_file']:,}, unique payloads {b['unique_payload_bytes']:,} "
              f"(padding {b['shared_padding']:,})", ""]
    figures = [Target(name, value, 1.0 if name.startswith("shared / per-model b") else None)
               for name, value in result["ratios"].items()]
    lines += harness.target_table(figures, "ratio", 34, 10)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--model-mb", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    harness.add_common_arguments(parser, "the models, stores and packages")
    args = parser.parse_args(argv)
    result = harness.in_workdir(args.workdir, args.keep,
                                lambda w: measure(w, args.models, args.model_mb, args.runs))
    if result is None:
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(report(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
