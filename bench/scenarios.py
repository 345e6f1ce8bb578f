"""Benchmark replaying a modification scenario against re-running the passes that made it.

Usage: ``python bench/scenarios.py [--runs 7] [--layers 22] [--profile] [--workdir DIR]
[--keep] [--json]``

The model is generated once (in a subprocess, cached in the workdir): a BERT-like encoder
from ``make_encoder`` (vocab 30522, hidden 256, 4 heads, ffn 1024, ``--layers`` layers;
about 100 MB of inline weights and over 700 nodes, counted in every graph, subgraph and
function), changed so that every pass has work:

* the pooler's ``If`` reads its condition from a ``Constant`` (True) instead of the
  ``use_pooler`` input, for ``fold-constant-if``;
* a classifier head of ``Gemm(transB=1)`` layers on the pooled output, for
  ``gemm-transpose-b``;
* an image stem of ``Conv`` + ``BatchNormalization`` + ``Relu`` blocks on a second input,
  for ``fold-batchnorm``.

For each scenario the passes run on the model's metadata, the records are added with
``add_modification_scenario`` and saved into a copy of the model holding that scenario
alone (untimed set-up). Then, per scenario:

* ``replay``: ``replay_modification_scenario(model, name)`` on the model's metadata
  (``metadata_of(path)``: weights left out, small values inline, the catalogue closed before any
  replay, so no payload byte can be read);
* ``re-run``: what adding the scenario costs minus the digest: ``run_passes`` on the
  metadata model (payloads up to ``SMALL_VALUE_LIMIT`` inline, as passes see it) with fresh
  pass instances, then ``prepare_records`` (normalization and the structural check) on the
  catalogued model without scenarios; the table also gives its first part, the passes;
* ``onnx.load``: ``onnx.load(path, load_external_data=False)`` of the scenario's model file,
  for scale.

Replay and re-run are sub-second metadata operations, so they are timed in this process
with ``time.perf_counter`` around the operation alone: each run gets a fresh copy of its
input model (made untimed, so no run sees the state of another, and no run's output is
kept), and ``gc.collect()`` runs (untimed) before it. Each timed run directly follows an
untimed run of the same operation, since what the previous run left in the allocator and
the caches matters: a replay right after the ``cast-fp16`` re-run was measured about 5 ms
slower than one after another replay. ``onnx.load`` allocates the whole file's worth of
memory, so each of its runs is a fresh process that imports onnx first and times the load
alone. Each operation gets one untimed warm-up per scenario; repetitions are interleaved
(round 1 of every scenario and operation, then round 2, ...) and the table gives medians.
After the warm-up the replayed model is checked to be, byte for byte, the model the re-run
produces.

Target: replay / re-run <= 0.2 for every scenario; replay / onnx.load is shown for scale.
With ``--profile``, each scenario that misses the target is replayed again, step by step
(each step of ``replay_modification_scenario`` timed alone) and then under cProfile, and
the time spent in ``weightstore.scenarios`` is printed per step and per function.

This is a measurement, not a gate: the exit code is 0 whatever the figures (2 only when a
measurement fails, since then there is nothing to report).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import json
import os
import pstats
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import MB, BenchError, Target

# The checkout this script belongs to, ahead of any installed copy: the same code the
# generating child imports (its PYTHONPATH is set by the harness).
sys.path.insert(0, str(harness.REPO))

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.samples import make_encoder
from weightstore.catalogue.schema import PAYLOAD_FIELDS
from weightstore.catalogue.sites import iter_tensor_sites
from weightstore.convert.weights import ModelWeights
from weightstore.passes.analysis import iter_scopes
from weightstore.passes.base import SMALL_VALUE_LIMIT, run_passes
from weightstore.passes.registry import get_pass
from weightstore.passes.rewriting import apply_record
from weightstore.scenarios.api import (
    add_modification_scenario,
    check_scenarios,
    find_scenario,
    prepare_records,
    replay_modification_scenario,
    strip_scenarios,
)
from weightstore.scenarios.digest import base_graph_digest
from weightstore.scenarios.files import rewrite_scenarios_file
from weightstore.scenarios.storage import read_scenarios
from weightstore.scenarios.variants import metadata_of, scenario_rewrites

ENCODER = {"vocab": 30522, "hidden": 256, "heads": 4, "ffn": 1024, "max_seq": 512}
DEFAULT_LAYERS = 22  # about 790 nodes and 100 MB of weights
MIN_NODES = 700
HEAD_LAYERS, LABELS = 4, 16  # classifier head: Gemm(transB=1) layers, output width
STEM_BLOCKS, STEM_CHANNELS, IMAGE = 4, 64, 64  # image stem: Conv+BN+Relu blocks
TARGET = 0.2  # replay / re-run

SCENARIOS: list[tuple[str, tuple[str, ...]]] = [
    ("fuse-qkv+cleanup", ("fuse-qkv", "cleanup")),
    ("cast-fp16+cleanup", ("cast-fp16", "cleanup")),
    ("gemm-transpose-b+cleanup", ("gemm-transpose-b", "cleanup")),
    ("fold-batchnorm+cleanup", ("fold-batchnorm", "cleanup")),
    ("fold-constant-if+cleanup", ("fold-constant-if", "cleanup")),
    ("cleanup", ("cleanup",)),
]
OPERATIONS = ("replay", "re-run", "onnx.load")
IN_PROCESS = ("replay", "re-run")

# onnx.load in a fresh process: imports first, then the load alone between two clock readings.
ONNX_LOAD = """\
import sys, time
import onnx
start = time.perf_counter()
onnx.load(sys.argv[1], load_external_data=False)
print(time.perf_counter() - start)
"""

GENERATE = """\
import os, sys
sys.path.insert(0, sys.argv[1])
import onnx
import scenarios
path, layers = sys.argv[2], int(sys.argv[3])
tmp = path[: -len(".onnx")] + ".partial.onnx"
onnx.save(scenarios.build_model(layers), tmp)
os.replace(tmp, path)
"""


# -- the model --------------------------------------------------------------------------------

def _array(name: str, shape: list[int], scale: float = 0.02, shift: float = 0.0) -> np.ndarray:
    values = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(
        tuple(shape), dtype=np.float32)
    return values * np.float32(scale) + np.float32(shift)


def _init(graph: onnx.GraphProto, name: str, array: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(array, name))
    return name


def _constant_condition(graph: onnx.GraphProto) -> None:
    """The pooler's If condition from a Constant (True) instead of the ``use_pooler`` input."""
    inputs = [i for i in graph.input if i.name != "use_pooler"]
    del graph.input[:]
    graph.input.extend(inputs)
    cond = helper.make_node("Constant", [], ["use_pooler"], name="use_pooler.constant",
                            value=numpy_helper.from_array(np.array(True), "use_pooler"))
    nodes = [cond, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)


def _classifier(graph: onnx.GraphProto, hidden: int) -> None:
    """Linear layers as exported: Gemm(transB=1) with weights [out, in], Tanh between."""
    x = "pooled"
    for i in range(HEAD_LAYERS):
        last = i == HEAD_LAYERS - 1
        width = LABELS if last else hidden
        p = f"classifier.{i}"
        w = _init(graph, f"{p}.weight", _array(f"{p}.weight", [width, hidden]))
        b = _init(graph, f"{p}.bias", _array(f"{p}.bias", [width]))
        y = "logits" if last else f"{p}.gemm"
        graph.node.append(helper.make_node("Gemm", [x, w, b], [y], name=f"{p}.Gemm", transB=1))
        if not last:
            x = f"{p}.tanh"
            graph.node.append(helper.make_node("Tanh", [y], [x], name=f"{p}.Tanh"))
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                      ["batch", LABELS]))


def _stem(graph: onnx.GraphProto) -> None:
    """Conv + BatchNormalization (inference) + Relu blocks, pooled to ``image_features``."""
    graph.input.append(helper.make_tensor_value_info(
        "pixel_values", TensorProto.FLOAT, ["batch", 3, IMAGE, IMAGE]))
    x, channels = "pixel_values", 3
    for i in range(STEM_BLOCKS):
        p = f"stem.{i}"
        inputs = [x, _init(graph, f"{p}.conv.weight",
                           _array(f"{p}.conv.weight", [STEM_CHANNELS, channels, 3, 3], 0.1))]
        if i % 2:  # every other Conv has a bias
            inputs.append(_init(graph, f"{p}.conv.bias",
                                _array(f"{p}.conv.bias", [STEM_CHANNELS])))
        bn = [_init(graph, f"{p}.bn.scale", _array(f"{p}.bn.scale", [STEM_CHANNELS], 0.1, 1)),
              _init(graph, f"{p}.bn.bias", _array(f"{p}.bn.bias", [STEM_CHANNELS])),
              _init(graph, f"{p}.bn.mean", _array(f"{p}.bn.mean", [STEM_CHANNELS])),
              _init(graph, f"{p}.bn.var",
                    np.abs(_array(f"{p}.bn.var", [STEM_CHANNELS], 0.1, 1)))]
        graph.node.extend([
            helper.make_node("Conv", inputs, [f"{p}.conv"], name=f"{p}.Conv",
                             pads=[1, 1, 1, 1], strides=[2, 2] if i == 0 else [1, 1]),
            helper.make_node("BatchNormalization", [f"{p}.conv", *bn], [f"{p}.bn"],
                             name=f"{p}.BatchNormalization", epsilon=1e-5),
            helper.make_node("Relu", [f"{p}.bn"], [f"{p}.relu"], name=f"{p}.Relu"),
        ])
        x, channels = f"{p}.relu", STEM_CHANNELS
    graph.node.extend([
        helper.make_node("GlobalAveragePool", [x], ["stem.pooled"], name="stem.Pool"),
        helper.make_node("Flatten", ["stem.pooled"], ["image_features"], name="stem.Flatten"),
    ])
    graph.output.append(helper.make_tensor_value_info("image_features", TensorProto.FLOAT,
                                                      ["batch", STEM_CHANNELS]))


def build_model(layers: int) -> onnx.ModelProto:
    """The benchmark model: the encoder with a constant If condition, a Gemm head and a
    Conv+BN stem (see the module doc)."""
    model = make_encoder(**ENCODER, layers=layers, name="bench-scenarios")
    _constant_condition(model.graph)
    _classifier(model.graph, ENCODER["hidden"])
    _stem(model.graph)
    onnx.checker.check_model(model)
    return model


def node_count(model: onnx.ModelProto) -> int:
    """Nodes in every graph, subgraph and model-local function."""
    return sum(len(scope.container.node) for scope in iter_scopes(model))


def make_model(workdir: Path, layers: int) -> Path:
    e = ENCODER
    path = workdir / (f"scenarios-v{e['vocab']}-h{e['hidden']}-l{layers}-f{e['ffn']}"
                      f"-g{HEAD_LAYERS}-c{STEM_BLOCKS}.onnx")
    if not path.exists():
        harness.log(f"generating the model in {path} ...")
        proc = harness.run_process([sys.executable, "-c", GENERATE,
                                    str(Path(__file__).resolve().parent), str(path),
                                    str(layers)], workdir, "generate")
        harness.log(f"  done in {proc.seconds:.1f} s")
    return path


# -- set-up -----------------------------------------------------------------------------------

def _payload_bytes(model: onnx.ModelProto) -> int:
    """Payload bytes present in ``model`` above the small-value limit (0 for a metadata
    model: small values, such as shapes and If conditions, are metadata)."""
    total = 0
    for site in iter_tensor_sites(model):
        t = site.tensor
        size = sum(len(getattr(t, name)) for name in PAYLOAD_FIELDS.values())
        total += size if size > SMALL_VALUE_LIMIT else 0
    return total


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@dataclass
class Inputs:
    """What every scenario's re-run starts from, read once from the model without scenarios."""

    metadata: onnx.ModelProto  # small payloads inline: what passes see
    catalogued: onnx.ModelProto  # every payload left out: what the records are normalized on


@dataclass
class Scenario:
    name: str
    passes: tuple[str, ...]
    path: Path  # the model file holding this scenario alone
    catalogued: onnx.ModelProto  # read_catalogue(path).model: the replay's input
    records: int
    times: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPERATIONS})
    passes_times: list[float] = field(default_factory=list)  # the passes part of re-run

    def median_ms(self, op: str) -> float:
        return statistics.median(self.times[op]) * 1000

    def checks(self) -> list[Target]:
        replay, rerun, load = (self.median_ms(op) for op in OPERATIONS)
        return [Target(f"{self.name}: replay / re-run", replay / rerun, TARGET, 3),
                Target(f"{self.name}: replay / onnx.load", replay / load, None, 3)]


def read_inputs(model: Path) -> Inputs:
    with ModelWeights.open(model) as mw:
        metadata = strip_scenarios(mw.metadata_model(SMALL_VALUE_LIMIT))
    return Inputs(metadata, _copy(metadata))


def add_scenario(model: Path, name: str, passes: tuple[str, ...], workdir: Path) -> Scenario:
    """Add the scenario to a copy of ``model`` as ``weightstore scenario add`` does."""
    path = workdir / f"{model.stem}.{name}.onnx"
    with ModelWeights.open(model) as mw:
        rewrites, _ = scenario_rewrites(mw, passes)
        base = mw.metadata_model(SMALL_VALUE_LIMIT)
        add_modification_scenario(base, name, rewrites)
        stored = read_scenarios(base)
    rewrite_scenarios_file(model, path, stored)
    catalogued = metadata_of(path)  # the catalogue is closed: nothing can read weights
    if _payload_bytes(catalogued):
        raise BenchError(f"{name}: the metadata model holds weight bytes")
    records = len(find_scenario(catalogued, name).rewrites)
    return Scenario(name, passes, path, catalogued, records)


# -- the operations ---------------------------------------------------------------------------

def replay(s: Scenario) -> Callable[[], onnx.ModelProto]:
    model = _copy(s.catalogued)
    return lambda: replay_modification_scenario(model, s.name)


def rerun(s: Scenario, inputs: Inputs) -> Callable[[], tuple[onnx.ModelProto, float]]:
    """The passes then the normalization; returns the model and the passes' seconds."""
    metadata, catalogued = _copy(inputs.metadata), _copy(inputs.catalogued)

    def run() -> tuple[onnx.ModelProto, float]:
        start = time.perf_counter()
        rewrites = run_passes(metadata, [get_pass(n) for n in s.passes]).rewrites
        passes = time.perf_counter() - start
        _, result = prepare_records(strip_scenarios(catalogued), s.name, rewrites)
        return result, passes
    return run


def timed(operation: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of ``operation`` alone, and its result."""
    gc.collect()
    start = time.perf_counter()
    result = operation()
    return time.perf_counter() - start, result


def load(s: Scenario, workdir: Path) -> float:
    """Seconds of ``onnx.load`` alone, in a fresh process (imports left out)."""
    proc = harness.run_process([sys.executable, "-c", ONNX_LOAD, str(s.path)], workdir,
                               "onnx-load")
    try:
        return float(proc.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"onnx.load printed no time:\n{proc.output}") from None


def measure(s: Scenario, op: str, inputs: Inputs, workdir: Path) -> tuple[float, Any]:
    """One run of ``op``: its seconds, and its result (the passes' seconds for re-run)."""
    try:
        if op == "replay":
            return timed(replay(s))
        if op == "re-run":
            return timed(rerun(s, inputs))
        return load(s, workdir), None
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"{s.name}: {op} failed: {type(exc).__name__}: {exc}") from None


def check_replay(s: Scenario, inputs: Inputs, workdir: Path) -> None:
    """The replayed model must be the model the re-run produces, byte for byte."""
    _, replayed = measure(s, "replay", inputs, workdir)
    _, (expected, _) = measure(s, "re-run", inputs, workdir)
    if (replayed.SerializeToString(deterministic=True)
            != expected.SerializeToString(deterministic=True)):
        raise BenchError(f"{s.name}: the replayed model differs from the re-run's")
    if _payload_bytes(replayed) > _payload_bytes(expected):
        raise BenchError(f"{s.name}: the replayed model holds payload bytes")


def run_rounds(scenarios: list[Scenario], inputs: Inputs, runs: int, workdir: Path) -> None:
    harness.log("warm-up and checks (untimed)")
    for s in scenarios:
        check_replay(s, inputs, workdir)
        measure(s, "onnx.load", inputs, workdir)
    for i in range(runs):
        harness.log(f"round {i + 1}/{runs}")
        for s in scenarios:
            for op in OPERATIONS:
                if op in IN_PROCESS:  # settle: what the previous, different run left goes
                    measure(s, op, inputs, workdir)
                seconds, result = measure(s, op, inputs, workdir)
                s.times[op].append(seconds)
                if op == "re-run":
                    s.passes_times.append(result[1])
                del result  # no run's output outlives it


# -- profile ----------------------------------------------------------------------------------

SCENARIO_CODE = os.sep + os.path.join("weightstore", "scenarios") + os.sep


def replay_phases(s: Scenario, runs: int) -> list[tuple[str, float]]:
    """The steps ``replay_modification_scenario`` takes, taken one by one and each timed
    without a profiler: (step, median ms). Their sum is printed next to the measured replay."""
    phases: dict[str, list[float]] = {}
    for _ in range(runs):
        model = _copy(s.catalogued)
        gc.collect()
        marks = [("", time.perf_counter())]
        check_scenarios(model)
        marks.append(("check_scenarios", time.perf_counter()))
        record = find_scenario(model, s.name)
        marks.append(("find_scenario", time.perf_counter()))
        base = strip_scenarios(model)
        marks.append(("verify_base: strip_scenarios", time.perf_counter()))
        digest = base_graph_digest(base, algo=record.digest_algorithm)
        marks.append(("verify_base: base_graph_digest", time.perf_counter()))
        if digest != record.base_graph_digest:
            raise BenchError(f"{s.name}: base graph digest mismatch")
        replayed = strip_scenarios(model)
        marks.append(("apply_scenario: strip_scenarios", time.perf_counter()))
        for rewrite in record.rewrites:
            apply_record(replayed, rewrite)
        marks.append((f"apply_scenario: apply_record x {len(record.rewrites)}",
                      time.perf_counter()))
        for (_, before), (name, after) in itertools.pairwise(marks):
            phases.setdefault(name, []).append(after - before)
    return [(name, statistics.median(times) * 1000) for name, times in phases.items()]


def profile_replay(s: Scenario, runs: int, top: int = 12) -> str:
    """Where replay's time goes: its steps timed alone, then under cProfile the cumulative
    ms per replay of ``weightstore.scenarios`` functions and the heaviest functions of all
    by their own time."""
    steps = replay_phases(s, runs)
    lines = [f"profile of replay, {s.name}: {s.records} record(s), replay median "
             f"{s.median_ms('replay'):.2f} ms",
             f"  {'step (timed alone, median of ' + str(runs) + ')':<48}{'ms':>9}"]
    lines += [f"  {name:<48}{ms:>9.2f}" for name, ms in steps]
    lines.append(f"  {'sum':<48}{sum(ms for _, ms in steps):>9.2f}")

    profiler = cProfile.Profile()
    for _ in range(runs):
        operation = replay(s)
        gc.collect()
        profiler.enable()
        operation()
        profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    rows = []
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.items():
        where = function if filename == "~" else f"{Path(filename).stem}.{function}"
        if function.startswith("<") and filename != "~":
            where += f":{line}"  # comprehensions: which one
        rows.append((filename, where, calls / runs, own / runs * 1000,
                     cumulative / runs * 1000))
    total = max((r[4] for r in rows if r[1].endswith(".replay_modification_scenario")),
                default=0.0)
    heading = f"under cProfile ({total:.2f} ms per replay, overhead in)"
    lines += ["", f"  {heading:<48}{'calls':>8}{'own ms':>9}{'cum ms':>9}"]
    ours = sorted((r for r in rows if SCENARIO_CODE in r[0]), key=lambda r: -r[4])
    lines += [f"  {where[:48]:<48}{calls:>8.0f}{own:>9.2f}{cum:>9.2f}"
              for _, where, calls, own, cum in ours[:top]]
    lines.append(f"  {'heaviest by own time (any code)':<48}{'calls':>8}{'own ms':>9}"
                 f"{'cum ms':>9}")
    heaviest = sorted(rows, key=lambda r: -r[3])[:8]
    lines += [f"  {where[:48]:<48}{calls:>8.0f}{own:>9.2f}{cum:>9.2f}"
              for _, where, calls, own, cum in heaviest]
    return "\n".join(lines)


# -- report -----------------------------------------------------------------------------------

@dataclass
class Result:
    model: Path
    model_bytes: int
    nodes: int
    layers: int
    runs: int
    scenarios: list[Scenario]
    profiles: list[str] = field(default_factory=list)


def report(r: Result) -> str:
    lines = [
        f"model {r.model.name}: {r.model_bytes / MB:.1f} MB, {r.nodes} nodes (every graph, "
        f"subgraph and function), encoder of {r.layers} layers with hidden "
        f"{ENCODER['hidden']}; {r.runs} run(s) per operation, {os.cpu_count()} CPU(s), "
        f"Python {sys.version.split()[0]}",
        "",
        f"{'scenario':<26}{'records':>8}{'replay ms':>11}{'re-run ms':>11}{'(passes)':>10}"
        f"{'onnx.load ms':>14}{'replay/re-run':>15}{'target':>9}  {'result':<8}"
        f"{'replay/load':>11}",
    ]
    for s in r.scenarios:
        to_rerun, to_load = s.checks()
        passes = statistics.median(s.passes_times) * 1000
        verdict = "PASS" if to_rerun.passed else "MISS"
        lines.append(f"{s.name:<26}{s.records:>8}{s.median_ms('replay'):>11.2f}"
                     f"{s.median_ms('re-run'):>11.2f}{passes:>10.2f}"
                     f"{s.median_ms('onnx.load'):>14.2f}{to_rerun.value:>15.3f}"
                     f"{'<= ' + format(TARGET, 'g'):>9}  {verdict:<8}{to_load.value:>11.3f}")
    lines.append("(medians, each operation timed alone: replay and re-run in this process on "
                 "a fresh copy of their input, onnx.load in a fresh process; re-run = passes + "
                 "normalization and structural check, (passes) its first part)")
    empty = [s.name for s in r.scenarios if not s.records]
    if empty:
        lines.append(f"no records: {', '.join(empty)} (the passes found nothing to do; "
                     "replay still verifies the base graph digest)")
    misses = [t for s in r.scenarios for t in s.checks() if t.passed is False]
    if misses:
        lines.append("")
        for t in misses:
            over = (t.value / TARGET - 1) * 100
            lines.append(f"MISS: {t.name} = {t.value:.3f}, target <= {TARGET:g} "
                         f"({over:.0f}% over)")
    for text in r.profiles:
        lines += ["", text]
    return "\n".join(lines)


def as_json(r: Result) -> dict[str, Any]:
    def figures(times: list[float]) -> dict[str, Any]:
        return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times),
                "max_s": max(times)}

    return {
        "model": {"file": r.model.name, "bytes": r.model_bytes, "nodes": r.nodes,
                  "encoder": {**ENCODER, "layers": r.layers}},
        "runs": r.runs,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "scenarios": {
            s.name: {"passes": list(s.passes), "records": s.records,
                     "operations": {op: figures(s.times[op]) for op in OPERATIONS},
                     "re-run passes": figures(s.passes_times),
                     "checks": [t.as_json() for t in s.checks()]}
            for s in r.scenarios},
        "profiles": r.profiles,
    }


def run_all(layers: int, runs: int, profile: bool, workdir: Path) -> Result:
    model = make_model(workdir, layers)
    harness.log("adding the scenarios (untimed) ...")
    inputs = read_inputs(model)
    nodes = node_count(inputs.catalogued)
    if nodes < MIN_NODES:
        harness.log(f"note: {nodes} nodes, fewer than {MIN_NODES}")
    scenarios = [add_scenario(model, name, passes, workdir) for name, passes in SCENARIOS]
    run_rounds(scenarios, inputs, runs, workdir)
    result = Result(model, model.stat().st_size, nodes, layers, runs, scenarios)
    if profile:
        for s in scenarios:
            if s.checks()[0].passed is False:
                harness.log(f"profiling the replay of {s.name}")
                result.profiles.append(profile_replay(s, runs))
    for s in scenarios:
        s.path.unlink()  # a full copy of the model each; the generated model is kept
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7,
                   help="timed runs per scenario and operation (default 7)")
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                   help=f"encoder layers (default {DEFAULT_LAYERS}: about 790 nodes, 100 MB)")
    p.add_argument("--profile", action="store_true",
                   help="profile the replay of every scenario that misses the target")
    harness.add_common_arguments(p, "the model and the logs")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.layers < 1:
        p.error("--layers must be at least 1")

    result = harness.in_workdir(args.workdir, args.keep,
                                lambda workdir: run_all(args.layers, args.runs, args.profile,
                                                        workdir))
    if result is None:
        return 2
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
