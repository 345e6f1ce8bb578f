"""Measure resolution phase by phase, then load, against onnxruntime's own session creation.

Usage: ``python bench/resolve.py [--layers 12] [--small-mb 20] [--runs 5] [--workdir DIR]
[--keep] [--json]``

Two shapes, each built once (in a subprocess, cached in the workdir) as a package with a
combined, 4096-aligned layout and a ``cpu`` device, prepared by ``weightstore prepare``;
onnx's own external-data copy of the same model (``onnx.save_model(...,
save_as_external_data=True)``) is the baseline:

* ``chain``: ``--layers`` MatMul blocks (MatMul, Add bias, Relu) on a ``[4, d]`` input, with
  an ``If(Equal(Gather(Shape(x), 0), 4))`` in front choosing between two projection
  branches (the dead one's weight is dropped by constant-result analysis); two packages
  whose ``d`` gives ``--small-mb`` and 10x that many MB of weights (same graph), for the
  resolution scaling target;
* ``encoder``: a BERT-like encoder (``tests/samples.make_encoder``: word, position and
  token-type embeddings, 6 layers of LayerNorm, Q/K/V and output MatMuls with biases,
  attention, a GELU function, an FFN; Constants with typed fields; an ``If`` on a dynamic
  input; 95 initializers, 220 nodes) of about 10x ``--small-mb`` MB.

Every figure comes from fresh processes, ``--runs`` times, interleaved; medians are
reported (the machine is shared: expect noise). In each process:

* ``resolve``: ``weightstore.resolve(package, device="cpu")`` once, then nine more times
  (the median of those is kept; for the 10x chain, each in turn with the 1x chain's, so
  that their ratio is measured in one process) with its phases timed separately (metadata parse;
  transformation and cleanup; shape and constant analysis; placement and kernel
  selection; cache resolution; payload closure); the first call's total is shown too (it
  pays one-time costs such as onnx's schema registry), with the process's imports before
  it (what a fresh process pays up to its first resolution), and the weight files
  resolution opened (to show it reads 0 payload bytes);
* ``load-prepared``: resolve with the prepared records and default options, then
  ``weightstore.load``: the time from the resolved package to a ready session (and with
  resolution), bytes read against the manifest's live bytes, and onnxruntime's own share
  (``LoadReport.runtime_seconds``; the rest is reading, verifying and writing the bytes).
  On a runtime that packs every source even when a persisted packed form is supplied
  (onnxruntime 1.22 to 1.32, as ``weightstore prepare`` probes), resolution binds the
  portable weights and the load uses the companion's optimized graph with optimizations
  disabled;
* ``load-packed``: the same with ``PreparedOptions(prefer="in-order")``: the persisted
  packed forms are read and handed over, as the seed's order has it (what they cost);
* ``load-portable``: without prepared records (the plain graph, packed at creation);
* ``load-buffers``: the same with the package's weight files already in memory, given as
  caller buffers (peak RSS above the state with those buffers resident: the load's own);
* ``ort`` and ``ort-extended``: ``onnxruntime.InferenceSession(path)`` on onnx's
  external-data model (file-backed, the same weights), with default session options and
  at the companion's optimization level (``extended``);
* ``ort-prepacked``: onnxruntime's own route to persisted packed weights, without
  weightstore: the optimized model and the pre-packed data file it wrote itself
  (``session.save_external_prepacked_constant_initializers``, at ``extended``), which it
  maps itself, created with optimizations disabled: the floor for any loader of persisted
  packed forms on this runtime;
* ``imports``: the imports alone (numpy, onnxruntime and weightstore's modules; not onnx,
  which only weightstore would import: how many processes ran onnx's initialiser is
  reported), for the RSS floor.

Targets: resolution reads 0 payload bytes; its time at 10x weights <= 1.1x its time at
1x; load bytes read / live bytes = 1.00; time to a ready session from the prepared
package <= 0.5x onnxruntime's own session creation; peak RSS (above the imports) <= 1.2x
the live weights. Also shown: CPU seconds of every thread beside wall time, and peak RSS
above the resolved state (the load's own memory, without resolution's). A measurement, not
a gate: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target

DEFAULT_LAYERS, DEFAULT_SMALL_MB, DEFAULT_RUNS = 12, 20, 5
SHAPES = ("chain", "encoder")
LOAD_MODES = ("load-prepared", "load-packed", "load-portable", "load-buffers", "ort",
              "ort-extended", "ort-prepacked")
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
x = np.random.default_rng(1).standard_normal((4, d)).astype(np.float32)
np.savez(folder / "feed.npz", x=x)
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

GENERATE_ENCODER = r'''
import sys
from pathlib import Path
import numpy as np, onnx
sys.path.insert(0, sys.argv[3])
from tests.samples import make_encoder, sample_inputs
folder, hidden = Path(sys.argv[1]), int(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
model = make_encoder(vocab=8000, hidden=hidden, heads=12, layers=6, ffn=4 * hidden,
                     max_seq=512, name="encoder")
onnx.save(model, str(folder / "source.onnx"))
np.savez(folder / "feed.npz", **sample_inputs(model, batch=2, seq=64))
ort_dir = folder / "onnx-external"
ort_dir.mkdir(exist_ok=True)
onnx.save_model(model, str(ort_dir / "model.onnx"), save_as_external_data=True,
                location="model.data", size_threshold=1024)
(folder / "recipe.yaml").write_text(f"""package: encoder
version: "1"
store: {{path: {folder / 'store'}}}
models: [{{name: encoder, source: {folder / 'source.onnx'}}}]
layouts: [{{name: release, external_weight: combined, alignment: 4096}}]
devices: [{{name: cpu, capabilities: {{device: cpu}}, scenario: null}}]
output: {folder / 'out'}
""")
'''

CHILD = r'''
import json, os, resource, sys, time
mode, package, store, ort_model, feed_path = sys.argv[1:6]
imported = time.perf_counter()
import hashlib, numpy, onnxruntime
import weightstore
import weightstore.load.prepared, weightstore.load.session, weightstore.resolve.api
import weightstore.resolve.binding, weightstore.resolve.prepared_cache, weightstore.store
import weightstore.package.summary
from weightstore.load import LoadReport, RecordingReader, WeightManager
from weightstore.resolve.prepared import IN_ORDER, PreparedOptions
out = {"rss_imports": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
       "imports_seconds": time.perf_counter() - imported}
feed = dict(numpy.load(feed_path))
def digest(session):
    h = hashlib.sha256()
    for array in session.run(None, feed):
        h.update(array.tobytes())
    return h.hexdigest()[:32]
if mode == "resolve":
    opened = []
    real_open = os.open
    def spy(path, *a, **k):
        opened.append(os.fspath(path))
        return real_open(path, *a, **k)
    os.open = spy
    # cache=False: resolving, not the record the first call would keep for the next ones
    start = time.perf_counter()
    r = weightstore.resolve(package, device="cpu", store=store, cache=False)
    out["cold_seconds"] = time.perf_counter() - start
    r.close()
    pair = sys.argv[6:8]  # the same graph with other weights: resolved in turn with it
    if pair:
        weightstore.resolve(pair[0], device="cpu", store=pair[1], cache=False).close()
    runs, pair_runs = [], []  # again (first-call costs paid): the median of nine
    for _ in range(9):
        start = time.perf_counter()
        r = weightstore.resolve(package, device="cpu", store=store, cache=False)
        seconds = time.perf_counter() - start
        phases = {}
        for p in r.transformations.phases:
            phases[p.name] = phases.get(p.name, 0.0) + p.seconds
        runs.append((seconds, phases))
        r.close()
        if pair:
            start = time.perf_counter()
            weightstore.resolve(pair[0], device="cpu", store=pair[1], cache=False).close()
            pair_runs.append(time.perf_counter() - start)
    if pair:
        out["pair_seconds"] = sorted(pair_runs)[len(pair_runs) // 2]
    os.open = real_open
    runs.sort(key=lambda item: item[0])
    out["seconds"], out["phases"] = runs[len(runs) // 2]
    # the model and the package's JSON records (summary, device and prepared records)
    # are metadata: anything else opened would be a weight file
    out["weight_files_opened"] = [p for p in opened if not p.endswith((".onnx", ".json"))]
    out["active_bytes"] = r.payload_manifest.active_bytes
    values = {v for e in r.payload_manifest.entries for v in e.values}
    out["dead_branch_dropped"] = "else.w" not in values
    out["bindings"] = sorted({b.selected for b in r.bindings})
elif mode.startswith("load-"):
    options = PreparedOptions(records=mode in ("load-prepared", "load-packed"),
                              prefer=IN_ORDER if mode == "load-packed" else "cheaper")
    reader = RecordingReader()
    report = LoadReport()
    start = time.perf_counter()
    r = weightstore.resolve(package, device="cpu", store=store, prepared=options)
    buffers = {}
    if mode == "load-buffers":  # the weight files already in the caller's memory
        for name in {e.source.file for e in r.payload_manifest.active if e.source.file}:
            buffers[name] = numpy.fromfile(os.path.join(package, name), dtype=numpy.uint8)
    with open("/proc/self/statm") as f:  # resident now, before the load (Linux)
        out["rss_resolved"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    middle, cpu = time.perf_counter(), time.process_time()
    s = weightstore.load(r, reader=reader, report=report, manager=WeightManager(),
                         buffers=buffers)
    out["seconds"] = time.perf_counter() - middle  # from the resolved package
    out["cpu_seconds"] = time.process_time() - cpu  # every thread's
    out["with_resolve_seconds"] = time.perf_counter() - start
    out["read_bytes"] = reader.bytes_read
    out["runtime_seconds"] = report.runtime_seconds
    out["live_bytes"] = r.payload_manifest.active_bytes
    out["portable_live_bytes"] = sum(e.source.length for e in r.payload_manifest.active
                                     if e.origin == "portable")
    out["companion"] = r.prepared_graph is not None
    out["bindings"] = sorted({b.selected for b in r.bindings})
    out["output"] = digest(s)
elif mode.startswith("ort"):
    so = onnxruntime.SessionOptions()  # default options, or the companion's level
    if mode == "ort-extended":
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if mode == "ort-prepacked":  # its own optimized model and packed weights
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort_model = os.path.join(os.path.dirname(os.path.dirname(ort_model)),
                                 "onnx-prepacked", "model.onnx")
    start, cpu = time.perf_counter(), time.process_time()
    s = onnxruntime.InferenceSession(ort_model, so, providers=["CPUExecutionProvider"])
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu
    out["output"] = digest(s)
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out["onnx_initialiser"] = "onnx" in sys.modules  # weightstore's doing: not imported above
print(json.dumps(out))
'''


def dim_for(mb: float, layers: int) -> int:
    """The ``d`` whose ``layers + 2`` d x d float32 matrices hold ``mb`` MB."""
    return max(16, int((mb * MB / 4 / (layers + 2)) ** 0.5))


def hidden_for(mb: float) -> int:
    """The encoder's hidden size (a multiple of its 12 heads) for about ``mb`` MB: an
    8000-row embedding and 6 layers of 12 h x h matrices."""
    h = 12
    while (8000 + 512 + 2) * (h + 12) * 4 + 6 * 12 * (h + 12) ** 2 * 4 <= mb * MB:
        h += 12
    return h


ORT_PREPACK = r'''
import sys, onnxruntime
source, out = sys.argv[1:3]
so = onnxruntime.SessionOptions()
so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
so.optimized_model_filepath = out
for key, value in (("session.save_external_prepacked_constant_initializers", "1"),
                   ("session.optimized_model_external_initializers_file_name", "model.data"),
                   ("session.optimized_model_external_initializers_min_size_in_bytes", "1024")):
    so.add_session_config_entry(key, value)
onnxruntime.InferenceSession(source, so, providers=["CPUExecutionProvider"])
'''


def make_package(workdir: Path, name: str, shape: str, size: int, layers: int) -> Path:
    folder = workdir / name
    if not (folder / "out").is_dir():
        harness.log(f"generating {name} ({size})")
        script, args = ((GENERATE, [str(layers), str(size)]) if shape == "chain" else
                        (GENERATE_ENCODER, [str(size), str(harness.REPO)]))
        harness.run_process([sys.executable, "-c", script, str(folder), *args], workdir,
                            f"generate-{name}")
        harness.run_process([sys.executable, "-m", "weightstore", "build",
                             str(folder / "recipe.yaml")], workdir, f"build-{name}")
        harness.run_process([sys.executable, "-m", "weightstore", "prepare",
                             str(package_of(folder, shape)), "--device", "cpu", "--store",
                             str(folder / "store")], workdir, f"prepare-{name}")
    own = folder / "onnx-prepacked"
    if not (own / "model.onnx").is_file():  # onnxruntime's own prepared companion
        own.mkdir(exist_ok=True)
        harness.run_process([sys.executable, "-c", ORT_PREPACK,
                             str(folder / "onnx-external" / "model.onnx"),
                             str(own / "model.onnx")], workdir, f"ort-prepack-{name}")
    return folder


def package_of(folder: Path, shape: str) -> Path:
    return folder / "out" / shape / "1" / "release"


def child(mode: str, folder: Path, shape: str, workdir: Path,
          pair: Path | None = None) -> dict[str, Any]:
    """One fresh process of ``mode``; ``pair``: a package folder of the same shape whose
    resolution is timed in turn with this one's (a ratio measured in one process). Each
    has an empty user cache: what is measured here is resolving and reading, not the
    records a later process would use (bench/ready.py measures those)."""
    extra = [] if pair is None else [str(package_of(pair, shape)), str(pair / "store")]
    cache = workdir / "user-cache"
    shutil.rmtree(cache, ignore_errors=True)
    proc = harness.run_process([sys.executable, "-c", CHILD, mode,
                                str(package_of(folder, shape)), str(folder / "store"),
                                str(folder / "onnx-external" / "model.onnx"),
                                str(folder / "feed.npz"), *extra], workdir, f"{mode}",
                               env={"XDG_CACHE_HOME": str(cache)})
    return json.loads(proc.output.strip().splitlines()[-1])


def run_all(layers: int, small_mb: float, runs: int, workdir: Path) -> dict[str, Any]:
    sizes = {"chain-1x": dim_for(small_mb, layers), "chain-10x": dim_for(small_mb * 10, layers),
             "encoder": hidden_for(small_mb * 10)}
    folders = {k: make_package(workdir, k, k.partition("-")[0], size, layers)
               for k, size in sizes.items()}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {k: {} for k in sizes}
    for n in range(runs):
        harness.log(f"round {n + 1}/{runs}")
        for name, folder in folders.items():
            modes = ("resolve",) if name == "chain-1x" else ("resolve", *LOAD_MODES)
            for mode in modes:
                pair = folders["chain-1x"] if (name, mode) == ("chain-10x", "resolve") else None
                results[name].setdefault(mode, []).append(
                    child(mode, folder, name.partition("-")[0], workdir, pair))
    return {"sizes": sizes, "layers": layers, "runs": runs, "results": results}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _median_of(rows: list[dict[str, Any]], value: Any) -> float:
    return statistics.median(value(r) for r in rows)


def _phases(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {label: statistics.median(sum(r["phases"].get(p, 0.0) for p in names)
                                    for r in rows) * 1000 for label, names in PHASES.items()}
    out["total"] = _median(rows, "seconds") * 1000
    out["first call in a process"] = _median(rows, "cold_seconds") * 1000
    out["imports and first call"] = _median_of(
        rows, lambda r: r.get("imports_seconds", 0.0) + r["cold_seconds"]) * 1000
    return out


def _load_figures(res: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One shape's load figures: per mode, medians of wall and CPU seconds, onnxruntime's
    share, bytes read, peak RSS; and the outputs' agreement."""
    floor = _median(res["resolve"], "rss_imports")
    out: dict[str, Any] = {"rss_imports": floor, "modes": {}}
    for mode in LOAD_MODES:
        rows = res[mode]
        m = {"seconds": _median(rows, "seconds"), "cpu_seconds": _median(rows, "cpu_seconds"),
             "peak_rss": _median(rows, "peak_rss")}
        if mode.startswith("load-"):
            m.update(runtime_seconds=_median(rows, "runtime_seconds"),
                     own_seconds=_median_of(rows, lambda r: r["seconds"] - r["runtime_seconds"]),
                     with_resolve_seconds=_median(rows, "with_resolve_seconds"),
                     read_bytes=_median(rows, "read_bytes"), live_bytes=rows[0]["live_bytes"],
                     portable_live_bytes=rows[0]["portable_live_bytes"],
                     bindings=rows[0]["bindings"], companion=rows[0]["companion"],
                     rss_above_resolved=_median_of(rows, lambda r: r["peak_rss"]
                                                   - r["rss_resolved"]))
        out["modes"][mode] = m
    out["same_outputs"] = len({r["output"] for mode in LOAD_MODES for r in res[mode]}) == 1
    return out


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    res = data["results"]
    summary: dict[str, Any] = {
        "phase_ms": {k: _phases(res[k]["resolve"]) for k in res},
        "resolution_weight_files_opened": max(len(r["weight_files_opened"])
                                              for k in res for r in res[k]["resolve"]),
        "dead_branch_dropped": all(r["dead_branch_dropped"] for r in res["chain-10x"]["resolve"]),
        "load": {k: _load_figures(res[k]) for k in ("chain-10x", "encoder")},
        "resolution_10x_over_1x": _median_of(res["chain-10x"]["resolve"],
                                             lambda r: r["seconds"] / r["pair_seconds"]),
        "onnx_initialiser": sum(bool(r.get("onnx_initialiser")) for k in res
                                for rows in res[k].values() for r in rows),
        "processes": sum(len(rows) for k in res for rows in res[k].values()),
    }
    ph = summary["phase_ms"]
    targets = [
        Target("resolution payload bytes read", 0.0 if summary[
            "resolution_weight_files_opened"] == 0 else float("nan"), 0.0, 0),
        Target("resolution time 10x / 1x weights (chain, in one process)",
               summary["resolution_10x_over_1x"], 1.1),
        Target("  same, across processes",
               ph["chain-10x"]["total"] / ph["chain-1x"]["total"], None),
    ]
    for shape, f in summary["load"].items():
        m = f["modes"]
        ort, ext, floor = m["ort"], m["ort-extended"], f["rss_imports"]
        prepared, packed, portable = m["load-prepared"], m["load-packed"], m["load-portable"]
        targets += [
            Target(f"{shape}: bytes read / live bytes (prepared)",
                   prepared["read_bytes"] / prepared["live_bytes"], 1.0),
            Target(f"{shape}: bytes read / live bytes (portable)",
                   portable["read_bytes"] / portable["live_bytes"], 1.0),
            Target(f"{shape}: ready session prepared / onnxruntime",
                   prepared["seconds"] / ort["seconds"], 0.5),
            Target(f"{shape}:   same, against onnxruntime at extended",
                   prepared["seconds"] / ext["seconds"], None),
            Target(f"{shape}:   of it onnxruntime creating the session",
                   prepared["runtime_seconds"] / ort["seconds"], None),
            Target(f"{shape}:   CPU seconds / onnxruntime's",
                   prepared["cpu_seconds"] / ort["cpu_seconds"], None),
            Target(f"{shape}: onnxruntime's own prepacked companion / onnxruntime",
                   m["ort-prepacked"]["seconds"] / ort["seconds"], None),
            Target(f"{shape}:   CPU seconds / onnxruntime's",
                   m["ort-prepacked"]["cpu_seconds"] / ort["cpu_seconds"], None),
            Target(f"{shape}: ready session packed forms / onnxruntime",
                   packed["seconds"] / ort["seconds"], None),
            Target(f"{shape}: ready session portable / onnxruntime",
                   portable["seconds"] / ort["seconds"], None),
            Target(f"{shape}:   CPU seconds / onnxruntime's",
                   portable["cpu_seconds"] / ort["cpu_seconds"], None),
            Target(f"{shape}: peak RSS above imports / live (prepared)",
                   (prepared["peak_rss"] - floor) / prepared["live_bytes"], 1.2),
            Target(f"{shape}: peak RSS above imports / live (portable)",
                   (portable["peak_rss"] - floor) / portable["live_bytes"], 1.2),
            Target(f"{shape}: peak RSS above the resolved state / live (portable)",
                   portable["rss_above_resolved"] / portable["live_bytes"], None),
            Target(f"{shape}: peak RSS above the caller's buffers / live (caller buffers)",
                   m["load-buffers"]["rss_above_resolved"] / m["load-buffers"]["live_bytes"],
                   None),
            Target(f"{shape}: peak RSS above imports / live (packed forms)",
                   (packed["peak_rss"] - floor) / packed["live_bytes"], None),
            Target(f"{shape}: peak RSS above imports / weights (onnxruntime)",
                   (ort["peak_rss"] - floor) / portable["live_bytes"], None),
        ]
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    s = data["sizes"]
    names = list(summary["phase_ms"])
    lines = [f"resolve benchmark: chain of {data['layers']} MatMul layers, d = {s['chain-1x']} "
             f"(1x) and {s['chain-10x']} (10x); encoder hidden = {s['encoder']}; medians of "
             f"{data['runs']} fresh processes (shared machine: noisy)", "",
             f"{'phase (ms)':<34}" + "".join(f"{n:>12}" for n in names)]
    for label in [*PHASES, "total", "first call in a process", "imports and first call"]:
        lines.append(f"{label:<34}" + "".join(f"{summary['phase_ms'][n][label]:>12.2f}"
                                              for n in names))
    lines.append(f"dead branch dropped: {summary['dead_branch_dropped']}")
    lines.append(f"processes that ran onnx's initialiser (ml_dtypes): "
                 f"{summary['onnx_initialiser']} of {summary['processes']}")
    for shape, f in summary["load"].items():
        m = f["modes"]
        p = m["load-prepared"]
        lines += ["", f"{shape}: live {p['live_bytes'] / MB:.1f} MB, bindings {p['bindings']}, "
                  f"companion graph {p['companion']}; same outputs everywhere: "
                  f"{f['same_outputs']}",
                  f"  {'mode':<16}{'wall s':>8}{'cpu s':>8}{'ort s':>8}{'own s':>8}"
                  f"{'read MB':>9}{'RSS MB':>8}"]
        for mode in LOAD_MODES:
            x = m[mode]
            lines.append(f"  {mode:<16}{x['seconds']:>8.3f}{x['cpu_seconds']:>8.3f}"
                         + (f"{x['runtime_seconds']:>8.3f}{x['own_seconds']:>8.3f}"
                            f"{x['read_bytes'] / MB:>9.1f}" if mode.startswith("load-")
                            else f"{x['seconds']:>8.3f}{0:>8.3f}{0:>9.1f}")
                         + f"{(x['peak_rss'] - f['rss_imports']) / MB:>8.0f}")
    lines += ["  (ort s: onnxruntime creating the session; own s: reading, verifying and "
              "handing over the bytes; RSS above the imports)", ""]
    lines += harness.target_table(targets, "figure", 58, 10)
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
        harness.print_figures(args.json, summary, targets,
                              lambda: report(data, summary, targets), sizes=data["sizes"])
        return 0

    harness.in_workdir(args.workdir, args.keep, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
