"""Measure resolution phase by phase, then load, against onnxruntime's own session creation.

Usage: ``python bench/resolve.py [--layers 12] [--small-mb 20] [--runs 5] [--workdir DIR]
[--keep] [--json]``

Two packages with the same graph and weights 10x apart are built once (in a subprocess,
cached in the workdir): a chain of ``--layers`` MatMul blocks (MatMul, Add bias, Relu) on a
``[4, d]`` input whose ``d`` gives ``--small-mb`` and 10x that many MB of weights, with an
``If(Equal(Gather(Shape(x), 0), 4))`` in front choosing between two projection branches
(the dead one's weight is dropped by constant-result analysis). ``weightstore build``
writes a combined, 4096-aligned layout with a ``cpu`` device, and ``weightstore prepare``
records onnxruntime's packed weights for it in the store. onnx's own external-data copy
of the same model (``onnx.save_model(..., save_as_external_data=True)``) is the baseline.

Every figure comes from fresh processes, ``--runs`` times, interleaved; medians are
reported (the machine is shared: expect noise). In each process:

* ``resolve``: ``weightstore.resolve(package, device="cpu")`` once, then five more times
  (the median of those is kept) with its phases timed separately (metadata parse;
  transformation and cleanup; shape and constant analysis; placement and kernel
  selection; cache resolution; payload closure); the first call's total is shown too (it
  pays one-time costs such as onnx's schema registry), and the weight files resolution
  opened (to show it reads 0 payload bytes);
* ``load-prepared``: resolve, then ``weightstore.load`` with the prepared companion;
  time from the resolved package to a ready session (and with resolution), and the bytes
  read against the manifest's live bytes;
* ``load-portable``: the same without prepared weights (packed at session creation);
* ``ort`` and ``ort-extended``: ``onnxruntime.InferenceSession(path)`` on onnx's
  external-data model (file-backed, the same weights), with default session options (as
  the portable load uses) and at the prepared companion's optimization level
  (``extended``, as the prepared load uses): the prepared ratio's baseline;
* ``imports``: the imports alone, for the RSS floor.

Targets: resolution reads 0 payload bytes; its time at 10x weights <= 1.1x its time at
1x; load bytes read / live bytes = 1.00; time to a ready session from the prepared
package <= 0.5x onnxruntime's own session creation; peak RSS (above the imports) <= 1.2x
the live weights. Also shown: CPU seconds of every thread beside wall time, onnxruntime's
own share of each load, and peak RSS above the resolved state (the load's own memory,
without resolution's). A measurement, not a gate: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target

DEFAULT_LAYERS, DEFAULT_SMALL_MB, DEFAULT_RUNS = 12, 20, 5
PHASES = {
    "metadata parse": ("parse",),
    "transformation and cleanup": ("replay", "transform", "cleanup"),
    "shape and constant analysis": ("inference", "fold-known"),
    "placement and kernel selection": ("placement",),
    "cache resolution": ("prepared",),
    "payload closure": ("closure",),
}

GENERATE = r'''
import sys
from pathlib import Path
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
folder, layers, d = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
folder.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
def w(name, shape, scale):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
def branch(name):
    return helper.make_graph([helper.make_node("MatMul", ["x", f"{name}.w"], [f"{name}.y"])],
                             name, [], [helper.make_tensor_value_info(f"{name}.y", 1, [4, d])],
                             initializer=[w(f"{name}.w", [d, d], d ** -0.5)])
def const(name, value):
    array = numpy_helper.from_array(np.array(value, np.int64), name)
    return helper.make_node("Constant", [], [name], value=array)
nodes = [helper.make_node("Shape", ["x"], ["s"]), const("zero", 0),
         helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0), const("four", 4),
         helper.make_node("Equal", ["batch", "four"], ["is4"]),
         helper.make_node("If", ["is4"], ["h0"], then_branch=branch("then"),
                          else_branch=branch("else"))]
inits = []
h = "h0"
for i in range(layers):
    inits += [w(f"l{i}.w", [d, d], d ** -0.5), w(f"l{i}.b", [d], 0.01)]
    nodes += [helper.make_node("MatMul", [h, f"l{i}.w"], [f"m{i}"]),
              helper.make_node("Add", [f"m{i}", f"l{i}.b"], [f"a{i}"]),
              helper.make_node("Relu", [f"a{i}"], [f"h{i + 1}"])]
    h = f"h{i + 1}"
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", 1, [4, d])],
                          [helper.make_tensor_value_info(h, 1, [4, d])], initializer=inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
onnx.save(model, str(folder / "source.onnx"))
ort_dir = folder / "onnx-external"
ort_dir.mkdir(exist_ok=True)
onnx.save_model(model, str(ort_dir / "model.onnx"), save_as_external_data=True,
                location="model.data", size_threshold=1024)
(folder / "recipe.yaml").write_text(f"""package: chain
version: "1"
store: {{path: {folder / 'store'}}}
models: [{{name: chain, source: {folder / 'source.onnx'}}}]
layouts: [{{name: release, external_weight: combined, alignment: 4096}}]
devices: [{{name: cpu, capabilities: {{device: cpu}}, scenario: null}}]
output: {folder / 'out'}
""")
'''

CHILD = r'''
import json, os, resource, sys, time
mode, package, store, ort_model = sys.argv[1:5]
import numpy, onnx, onnxruntime
import weightstore
import weightstore.load.prepared, weightstore.load.session, weightstore.resolve.api
import weightstore.resolve.binding, weightstore.resolve.prepared_cache, weightstore.store
import weightstore.package.summary
from weightstore.load import LoadReport, RecordingReader, WeightManager
from weightstore.resolve.prepared import PreparedOptions
out = {"rss_imports": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
if mode == "resolve":
    opened = []
    real_open = os.open
    def spy(path, *a, **k):
        opened.append(os.fspath(path))
        return real_open(path, *a, **k)
    os.open = spy
    start = time.perf_counter()
    r = weightstore.resolve(package, device="cpu", store=store)
    out["cold_seconds"] = time.perf_counter() - start
    out["cold_phases"] = {p.name: 0.0 for p in r.transformations.phases}
    for p in r.transformations.phases:
        out["cold_phases"][p.name] += p.seconds
    r.close()
    runs = []  # again in this process (first-call costs paid): the median of five
    for _ in range(5):
        start = time.perf_counter()
        r = weightstore.resolve(package, device="cpu", store=store)
        seconds = time.perf_counter() - start
        phases = {}
        for p in r.transformations.phases:
            phases[p.name] = phases.get(p.name, 0.0) + p.seconds
        runs.append((seconds, phases))
        r.close()
    os.open = real_open
    runs.sort(key=lambda item: item[0])
    out["seconds"], out["phases"] = runs[len(runs) // 2]
    out["weight_files_opened"] = [p for p in opened if not p.endswith(".onnx")]
    out["active_bytes"] = r.payload_manifest.active_bytes
    values = {v for e in r.payload_manifest.entries for v in e.values}
    out["dead_branch_dropped"] = "else.w" not in values
    out["bindings"] = sorted({b.selected for b in r.bindings})
elif mode in ("load-prepared", "load-portable"):
    options = PreparedOptions(records=mode == "load-prepared")
    reader = RecordingReader()
    report = LoadReport()
    start = time.perf_counter()
    r = weightstore.resolve(package, device="cpu", store=store, prepared=options)
    with open("/proc/self/statm") as f:  # resident now, before the load (Linux)
        out["rss_resolved"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    middle, cpu = time.perf_counter(), time.process_time()
    s = weightstore.load(r, reader=reader, report=report, manager=WeightManager())
    out["seconds"] = time.perf_counter() - middle  # from the resolved package
    out["cpu_seconds"] = time.process_time() - cpu  # every thread's
    out["with_resolve_seconds"] = time.perf_counter() - start
    out["read_bytes"] = reader.bytes_read
    out["runtime_seconds"] = report.runtime_seconds
    out["live_bytes"] = r.payload_manifest.active_bytes
    out["portable_live_bytes"] = sum(e.source.length for e in r.payload_manifest.active
                                     if e.origin == "portable")
    out["prepared"] = r.prepared_graph is not None
    x = numpy.random.default_rng(1).standard_normal((4, int(sys.argv[5]))).astype(numpy.float32)
    out["output"] = s.run(None, {"x": x})[0].tobytes().hex()[:64]
elif mode in ("ort", "ort-extended"):
    so = onnxruntime.SessionOptions()  # the options each load uses: default, or the
    if mode == "ort-extended":  # prepared companion's optimization level
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    start, cpu = time.perf_counter(), time.process_time()
    s = onnxruntime.InferenceSession(ort_model, so, providers=["CPUExecutionProvider"])
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu
    x = numpy.random.default_rng(1).standard_normal((4, int(sys.argv[5]))).astype(numpy.float32)
    out["output"] = s.run(None, {"x": x})[0].tobytes().hex()[:64]
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''


def dim_for(mb: float, layers: int) -> int:
    """The ``d`` whose ``layers + 2`` d x d float32 matrices hold ``mb`` MB."""
    return max(16, int((mb * MB / 4 / (layers + 2)) ** 0.5))


def make_package(workdir: Path, name: str, layers: int, d: int) -> Path:
    folder = workdir / name
    if not (folder / "out").is_dir():
        harness.log(f"generating {name} (d={d})")
        harness.run_process([sys.executable, "-c", GENERATE, str(folder), str(layers), str(d)],
                            workdir, f"generate-{name}")
        harness.run_process([sys.executable, "-m", "weightstore", "build",
                             str(folder / "recipe.yaml")], workdir, f"build-{name}")
        package = folder / "out" / "chain" / "1" / "release"
        harness.run_process([sys.executable, "-m", "weightstore", "prepare", str(package),
                             "--device", "cpu", "--store", str(folder / "store")], workdir,
                            f"prepare-{name}")
    return folder


def child(mode: str, folder: Path, d: int, workdir: Path) -> dict[str, Any]:
    package = folder / "out" / "chain" / "1" / "release"
    proc = harness.run_process([sys.executable, "-c", CHILD, mode, str(package),
                                str(folder / "store"),
                                str(folder / "onnx-external" / "model.onnx"), str(d)],
                               workdir, f"{mode}")
    return json.loads(proc.output.strip().splitlines()[-1])


def run_all(layers: int, small_mb: float, runs: int, workdir: Path) -> dict[str, Any]:
    sizes = {"1x": dim_for(small_mb, layers), "10x": dim_for(small_mb * 10, layers)}
    folders = {k: make_package(workdir, f"chain-{k}", layers, d) for k, d in sizes.items()}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {k: {} for k in sizes}
    for n in range(runs):
        harness.log(f"round {n + 1}/{runs}")
        for size, folder in folders.items():
            modes = ("resolve",) if size == "1x" else (
                "resolve", "load-prepared", "load-portable", "ort", "ort-extended")
            for mode in modes:
                results[size].setdefault(mode, []).append(child(mode, folder, sizes[size],
                                                                workdir))
    return {"sizes": sizes, "layers": layers, "runs": runs, "results": results}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _median_of(rows: list[dict[str, Any]], value: Any) -> float:
    return statistics.median(value(r) for r in rows)


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    res = data["results"]
    phase_ms = {}
    for size in ("1x", "10x"):
        rows = res[size]["resolve"]
        phase_ms[size] = {label: statistics.median(
            sum(r["phases"].get(p, 0.0) for p in names) for r in rows) * 1000
            for label, names in PHASES.items()}
        phase_ms[size]["total"] = _median(rows, "seconds") * 1000
        phase_ms[size]["first call in a process"] = _median(rows, "cold_seconds") * 1000
    big = res["10x"]
    prepared, portable, ort = big["load-prepared"], big["load-portable"], big["ort"]
    ort_ext = big["ort-extended"]
    live = prepared[0]["live_bytes"]
    portable_live = prepared[0]["portable_live_bytes"]
    floor = _median(big["resolve"], "rss_imports")
    summary = {
        "phase_ms": phase_ms,
        "resolution_weight_files_opened": max(len(r["weight_files_opened"])
                                              for s in ("1x", "10x") for r in res[s]["resolve"]),
        "dead_branch_dropped": all(r["dead_branch_dropped"] for r in big["resolve"]),
        "bindings": big["resolve"][0]["bindings"],
        "prepared_used": all(r["prepared"] for r in prepared),
        "load_prepared_s": _median(prepared, "seconds"),
        "load_portable_s": _median(portable, "seconds"),
        "load_prepared_runtime_s": _median(prepared, "runtime_seconds"),
        "load_portable_runtime_s": _median(portable, "runtime_seconds"),
        "resolve_and_load_prepared_s": _median(prepared, "with_resolve_seconds"),
        "ort_s": _median(ort, "seconds"),
        "ort_extended_s": _median(ort_ext, "seconds"),
        "cpu_prepared_s": _median(prepared, "cpu_seconds"),
        "cpu_portable_s": _median(portable, "cpu_seconds"),
        "cpu_ort_s": _median(ort, "cpu_seconds"),
        "cpu_ort_extended_s": _median(ort_ext, "cpu_seconds"),
        "live_bytes": live, "portable_live_bytes": portable_live,
        "read_ratio_prepared": _median(prepared, "read_bytes") / live,
        "read_ratio_portable": _median(portable, "read_bytes") / portable[0]["live_bytes"],
        "peak_rss_prepared": _median(prepared, "peak_rss"),
        "peak_rss_portable": _median(portable, "peak_rss"),
        "peak_rss_ort": _median(ort, "peak_rss"),
        "rss_imports": floor,
        "same_outputs": len({r["output"] for r in prepared + portable + ort + ort_ext}) == 1,
    }
    targets = [
        Target("resolution payload bytes read", 0.0 if summary[
            "resolution_weight_files_opened"] == 0 else float("nan"), 0.0, 0),
        Target("resolution time 10x / 1x weights",
               phase_ms["10x"]["total"] / phase_ms["1x"]["total"], 1.1),
        Target("load bytes read / live bytes (prepared)", summary["read_ratio_prepared"], 1.0),
        Target("load bytes read / live bytes (portable)", summary["read_ratio_portable"], 1.0),
        Target("ready session prepared / onnxruntime (same level)",
               summary["load_prepared_s"] / summary["ort_extended_s"], 0.5),
        Target("ready session prepared / onnxruntime (default options)",
               summary["load_prepared_s"] / summary["ort_s"], None),
        Target("  of it onnxruntime on the companion / onnxruntime",
               summary["load_prepared_runtime_s"] / summary["ort_extended_s"], None),
        Target("ready session portable / onnxruntime", summary["load_portable_s"]
               / summary["ort_s"], None),
        Target("CPU seconds prepared / onnxruntime (same level)",
               summary["cpu_prepared_s"] / summary["cpu_ort_extended_s"], None),
        Target("CPU seconds portable / onnxruntime",
               summary["cpu_portable_s"] / summary["cpu_ort_s"], None),
        Target("peak RSS above imports / live (prepared)",
               (summary["peak_rss_prepared"] - floor) / live, 1.2),
        Target("peak RSS above imports / portable weights (prepared)",
               (summary["peak_rss_prepared"] - floor) / portable_live, None),
        Target("peak RSS above imports / live (portable)",
               (summary["peak_rss_portable"] - floor) / summary["portable_live_bytes"], 1.2),
        Target("peak RSS above the resolved state / live (prepared)",
               _median_of(prepared, lambda r: r["peak_rss"] - r["rss_resolved"]) / live, None),
        Target("peak RSS above the resolved state / live (portable)",
               _median_of(portable, lambda r: r["peak_rss"] - r["rss_resolved"])
               / summary["portable_live_bytes"], None),
        Target("peak RSS above imports / weights (onnxruntime)",
               (summary["peak_rss_ort"] - floor) / summary["portable_live_bytes"], None),
    ]
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    s = data["sizes"]
    lines = [f"resolve benchmark: {data['layers']} MatMul layers, d = {s['1x']} (1x) and "
             f"{s['10x']} (10x), medians of {data['runs']} fresh processes (shared machine: "
             "noisy)", "", f"{'phase (ms)':<34}{'1x':>10}{'10x':>10}"]
    for label in [*PHASES, "total", "first call in a process"]:
        lines.append(f"{label:<34}{summary['phase_ms']['1x'][label]:>10.2f}"
                     f"{summary['phase_ms']['10x'][label]:>10.2f}")
    lines += ["", f"10x: live bytes {summary['live_bytes'] / MB:.1f} MB (portable "
              f"{summary['portable_live_bytes'] / MB:.1f} MB + packed), bindings "
              f"{summary['bindings']}, dead branch dropped {summary['dead_branch_dropped']}",
              f"ready session from the resolved package: prepared "
              f"{summary['load_prepared_s']:.3f} s (with resolution "
              f"{summary['resolve_and_load_prepared_s']:.3f} s), portable "
              f"{summary['load_portable_s']:.3f} s (of which onnxruntime creating the "
              f"session: prepared {summary['load_prepared_runtime_s']:.3f} s, portable "
              f"{summary['load_portable_runtime_s']:.3f} s); onnxruntime {summary['ort_s']:.3f} s "
              f"(default options), {summary['ort_extended_s']:.3f} s (extended, the "
              "prepared companion's level)",
              f"CPU seconds (all threads): prepared {summary['cpu_prepared_s']:.3f}, portable "
              f"{summary['cpu_portable_s']:.3f}, onnxruntime {summary['cpu_ort_s']:.3f} "
              f"(default), {summary['cpu_ort_extended_s']:.3f} (extended)",
              f"peak RSS: prepared {summary['peak_rss_prepared'] / MB:.0f} MB, portable "
              f"{summary['peak_rss_portable'] / MB:.0f} MB, onnxruntime "
              f"{summary['peak_rss_ort'] / MB:.0f} MB, imports {summary['rss_imports'] / MB:.0f}"
              f" MB; same outputs everywhere: {summary['same_outputs']}", ""]
    lines += harness.target_table(targets, "figure", 54, 10)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--small-mb", type=float, default=DEFAULT_SMALL_MB)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    harness.add_common_arguments(parser, "the generated packages and logs")
    args = parser.parse_args(argv)

    def work(workdir: Path) -> int:
        data = run_all(args.layers, args.small_mb, args.runs, workdir)
        summary, targets = figures(data)
        if args.json:
            print(json.dumps({"summary": summary, "targets": [t.as_json() for t in targets],
                              "sizes": data["sizes"]}, indent=2))
        else:
            print(report(data, summary, targets))
        return 0

    harness.in_workdir(args.workdir, args.keep, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
