"""Measure resolving and loading a build by store reference against its package folder.

Usage: ``python bench/store_reference.py [--hidden 384] [--runs 5] [--workdir DIR] [--keep]
[--json]``

A BERT-like encoder (``tests/samples.make_encoder``, 6 layers, ``--hidden`` wide) is built
once (in a subprocess) into a combined, 4096-aligned layout with its store and action
record (the model and recipe of ``bench/resolve.py``). Then, ``--runs`` times, a fresh process:

* ``resolve``: ``weightstore.resolve(folder)`` and ``weightstore.resolve("encoder/1/release",
  store=...)``, interleaved, ten times each after one warm-up call of each (medians kept):
  the store reference's own cost is the index lookup, the action record's MAC, and
  re-hashing ``summary.json`` and the model file against their keys;
* the weight objects the reference's resolution opened (payload bytes read: 0 expected);
* ``load``: ``weightstore.load`` of each, interleaved, three times each: bytes read against
  the manifest's live bytes, and the outputs of one run compared bit for bit.

Targets: resolution from a reference <= 1.5x resolution from the folder; 0 weight objects
opened by it; load bytes read / live bytes = 1.00 from the store; outputs identical. The
machine is shared: medians of ``--runs`` processes are reported, with the load average. A
measurement, not a gate: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target
from resolve import GENERATE_ENCODER  # the same encoder and recipe as bench/resolve.py

BUILD = GENERATE_ENCODER + r'''
from weightstore.builder import BuildOptions, build
build(folder / "recipe.yaml", BuildOptions(jobs=2))
'''

MEASURE = r'''
import json, os, statistics, sys, time
from pathlib import Path
import numpy as np
import weightstore
from weightstore.load import LoadReport, WeightManager
folder = Path(sys.argv[1])
package, store = folder / "out" / "encoder" / "1" / "release", folder / "store"
ref = "encoder/1/release"
with np.load(folder / "feed.npz") as npz:
    feed = {k: npz[k] for k in npz.files}
def resolve(source):
    return weightstore.resolve(source, store=store)
for source in (package, ref):
    resolve(source).close()
times = {"folder": [], "reference": []}
for _ in range(10):
    for name, source in (("folder", package), ("reference", ref)):
        start = time.perf_counter()
        r = resolve(source)
        times[name].append(time.perf_counter() - start)
        r.close()
opened = []
real_open = os.open
def spy(path, *args, **kwargs):
    opened.append(os.fspath(path))
    return real_open(path, *args, **kwargs)
os.open = spy
with resolve(ref) as r:
    keys = set(r.source.store_keys.values())
os.open = real_open
weights = {str(v.path) for v in r.source.store.locate(keys).values()}
payload_opens = [p for p in opened if p in weights]
loads = {"folder": [], "reference": []}
reads = {}
outputs = {}
for _ in range(3):
    for name, source in (("folder", package), ("reference", ref)):
        with resolve(source) as r:
            report = LoadReport()
            start = time.perf_counter()
            session = weightstore.load(r, report=report, manager=WeightManager())
            loads[name].append(time.perf_counter() - start)
            reads[name] = (report.read_bytes, report.live_bytes)
            outputs[name] = session.run(None, feed)
same = all(np.array_equal(a, b) for a, b in zip(outputs["folder"], outputs["reference"]))
print(json.dumps({"resolve": {k: statistics.median(v) for k, v in times.items()},
                  "load": {k: statistics.median(v) for k, v in loads.items()},
                  "reads": reads, "same": same, "opened": len(opened),
                  "payload_opens": payload_opens}))
'''


def measure(folder: Path, hidden: int, runs: int) -> dict[str, Any]:
    os.environ["XDG_CACHE_HOME"] = str(folder / "cache")  # the action record's secret
    if not (folder / "out").is_dir():
        harness.log(f"building the encoder (hidden {hidden})")
        harness.run_process([sys.executable, "-c", BUILD, str(folder), str(hidden),
                             str(harness.REPO)], folder, "build")
    results = []
    for i in range(runs):
        harness.log(f"run {i + 1}/{runs}")
        out = harness.run_process([sys.executable, "-c", MEASURE, str(folder)], folder,
                                  "measure").output
        results.append(json.loads(out.strip().splitlines()[-1]))
    size = sum(p.stat().st_size for p in (folder / "out").rglob("*_weight_combined"))

    def med(*path: str) -> float:
        values = []
        for r in results:
            value: Any = r
            for p in path:
                value = value[p]
            values.append(value)
        return statistics.median(values)

    read, live = results[-1]["reads"]["reference"]
    return {"weights_mb": size / MB, "runs": runs, "load_average": os.getloadavg()[0],
            "resolve_folder_ms": med("resolve", "folder") * 1e3,
            "resolve_reference_ms": med("resolve", "reference") * 1e3,
            "load_folder_ms": med("load", "folder") * 1e3,
            "load_reference_ms": med("load", "reference") * 1e3,
            "read_bytes": read, "live_bytes": live,
            "payload_opens": max(len(r["payload_opens"]) for r in results),
            "identical_outputs": all(r["same"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--runs", type=int, default=5)
    harness.add_common_arguments(parser, "the built package and its store")
    args = parser.parse_args()
    summary = harness.in_workdir(args.workdir, args.keep,
                                 lambda folder: measure(folder, args.hidden, args.runs))
    if summary is None:
        return 1
    targets = [
        Target("resolve reference / folder", summary["resolve_reference_ms"]
               / summary["resolve_folder_ms"], 1.5),
        Target("weight objects opened by resolution", summary["payload_opens"], 0, 0),
        Target("load read / live bytes (reference)", summary["read_bytes"]
               / summary["live_bytes"], 1.0),
        Target("load reference / folder", summary["load_reference_ms"]
               / summary["load_folder_ms"], None),
    ]

    def text() -> str:
        lines = [f"encoder, {summary['weights_mb']:.1f} MB of weights, medians of "
                 f"{summary['runs']} processes (load average {summary['load_average']:.2f})",
                 f"resolve: folder {summary['resolve_folder_ms']:.1f} ms, reference "
                 f"{summary['resolve_reference_ms']:.1f} ms",
                 f"load:    folder {summary['load_folder_ms']:.1f} ms, reference "
                 f"{summary['load_reference_ms']:.1f} ms",
                 f"outputs identical: {summary['identical_outputs']}", ""]
        return "\n".join(lines + harness.target_table(targets, "figure", 40, 10))

    harness.print_figures(args.json, summary, targets, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
