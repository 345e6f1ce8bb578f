"""Benchmark the catalogue (metadata-only reading) against ``onnx.load`` and one sequential read.

Usage: ``python bench/catalogue.py [--runs 5] [--big-gib 2.5] [--workdir DIR] [--keep] [--json]``

Two generated models are measured:

* an encoder of about 137 MB (``make_encoder``: initializers, Constants with typed fields, a
  model-local function, nested ``If`` branches), saved with ``onnx.save``;
* a single file of ``--big-gib`` GiB of inline weights (``write_large_single_file``), above
  protobuf's 2 GiB limit by default, so that ``onnx.load`` cannot open it.

Variants, each run in a fresh subprocess:

* ``catalogue``: ``read_catalogue`` + ``weight_descriptors`` (every descriptor built), then
  ``close``;
* ``onnx.load``: ``onnx.load(path, load_external_data=False)``;
* ``read``: one sequential read of the whole file into a 16 MB buffer, until EOF: the
  reference for "as fast as reading the file once".

On the big model ``onnx.load`` runs once, untimed as a variant: it is expected to fail, and
its error is printed instead of timings (a run that neither fails nor finishes within
120 s is killed and reported as such).

The child imports ``onnx`` and the catalogue modules first (every variant the same ones),
then times the operation alone with ``time.perf_counter``, so interpreter start-up and
imports are left out. Memory comes from ``ru_maxrss``: the child records it after the
imports (the baseline) and after the operation; ``+RSS`` is the increase, i.e. what the
operation itself needed, and ``peak RSS`` is the whole process's peak from ``os.wait4``.
``ru_maxrss`` counts file pages mapped into the process as well as its own memory, so the
catalogue's figure includes the pages of the memory-mapped model that the kernel maps on
each fault: a 64 KiB window, or on recent kernels the whole large folio of the page cache
(up to a few MB) holding the byte read. It therefore depends on how the file came into the
page cache, not only on the reader.

The page cache cannot be dropped without root: each variant gets one untimed warm-up run,
so all of them see a warm cache (for the catalogue, which touches only the pages holding
protobuf framing, a cold cache costs far less than for a whole read). ``os.sync()`` runs
(untimed) before every run. Children keep compiled bytecode in the workdir. Repetitions
are interleaved (round 1 of every variant, then round 2, ...) so that machine noise
spreads evenly.

This is a measurement, not a gate: the exit code is 0 whatever the figures (2 only when a
measurement fails, since then there is nothing to report).

The parent process never imports onnx or numpy, and models are generated in a subprocess:
on Linux a child's ``ru_maxrss`` starts from the peak RSS of the process that spawned it,
so a large parent would inflate every figure. That peak is printed as the RSS floor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import MB, BenchError, Target

GIB = 1 << 30
PROTOBUF_LIMIT = (1 << 31) - 1
FAILURE_TIMEOUT_S = 120.0

# About 137 MB: word embeddings 16000x512, 8 layers of attention (4 x 512x512) and FFN
# (512x2048 + 2048x512), plus biases, LayerNorms, position table and pooler.
ENCODER = {"vocab": 16000, "hidden": 512, "heads": 8, "layers": 8, "ffn": 2048,
           "max_seq": 512}

GENERATE_ENCODER = """\
import json, os, sys
import onnx
from tests.samples import make_encoder
path = sys.argv[1]
tmp = path[: -len(".onnx")] + ".partial.onnx"
onnx.save(make_encoder(**json.loads(sys.argv[2]), name="bench-encoder"), tmp)
os.replace(tmp, path)
"""

GENERATE_BIG = """\
import os, sys
from tests.samples import write_large_single_file
path, size = sys.argv[1], int(sys.argv[2])
tmp = path[: -len(".onnx")] + ".partial.onnx"
write_large_single_file(tmp, size)
os.replace(tmp, path)
"""

# The measured child: imports first, then the operation alone between two clock readings.
OPERATION = """\
import json, resource, sys, time

import onnx
from weightstore.catalogue.descriptors import weight_descriptors
from weightstore.catalogue.payload import expected_nbytes
from weightstore.catalogue.reader import read_catalogue
from weightstore.catalogue.sites import iter_tensor_sites

RSS_UNIT = 1 if sys.platform == "darwin" else 1024
CHUNK = 16 << 20


def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT


def catalogue(path):
    cat = read_catalogue(path)
    try:
        return weight_descriptors(cat)
    finally:
        cat.close()


def catalogue_summary(descriptors):
    return len(descriptors), sum(d.nbytes for d in descriptors)


def onnx_load(path):
    return onnx.load(path, load_external_data=False)


def onnx_summary(model):
    sites = list(iter_tensor_sites(model))
    return len(sites), sum(expected_nbytes(s.tensor.data_type, s.tensor.dims) or 0
                           for s in sites)


def read(path):
    buf = bytearray(CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return total
            total += n


VARIANTS = {
    "catalogue": (catalogue, catalogue_summary),
    "onnx.load": (onnx_load, onnx_summary),
    "read": (read, lambda total: (None, total)),
}

operation, summarize = VARIANTS[sys.argv[1]]
path = sys.argv[2]
baseline = maxrss()
start = time.perf_counter()
try:
    result = operation(path)
except Exception as exc:
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": maxrss(),
                      "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
seconds = time.perf_counter() - start
peak = maxrss()
tensors, nbytes = summarize(result)
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak,
                  "tensors": tensors, "payload_bytes": nbytes}))
"""


@dataclass
class Run:
    seconds: float  # the operation alone, timed in the child
    baseline_rss: int  # bytes: the child's ru_maxrss after its imports
    op_peak_rss: int  # bytes: the child's ru_maxrss right after the operation
    process_peak_rss: int  # bytes: the whole process's peak, from os.wait4
    tensors: int | None = None
    payload_bytes: int | None = None
    error: str | None = None

    @property
    def increase(self) -> int:
        """What the operation needed above the baseline."""
        return max(0, self.op_peak_rss - self.baseline_rss)


@dataclass
class Variant:
    name: str
    runs: list[Run] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        times = [r.seconds for r in self.runs]
        peaks = [r.process_peak_rss for r in self.runs]
        increases = [r.increase for r in self.runs]
        return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times),
                "max_s": max(times),
                "baseline_rss_bytes": [r.baseline_rss for r in self.runs],
                "peak_rss_bytes": peaks, "max_peak_rss_bytes": max(peaks),
                "rss_increase_bytes": increases, "max_rss_increase_bytes": max(increases)}


def measure(variant: str, model: Path, workdir: Path,
            timeout: float | None = None) -> Run | None:
    """One run of ``variant`` on ``model``; None if it was killed at ``timeout``."""
    os.sync()
    proc = harness.run_process([sys.executable, "-c", OPERATION, variant, str(model)],
                               workdir, variant, timeout)
    if proc.killed:
        return None
    try:
        result = json.loads(proc.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"{variant} printed no readable result:\n{proc.output}") from None
    return Run(result["seconds"], result["baseline"], result["peak"], proc.peak_rss,
               result.get("tensors"), result.get("payload_bytes"), result.get("error"))


def _generate(path: Path, script: str, args: list[str], workdir: Path, what: str) -> None:
    if path.exists():
        return
    harness.log(f"generating {what} in {path} ...")
    proc = harness.run_process([sys.executable, "-c", script, str(path), *args], workdir,
                               "generate")
    harness.log(f"  done in {proc.seconds:.1f} s")
    os.sync()


def make_encoder_model(workdir: Path) -> Path:
    e = ENCODER
    path = workdir / (f"encoder-v{e['vocab']}-h{e['hidden']}-l{e['layers']}-f{e['ffn']}"
                      ".onnx")
    _generate(path, GENERATE_ENCODER, [json.dumps(ENCODER)], workdir, "an encoder model")
    return path


def make_big_model(workdir: Path, gib: float) -> Path:
    weights = round(gib * GIB)
    path = workdir / f"single-{gib:g}gib.onnx"
    if not path.exists():
        free = shutil.disk_usage(workdir).free
        need = weights + 256 * MB
        if free < need:
            raise BenchError(f"{workdir} has {free / MB:.0f} MB free; the {gib:g} GiB model "
                             f"needs about {need / MB:.0f} MB")
    _generate(path, GENERATE_BIG, [str(weights)], workdir,
              f"a {gib:g} GiB single-file model")
    return path


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


@dataclass
class Result:
    title: str  # "encoder" or "big"
    model: Path
    model_bytes: int
    runs: int
    variants: list[Variant]
    checks: list[Target] = field(default_factory=list)
    tensors: int | None = None
    payload_bytes: int | None = None
    load_once: Run | None = None  # the single onnx.load attempt on the big model
    load_killed: bool = False


def bench_model(title: str, model: Path, names: list[str], runs: int,
                workdir: Path) -> Result:
    variants = [Variant(n) for n in names]
    harness.log(f"{model.name}: warm-up (untimed): " + ", ".join(names))
    for v in variants:
        _checked(measure(v.name, model, workdir), v.name)
    for i in range(runs):
        harness.log(f"{model.name}: round {i + 1}/{runs}")
        for v in variants:
            v.runs.append(_checked(measure(v.name, model, workdir), v.name))
    result = Result(title, model, model.stat().st_size, runs, variants)
    by_name = {v.name: v for v in variants}
    cat = by_name["catalogue"].runs[-1]
    result.tensors, result.payload_bytes = cat.tensors, cat.payload_bytes
    if "onnx.load" in by_name:
        loaded = by_name["onnx.load"].runs[-1]
        if (loaded.tensors, loaded.payload_bytes) != (cat.tensors, cat.payload_bytes):
            raise BenchError(f"{model.name}: the catalogue found {cat.tensors} tensors, "
                             f"{cat.payload_bytes} payload bytes; onnx.load "
                             f"{loaded.tensors}, {loaded.payload_bytes}")
    read = by_name["read"].runs[-1]
    if read.payload_bytes != result.model_bytes:
        raise BenchError(f"{model.name}: read {read.payload_bytes} of "
                         f"{result.model_bytes} bytes")
    return result


def _checked(run: Run | None, name: str) -> Run:
    if run is None:
        raise BenchError(f"{name} was killed")
    if run.error is not None:
        raise BenchError(f"{name} failed: {run.error}")
    return run


def encoder_checks(result: Result) -> list[Target]:
    v = {x.name: x.figures() for x in result.variants}
    cat, load, read = v["catalogue"], v["onnx.load"], v["read"]
    return [
        Target("catalogue / onnx.load time", _ratio(cat["median_s"], load["median_s"]), 0.5),
        Target("catalogue / onnx.load +RSS", _ratio(cat["max_rss_increase_bytes"],
                                                    load["max_rss_increase_bytes"]), 0.1),
        Target("catalogue / onnx.load peak RSS", _ratio(cat["max_peak_rss_bytes"],
                                                        load["max_peak_rss_bytes"]), None),
        Target("catalogue / read time", _ratio(cat["median_s"], read["median_s"]), None),
    ]


def big_checks(result: Result) -> list[Target]:
    v = {x.name: x.figures() for x in result.variants}
    cat, read = v["catalogue"], v["read"]
    return [
        Target("catalogue peak RSS (MB)", cat["max_peak_rss_bytes"] / MB, 256, 1),
        Target("catalogue / read time", _ratio(cat["median_s"], read["median_s"]), 1.0),
        Target("catalogue +RSS (MB)", cat["max_rss_increase_bytes"] / MB, None, 1),
    ]


def try_onnx_load(result: Result, workdir: Path) -> None:
    harness.log(f"{result.model.name}: onnx.load, once (expected to fail)")
    run = measure("onnx.load", result.model, workdir, timeout=FAILURE_TIMEOUT_S)
    result.load_once, result.load_killed = run, run is None


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def onnx_load_line(result: Result) -> str:
    run = result.load_once
    if run is None:
        return (f"onnx.load neither failed nor finished within {FAILURE_TIMEOUT_S:g} s: "
                "killed")
    if run.error is not None:
        return (f"onnx.load cannot open it: {_short(run.error)}\n"
                f"  (failed after {run.seconds:.2f} s, having needed +{run.increase / MB:.1f} "
                f"MB; process peak RSS {run.process_peak_rss / MB:.1f} MB)")
    limit = ("below" if result.model_bytes <= PROTOBUF_LIMIT else "above")
    return (f"onnx.load opened it (file {limit} protobuf's 2 GiB limit): {run.seconds:.3f} s, "
            f"+RSS {run.increase / MB:.1f} MB, peak RSS {run.process_peak_rss / MB:.1f} MB "
            "(one run)")


def report(result: Result) -> str:
    size = f"{result.model_bytes / MB:.1f} MB"
    if result.model_bytes >= GIB:
        size += f" ({result.model_bytes / GIB:.2f} GiB)"
    lines = [
        f"model {result.model.name}: {size}, {result.tensors} tensors, "
        f"{(result.payload_bytes or 0) / MB:.1f} MB of payload; {result.runs} run(s) per "
        f"variant, {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, "
        f"RSS floor {harness.rss_floor() / MB:.1f} MB",
        "",
        f"{'variant':<11}{'median s':>10}{'min s':>9}{'max s':>9}{'imports MB':>12}"
        f"{'+RSS MB':>9}{'peak RSS MB':>13}",
    ]
    for v in result.variants:
        f = v.figures()
        lines.append(f"{v.name:<11}{f['median_s']:>10.4f}{f['min_s']:>9.4f}{f['max_s']:>9.4f}"
                     f"{statistics.median(f['baseline_rss_bytes']) / MB:>12.1f}"
                     f"{f['max_rss_increase_bytes'] / MB:>9.1f}"
                     f"{f['max_peak_rss_bytes'] / MB:>13.1f}")
    lines += ["(time: the operation alone; imports MB: RSS after the imports; +RSS MB: the "
              "increase the operation caused; peak RSS MB: the whole process)"]
    if result.title == "big":
        lines += ["", onnx_load_line(result)]
    lines += ["", *harness.target_table(result.checks, "check", 32, 8)]
    return "\n".join(lines)


def as_json(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {"file": result.model.name, "bytes": result.model_bytes,
                  "tensors": result.tensors, "payload_bytes": result.payload_bytes},
        "runs": result.runs,
        "variants": {v.name: v.figures() for v in result.variants},
        "checks": [c.as_json() for c in result.checks],
    }
    if result.title == "big":
        run = result.load_once
        out["onnx_load_once"] = None if run is None else {
            "seconds": run.seconds, "error": run.error, "rss_increase_bytes": run.increase,
            "peak_rss_bytes": run.process_peak_rss}
        out["onnx_load_killed_after_s"] = FAILURE_TIMEOUT_S if result.load_killed else None
    return out


def run_all(runs: int, big_gib: float, workdir: Path) -> list[Result]:
    results = []
    encoder = make_encoder_model(workdir)
    big = make_big_model(workdir, big_gib)
    steps: list[tuple[str, Path, list[str], Callable[[Result], list[Target]]]] = [
        ("encoder", encoder, ["catalogue", "onnx.load", "read"], encoder_checks),
        ("big", big, ["catalogue", "read"], big_checks),
    ]
    for title, model, names, checks in steps:
        result = bench_model(title, model, names, runs, workdir)
        if title == "big":
            try_onnx_load(result, workdir)
        result.checks = checks(result)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per variant (default 5)")
    p.add_argument("--big-gib", type=float, default=2.5,
                   help="weights in the big single-file model, in GiB (default 2.5; above 2 "
                        "onnx.load cannot open it)")
    harness.add_common_arguments(p, "the models and logs")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.big_gib <= 0:
        p.error("--big-gib must be positive")
    if args.big_gib * GIB <= PROTOBUF_LIMIT:
        harness.log(f"note: {args.big_gib:g} GiB is below protobuf's 2 GiB limit; onnx.load "
                    "may open the big model")

    results = harness.in_workdir(args.workdir, args.keep,
                                 lambda workdir: run_all(args.runs, args.big_gib, workdir))
    if results is None:
        return 2
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "rss_floor_bytes": harness.rss_floor(),
                          "models": [as_json(r) for r in results]}, indent=2))
    else:
        print("\n\n".join(report(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
