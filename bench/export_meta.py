"""Measure what ``weightstore store export-meta`` costs now that it proves every row.

Usage: ``python bench/export_meta.py [--size-mb 300] [--runs 5] [--workdir DIR] [--keep]
[--json]``

A store of ``--size-mb`` of payloads is filled once: half in 1 MB per-weight objects, half
in 1 MB ranges of combined files (4096-aligned), 4 KiB payloads between them so that the
index has rows of both sizes. Then, ``--runs`` times, interleaved, each in a fresh process:

* ``export-meta``: ``weightstore store export-meta --output ...`` (every row checked against
  its file and its bytes hashed against its key, streamed, before anything is written);
* ``index only``: the rows streamed from the index into GE's maps with no check, which is
  what ``export-meta`` did before it verified (``weightstore.store.meta.export_meta`` over
  ``Index.rows``), for the cost of the check itself;
* ``cat``: ``cat`` of every object file to ``/dev/null``, the floor of any export that
  reads every payload.

The page cache is warm for every variant (the store is read once before the first run):
the figures compare hashing and checking, not the disk. No target: a measurement for
scale, the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target

FILL = r"""
import os, sys
from weightstore.store import BytesPayload, WeightStore
store = WeightStore(sys.argv[1])
total = int(sys.argv[2])
chunk = 1_000_000
count = max(2, total // chunk)
big = [BytesPayload.of(os.urandom(chunk), "blake3") for _ in range(count)]
small = [BytesPayload.of(os.urandom(4096), "blake3") for _ in range(count)]
half = count // 2
store.put(big[:half] + small[:half], kind="separate", jobs=2)
for n in range(0, count - half, 50):
    part = big[half + n: half + n + 50] + small[half + n: half + n + 50]
    store.put(part, kind="combined", combined_name=f"model{n // 50}", alignment=4096, jobs=2)
print(sum(p.size for p in big + small))
"""

INDEX_ONLY = r"""
import sys
from pathlib import Path
from weightstore.store import WeightStore
from weightstore.store.index import INDEX_NAME
from weightstore.store.meta import export_meta
store = WeightStore(sys.argv[1])
with store.index.reading() as conn:
    export_meta(Path(sys.argv[2]), lambda: store.index.rows(conn), INDEX_NAME)
"""


def object_files(store: Path) -> list[str]:
    return sorted(str(store / name) for name in os.listdir(store)
                  if name.startswith("weight_") or name.endswith("_weight_combined"))


def measure(folder: Path, size_mb: int, runs: int) -> dict[str, Any]:
    store = folder / "store"
    if not store.is_dir():
        harness.log(f"filling a store of {size_mb} MB")
        harness.run_process([sys.executable, "-c", FILL, str(store), str(size_mb * MB)],
                            folder, "fill")
    files = object_files(store)
    stored = sum(os.path.getsize(f) for f in files)
    variants = {
        "export-meta": [sys.executable, "-m", "weightstore", "store", "export-meta",
                        "--store", str(store), "--output", str(folder / "meta.json")],
        "index only": [sys.executable, "-c", INDEX_ONLY, str(store),
                       str(folder / "meta-index-only.json")],
        "cat": ["sh", "-c", 'cat "$@" > /dev/null', "cat", *files],
    }
    harness.run_process(variants["cat"], folder, "warm")  # the page cache, for all alike
    times: dict[str, list[float]] = {name: [] for name in variants}
    for n in range(runs):
        harness.log(f"round {n + 1} of {runs}")
        for name, argv in variants.items():
            times[name].append(harness.run_process(argv, folder, name.replace(" ", "_"))
                               .seconds)
    same = (folder / "meta.json").read_bytes() == (folder / "meta-index-only.json").read_bytes()
    return {"stored_mb": stored / MB, "files": len(files), "runs": runs,
            "load_average": os.getloadavg()[0], "same_bytes": same,
            **{f"{name}_s": statistics.median(t) for name, t in times.items()},
            **{f"{name}_range_s": [min(t), max(t)] for name, t in times.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    harness.add_common_arguments(parser, "the store")
    args = parser.parse_args()
    summary = harness.in_workdir(args.workdir, args.keep,
                                 lambda folder: measure(folder, args.size_mb, args.runs))
    if summary is None:
        return 1
    targets = [
        Target("export-meta / index only", summary["export-meta_s"]
               / summary["index only_s"], None),
        Target("export-meta / cat", summary["export-meta_s"] / summary["cat_s"], None),
    ]

    def text() -> str:
        lines = [f"store of {summary['stored_mb']:.0f} MB in {summary['files']} files, "
                 f"medians of {summary['runs']} processes (load average "
                 f"{summary['load_average']:.2f}); same bytes: {summary['same_bytes']}"]
        for name in ("export-meta", "index only", "cat"):
            low, high = summary[f"{name}_range_s"]
            lines.append(f"{name:<12} {summary[f'{name}_s']:.3f} s  ({low:.3f} .. {high:.3f})")
        return "\n".join([*lines, "", *harness.target_table(targets, "figure", 28, 10)])

    harness.print_figures(args.json, summary, targets, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
