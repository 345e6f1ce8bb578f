"""An int4 scenario against onnxruntime's own weight-only quantizer, on a transformer of
more than 100 MB.

Usage: ``python bench/quantize.py [--runs 5] [--layers 8] [--workdir DIR] [--keep] [--json]``

The model: a BERT-like encoder generated with the exporter shapes of
``tests.samples.make_encoder`` (a 30522-word vocabulary, ``--layers`` layers of hidden
512, 8 heads, ffn 2048: about 165 MB in about 200 initializers, Constant nodes with
typed fields, an ``If``, a local function), saved as one ``.onnx`` file. The scenario: the
settings of onnxruntime-genai's ``-p int4 -e cpu`` (``quantize-weights``, 4 bits, blocks
of 32, symmetric, accuracy level 4, every MatMul), a ``cpu`` and a ``cpu-int4`` device.

Figures, side by side in one run:

- **(a) build against the quantizer.** A cold ``weightstore build`` of the package (an
  empty store and output: the fp32 weights stored, every MatMul weight quantized by
  onnxruntime's kernels, the package written) against ``python -m
  onnxruntime.quantization.matmul_nbits_quantizer`` with the same settings over the same
  file (load, quantize, save the int4 model), each a whole process started once the disk
  has written back what came before (``sync``), in ``--runs`` interleaved rounds after a
  warm-up round that is not counted. Medians; target: build / quantizer <= 1.0. CPU time
  (user + system) beside it.
- **(b) warm rebuild.** The package folder removed, the store kept, built again: the
  int4 weights come from the store. Its median time, and how many times onnxruntime's
  quantization kernel ran in it (counted in the process by wrapping
  ``quantize_matmul_4bits``; the cold build's count beside it): target 0.
- **(c) ``pull --device cpu-int4``** from a real registry (``docker-registry``) into an
  empty store and folder: the bytes it downloads against the device's live bytes
  (``bundle.json``): target <= 1.1. The fp32 device's pull beside it.
- **(d) the store against two exports.** The store's bytes after the cold build (fp32
  and int4 weights, records, indexes) against the fp32 model file plus the quantizer's
  int4 model and its external data: target <= 1.0 (shown with the bytes of each).

Run as ``python bench/quantize.py``; needs onnxruntime and the ``docker-registry`` binary
(Debian's CNCF distribution registry). A measurement, not a gate: the exit code is 0
whatever the figures.
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
from harness import MB, Target

sys.path.insert(0, str(harness.REPO))

from tests.registry_server import BINARY, RegistryServer

PASS = {"name": "quantize-weights", "bits": 4, "block_size": 32, "symmetric": True,
        "accuracy_level": 4}
QUANTIZER = ["-m", "onnxruntime.quantization.matmul_nbits_quantizer", "--block_size", "32",
             "--symmetric", "True", "--accuracy_level", "4"]
DEVICES = ("cpu", "cpu-int4")

# weightstore's command line with onnxruntime's quantization kernel counted: the count of
# its calls is the last line of stdout
COUNTED = r"""
import sys
import onnxruntime.capi._pybind_state as ort
calls = [0]
kernel = ort.quantize_matmul_4bits
def counted(*args):
    calls[0] += 1
    return kernel(*args)
ort.quantize_matmul_4bits = counted
from weightstore.cli import main
code = main(sys.argv[1:])
print(f"quantized {calls[0]}", flush=True)
sys.exit(code)
"""

GENERATE = r"""
import sys
from pathlib import Path
import onnx
sys.path.insert(0, sys.argv[3])
from tests.samples import make_encoder
model = make_encoder(vocab=30522, hidden=512, heads=8, layers=int(sys.argv[2]), ffn=2048,
                     max_seq=512, name="bench-quantize")
onnx.save(model, sys.argv[1])
"""


def make_model(workdir: Path, layers: int) -> Path:
    path = workdir / f"encoder-{layers}.onnx"
    if not path.exists():
        harness.log(f"generating the encoder ({layers} layers) ...")
        harness.run_process([sys.executable, "-c", GENERATE, str(path), str(layers),
                             str(harness.REPO)], workdir, "generate")
    return path


def write_recipe(folder: Path, model: Path) -> Path:
    """The package's recipe (JSON is YAML), its store and output below ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "recipe.yaml"
    recipe.write_text(json.dumps({
        "package": "encoder", "version": "1", "store": {"path": str(folder / "store")},
        "models": [{"name": "encoder", "source": str(model),
                    "scenarios": [{"name": "int4", "passes": [PASS]}]}],
        "layouts": [{"name": "release", "external_weight": "combined"}],
        "devices": [{"name": "cpu"}, {"name": "cpu-int4", "scenario": "int4"}],
        "output": str(folder / "out")}))
    return recipe


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _settled(argv: list[str], workdir: Path, name: str) -> harness.Process:
    """A measured process started with nothing left to write back."""
    os.sync()
    return harness.run_process(argv, workdir, name)


def _build(recipe: Path, workdir: Path, name: str) -> tuple[harness.Process, int]:
    """``weightstore build`` in a fresh process; it and its kernel calls."""
    proc = _settled([sys.executable, "-c", COUNTED, "build", str(recipe), "--jobs", "2"],
                    workdir, name)
    last = proc.output.strip().splitlines()[-1]
    if not last.startswith("quantized "):
        raise harness.BenchError(f"no kernel count in the build's output: {last!r}")
    return proc, int(last.split()[1])


def timings(workdir: Path, model: Path, recipe: Path, runs: int) -> dict[str, Any]:
    """Interleaved rounds of cold build, quantizer and warm rebuild."""
    folder = recipe.parent
    quantized = workdir / "quantizer"
    seconds: dict[str, list[float]] = {k: [] for k in ("cold", "quantizer", "warm")}
    cpu: dict[str, list[float]] = {k: [] for k in seconds}
    counts: dict[str, list[int]] = {"cold": [], "warm": []}
    def cold() -> harness.Process:
        shutil.rmtree(folder / "store", ignore_errors=True)
        shutil.rmtree(folder / "out", ignore_errors=True)
        proc, n = _build(recipe, workdir, "cold")
        counts["cold"].append(n)
        return proc

    def reference() -> harness.Process:
        shutil.rmtree(quantized, ignore_errors=True)
        quantized.mkdir()
        return _settled([sys.executable, *QUANTIZER, "--input_model", str(model),
                         "--output_model", str(quantized / "model.onnx")], workdir,
                        "quantizer")

    def warm() -> harness.Process:  # the package folder removed, the store kept
        shutil.rmtree(folder / "out")
        proc, n = _build(recipe, workdir, "warm")
        counts["warm"].append(n)
        return proc

    for i in range(-1, runs):  # round -1 warms the caches (bytecode, page cache)
        harness.log(f"round {i + 1}/{runs}" if i >= 0 else "warm-up round")
        order = (("cold", cold), ("quantizer", reference)) if i % 2 == 0 else (
            ("quantizer", reference), ("cold", cold))
        for name, step in (*order, ("warm", warm)):
            proc = step()
            if i >= 0:
                seconds[name].append(proc.seconds)
                cpu[name].append(proc.cpu_seconds)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {"seconds": seconds, "cpu_seconds": cpu, "median": med, "median_cpu": med_cpu,
            "kernel_calls": counts, "quantizer_bytes": folder_bytes(quantized),
            "store_bytes": folder_bytes(folder / "store"),
            "build_ratio": med["cold"] / med["quantizer"],
            "build_cpu_ratio": med_cpu["cold"] / med_cpu["quantizer"]}


def pulls(workdir: Path, recipe: Path) -> dict[str, Any]:
    """Push the package to a fresh registry; pull each device into an empty store."""
    from weightstore.registry.pull import pull
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    folder = recipe.parent
    package = next((folder / "out").rglob("summary.json")).parent
    registry = workdir / "registry"
    shutil.rmtree(registry, ignore_errors=True)
    registry.mkdir()
    server = RegistryServer(registry).start()
    found: dict[str, Any] = {}
    try:
        ref = f"{server.host}/bench/encoder:1"
        push(package, ref, store=WeightStore(folder / "store"))
        for device in DEVICES:
            out, store = workdir / f"pulled-{device}", workdir / f"pull-store-{device}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
            report = pull(ref, out, store=WeightStore(store), device=device)
            record = json.loads((out / "bundle.json").read_text())
            live = sum(m["live_bytes"] for m in record["models"])
            found[device] = {"received_bytes": report.received_bytes, "live_bytes": live,
                             "folder_bytes": folder_bytes(out),
                             "ratio": report.received_bytes / live}
    finally:
        server.stop()
    found["package_bytes"] = folder_bytes(package)
    return found


def run(workdir: Path, layers: int, runs: int) -> dict[str, Any]:
    if BINARY is None:
        raise harness.BenchError("docker-registry is not installed")
    model = make_model(workdir, layers)
    recipe = write_recipe(workdir / "package", model)
    times = timings(workdir, model, recipe, runs)
    harness.log("pull --device ...")
    return {"runs": runs, "layers": layers, "model_bytes": model.stat().st_size,
            "times": times, "pulls": pulls(workdir, recipe)}


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    t, p = data["times"], data["pulls"]
    exports = data["model_bytes"] + t["quantizer_bytes"]
    targets = [
        Target("(a) cold build / quantizer (wall)", t["build_ratio"], 1.0, 3),
        Target("(a) cold build / quantizer (CPU)", t["build_cpu_ratio"], None, 3),
        Target("(b) warm rebuild: kernel calls (max)", max(t["kernel_calls"]["warm"]), 0.0, 0),
        Target("(b) cold build: kernel calls", t["kernel_calls"]["cold"][0], None, 0),
        Target("(b) warm rebuild / quantizer (wall)", t["median"]["warm"]
               / t["median"]["quantizer"], None, 3),
        Target("(c) pull --device cpu-int4: received / live", p["cpu-int4"]["ratio"], 1.1, 3),
        Target("(c) pull --device cpu: received / live", p["cpu"]["ratio"], None, 3),
        Target("(d) store / (fp32 + int4 exports)", t["store_bytes"] / exports, 1.0, 3)]
    summary = {"median_seconds": t["median"], "median_cpu_seconds": t["median_cpu"],
               "seconds": t["seconds"], "cpu_seconds": t["cpu_seconds"],
               "kernel_calls": t["kernel_calls"], "pulls": p, "runs": data["runs"],
               "model_bytes": data["model_bytes"], "quantizer_bytes": t["quantizer_bytes"],
               "store_bytes": t["store_bytes"]}
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    t, p = data["times"], data["pulls"]
    lines = [f"encoder of {data['layers']} layers, {data['model_bytes'] / MB:.1f} MB; "
             f"quantizer's int4 export {t['quantizer_bytes'] / MB:.1f} MB; store after the "
             f"cold build {t['store_bytes'] / MB:.1f} MB; package {p['package_bytes'] / MB:.1f} MB",
             *harness.median_lines(data["runs"], t["median"], t["median_cpu"])]
    lines += [f"pull --device {d}: received {p[d]['received_bytes'] / MB:.2f} MB, live "
              f"{p[d]['live_bytes'] / MB:.2f} MB, folder {p[d]['folder_bytes'] / MB:.2f} MB"
              for d in DEVICES]
    lines += ["", *harness.target_table(targets, "figure", 48, 10)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    harness.add_common_arguments(parser, "the model, the package, stores and a registry")
    args = parser.parse_args(argv)
    return harness.measure(args, lambda w: run(w, args.layers, args.runs), figures, report)


if __name__ == "__main__":
    sys.exit(main())
