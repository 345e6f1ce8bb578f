"""Measure the store at scale: builds, puts, lock holds, concurrent builds and gc.

Usage: ``python bench/store_scale.py [--sizes 0,10000,100000,1000000] [--runs 3]
[--big-mb 200] [--lock-mb 1000] [--workdir DIR] [--keep] [--json]``

Stores are prefilled through the index API (:class:`weightstore.store.index.Index`), the
way a store that served ~``N/300`` model versions would look: ``N`` rows of 4 KiB
objects in combined files of 10,000 objects each (the files are sparse), and roots that
reference 90% of them (300 keys per root, each root a package folder holding its
``summary.json``), so that 10% is garbage.

Measured, each command in a fresh process (medians of ``--runs``; the machine is shared,
so figures are noisy):

* ``weightstore build recipes/tiny-bert.yaml`` (34 weights, 5 layouts) into a copy of each
  prefilled store: wall time and peak RSS, as ratios to the empty store;
* ``WeightStore.put`` of one new 4 KiB payload into each store (in-process latency, the
  median of 20 puts after one warm-up);
* the longest store-wide critical section (the index's write transaction) during a build
  of a ``--lock-mb`` model (inline weights, combined layout);
* two builds of two different ``--big-mb`` models into one fresh store, at the same time,
  against the same two builds one after the other (each with its own output folder), with
  the default worker count and with ``--jobs 1`` (on a 2-core machine, two builds that
  each use every core cannot overlap much: the second figure shows what the store's
  locking allows);
* ``weightstore store gc`` of the largest prefilled store (10% garbage).

Targets (issue 8): at 1M objects, build time <= 1.2x the empty store and peak RSS <= +50
MB; ``put`` <= 20 ms; store-wide lock hold <= 50 ms for a 1 GB build; concurrent pair
<= 0.75x serial. gc has no target: its time is shown for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target

TINY_BERT = harness.REPO / "examples" / "tiny_bert" / "model.onnx"
OBJECT_SIZE = 4096
PER_FILE = 10_000
KEYS_PER_ROOT = 300

PREFILL = r"""
import json, os, sys, time
from pathlib import Path
from weightstore.store import WeightStore, RootRecord
from weightstore.store.objects import StoredObject
from weightstore.store import roots

root, n, size, per_file, per_root = Path(sys.argv[1]), *map(int, sys.argv[2:6])
store = WeightStore(root)
store.put([], kind="separate")
index = store.index
def key(i):
    return "blake3:" + (i.to_bytes(8, "big") * 4).hex()
with index.writing() as conn:
    pass  # creates the schema
batch = 50_000
for start in range(0, n, batch):
    with index.writing() as conn:
        index.insert(conn, (StoredObject(key(i), f"prefill{i // per_file}_weight_combined",
                                         (i % per_file) * size, size)
                            for i in range(start, min(n, start + batch))))
for f in range((n + per_file - 1) // per_file):
    with open(root / f"prefill{f}_weight_combined", "wb") as fh:
        fh.truncate(min(per_file, n - f * per_file) * size)
live = n * 9 // 10
packages = root.parent / "packages"
with index.writing() as conn:
    for r in range(0, live, per_root):
        folder = packages / f"p{r // per_root}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps({"fingerprint": f"fp{r}"}))
        record = RootRecord("pkg", str(r // per_root), "l", str(folder), f"fp{r}")
        roots.register(conn, record, [key(i) for i in range(r, min(live, r + per_root))])
with index.writing() as conn:
    pass
conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
print(json.dumps({"objects": n}))
"""

PUT = r"""
import json, os, sys, time, statistics
from weightstore.store import WeightStore, BytesPayload
store = WeightStore(sys.argv[1])
times = []
for i in range(21):
    p = BytesPayload.of(os.urandom(4096))
    t = time.perf_counter()
    store.put([p], kind="separate")
    times.append(time.perf_counter() - t)
print(json.dumps({"median": statistics.median(times[1:]), "max": max(times[1:]),
                  "lock": max(store.index.write_holds)}))
"""

LOCK_BUILD = r"""
import json, sys
import weightstore.store.index as index_module
holds = []
real = index_module.Index.__init__
def init(self, *a, **k):
    real(self, *a, **k)
    holds.append(self.write_holds)
index_module.Index.__init__ = init
from weightstore.builder import build, BuildOptions
result = build(sys.argv[1], BuildOptions(store=sys.argv[2]))
all_holds = [h for hs in holds for h in hs]
print(json.dumps({"max_hold": max(all_holds), "transactions": len(all_holds),
                  "written_bytes": result.store_report["written_bytes"]}))
"""

GENERATE = r"""
import sys
from tests.samples import write_large_single_file
write_large_single_file(sys.argv[1], int(sys.argv[2]), seed=int(sys.argv[3]))
"""


def weightstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "weightstore", *args]


def recipe(workdir: Path, name: str, model: Path, output: Path, layouts: str) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(f"package: {name}\nversion: '1.0.0'\nstore: {{hash: blake3}}\n"
                    f"models:\n  - {{name: m, source: {model}}}\nlayouts:\n{layouts}"
                    f"output: {output}\n")
    return path


TINY_LAYOUTS = "".join(  # recipes/tiny-bert.yaml's layouts
    f"  - {{name: {name}, {rest}}}\n" for name, rest in (
        ("embedded", "external_weight: embedded"),
        ("separate", "external_weight: separate, size_threshold: 1024"),
        ("release", "external_weight: combined, alignment: 512, size_threshold: 1024"),
        ("ge-separate", "external_weight: separate, size_threshold: 1024, "
                        "constants: file-constant"),
        ("ge-combined", "external_weight: combined, alignment: 512, size_threshold: 1024, "
                        "constants: file-constant")))
BIG_LAYOUT = "  - {name: release, external_weight: combined, alignment: 512}\n"


def prefill(workdir: Path, n: int) -> Path:
    root = workdir / f"prefilled-{n}" / "store"
    if (root / "index.sqlite").exists():
        return root
    shutil.rmtree(root.parent, ignore_errors=True)
    root.parent.mkdir(parents=True)
    harness.log(f"prefilling a store with {n} objects ...")
    run = harness.run_process([sys.executable, "-c", PREFILL, str(root), str(n),
                               str(OBJECT_SIZE), str(PER_FILE), str(KEYS_PER_ROOT)],
                              workdir, f"prefill-{n}")
    harness.log(f"  done in {run.seconds:.1f} s")
    return root


def fresh_copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst.parent, ignore_errors=True)
    def link_data(a: str, b: str) -> None:
        """The prefilled data files are only read (or unlinked by gc): link them, so that
        no run copies gigabytes of zeros; everything else (the index) is copied."""
        if a.endswith("_weight_combined") and "prefill" in os.path.basename(a):
            os.link(a, b)
        else:
            shutil.copy2(a, b)

    shutil.copytree(src.parent, dst.parent, symlinks=True, copy_function=link_data)
    os.sync()  # the copy's writeback must not slow the measured command's fsyncs
    return dst


def build_figures(workdir: Path, sizes: list[int], runs: int) -> dict[int, dict[str, float]]:
    """Runs interleave the sizes (0, 10k, ..., 0, 10k, ...), so that drift in the
    machine's load hits every size alike; run -1 warms the bytecode and file caches."""
    sources = {n: prefill(workdir, n) for n in sizes}
    found: dict[int, dict[str, list[float]]] = {
        n: {"build_s": [], "build_cpu_s": [], "rss": [], "put_s": [], "put_lock_s": []}
        for n in sizes}
    for r in range(-1, runs):
        for n in sizes:
            store = fresh_copy(sources[n], workdir / "run" / "store")
            rec = recipe(workdir, "tiny-bert", TINY_BERT, workdir / "run" / "dist", TINY_LAYOUTS)
            p = harness.run_process(weightstore("build", str(rec), "--store", str(store)),
                                    workdir, f"build-{n}-{r}")
            q = harness.run_process([sys.executable, "-c", PUT, str(store)], workdir,
                                    f"put-{n}-{r}")
            if r < 0:
                continue
            doc = json.loads(q.output)
            for name, value in (("build_s", p.seconds), ("build_cpu_s", p.cpu_seconds),
                                ("rss", p.peak_rss),
                                ("put_s", doc["median"]), ("put_lock_s", doc["lock"])):
                found[n][name].append(value)
    out = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in found.items()}
    for n, b in out.items():
        harness.log(f"  {n:>8} objects: build {b['build_s']:.2f} s, "
                    f"RSS {b['rss'] / MB:.0f} MB, put {b['put_s'] * 1e3:.1f} ms")
    return out


def big_model(workdir: Path, mb: int, seed: int) -> Path:
    path = workdir / f"big-{mb}-{seed}.onnx"
    if not path.exists():
        harness.log(f"generating a {mb} MB model (seed {seed}) ...")
        harness.run_process([sys.executable, "-c", GENERATE, str(path), str(mb * MB),
                             str(seed)], workdir, f"gen-{mb}-{seed}")
    return path


def lock_figure(workdir: Path, mb: int) -> dict[str, Any]:
    model = big_model(workdir, mb, 7)
    run_dir = workdir / "lock"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    rec = recipe(run_dir, "big", model, run_dir / "dist", BIG_LAYOUT)
    p = harness.run_process([sys.executable, "-c", LOCK_BUILD, str(rec),
                             str(run_dir / "store")], workdir, "lock-build")
    doc = json.loads(p.output)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {**doc, "seconds": p.seconds}


def concurrency_figures(workdir: Path, mb: int, runs: int, jobs: list[str],
                        ) -> dict[str, float]:
    """Wall time of the pair, one after the other and at the same time; ``jobs`` is
    passed to both builds (empty: their default, one worker per core)."""
    models = [big_model(workdir, mb, seed) for seed in (1, 2)]
    serial, together = [], []
    for r in range(runs):
        for mode in ("serial", "concurrent"):
            run_dir = workdir / "pair"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir()
            recs = [recipe(run_dir, f"big{i}", m, run_dir / f"dist{i}", BIG_LAYOUT)
                    for i, m in enumerate(models)]
            argv = [weightstore("build", str(rec), "--store", str(run_dir / "store"), *jobs)
                    for rec in recs]
            logs = [f"pair-{r}-{mode}-{i}{''.join(jobs)}" for i in range(len(argv))]
            start = time.perf_counter()
            if mode == "serial":
                for a, name in zip(argv, logs, strict=True):
                    harness.run_process(a, workdir, name)
            else:
                with ThreadPoolExecutor(len(argv)) as pool:
                    list(pool.map(lambda a, name: harness.run_process(a, workdir, name),
                                  argv, logs))
            (serial if mode == "serial" else together).append(time.perf_counter() - start)
    shutil.rmtree(workdir / "pair", ignore_errors=True)
    return {"serial_s": statistics.median(serial), "concurrent_s": statistics.median(together)}


def gc_figure(workdir: Path, n: int, runs: int) -> dict[str, float]:
    src = prefill(workdir, n)
    times, deleted = [], 0
    for r in range(runs):
        store = fresh_copy(src, workdir / "gc" / "store")
        p = harness.run_process(weightstore("store", "gc", "--json", "--store", str(store)),
                                workdir, f"gc-{r}")
        deleted = json.loads(p.output)["deleted_objects"]
        times.append(p.seconds)
    shutil.rmtree(workdir / "gc", ignore_errors=True)
    return {"gc_s": statistics.median(times), "deleted": deleted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,10000,100000,1000000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big-mb", type=int, default=200)
    parser.add_argument("--lock-mb", type=int, default=1000)
    parser.add_argument("--only", choices=("builds", "lock", "pair", "gc"),
                        help="run one part only (and print its figures as JSON)")
    harness.add_common_arguments(parser, "prefilled stores and generated models")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    def work(workdir: Path) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        if args.only in (None, "builds"):
            parts["builds"] = build_figures(workdir, sizes, args.runs)
        if args.only in (None, "lock"):
            harness.log(f"building a {args.lock_mb} MB model to time the store-wide lock ...")
            parts["lock"] = lock_figure(workdir, args.lock_mb)
        if args.only in (None, "pair"):
            harness.log(f"two {args.big_mb} MB builds, serial and concurrent ...")
            pair = concurrency_figures(workdir, args.big_mb, args.runs, [])
            pair1 = concurrency_figures(workdir, args.big_mb, args.runs, ["--jobs", "1"])
            parts["pair"] = {**pair, **{f"{k}_jobs1": v for k, v in pair1.items()}}
        if args.only in (None, "gc"):
            harness.log(f"gc of the {sizes[-1]}-object store ...")
            parts["gc"] = gc_figure(workdir, sizes[-1], args.runs)
        return parts

    found = harness.in_workdir(args.workdir, args.keep, work)
    if found is None:
        return 2
    if args.only is not None:
        part = found[args.only]
        if args.only == "builds":
            part = {str(k): v for k, v in part.items()}
        print(json.dumps(part, indent=2))
        return 0
    builds, lock, pair, gc = found["builds"], found["lock"], found["pair"], found["gc"]
    base, top = builds[sizes[0]], builds[sizes[-1]]
    targets = [
        Target(f"build time at {sizes[-1]} / empty (x)", top["build_s"] / base["build_s"], 1.2),
        Target(f"build CPU time at {sizes[-1]} / empty (x)",
               top["build_cpu_s"] / base["build_cpu_s"], 1.2),
        Target(f"peak RSS at {sizes[-1]} - empty (MB)", (top["rss"] - base["rss"]) / MB, 50, 1),
        Target(f"put of one 4 KiB payload at {sizes[-1]} (ms)", top["put_s"] * 1e3, 20, 1),
        Target(f"store-wide lock hold, {args.lock_mb} MB build (ms)",
               lock["max_hold"] * 1e3, 50, 1),
        Target(f"two {args.big_mb} MB builds, concurrent / serial (x)",
               pair["concurrent_s"] / pair["serial_s"], 0.75),
        Target("the same with --jobs 1, concurrent / serial (x)",
               pair["concurrent_s_jobs1"] / pair["serial_s_jobs1"], 0.75),
        Target(f"gc of {sizes[-1]} objects, 10% garbage (s)", gc["gc_s"], None, 1),
    ]
    if args.json:
        print(json.dumps({"builds": {str(k): v for k, v in builds.items()}, "lock": lock,
                          "pair": pair, "gc": gc, "targets": [t.as_json() for t in targets]},
                         indent=2))
    else:
        print(f"{'objects':>10} {'build s':>9} {'x empty':>8} {'CPU s':>7} {'x empty':>8} "
              f"{'RSS MB':>8} {'put ms':>8} {'put lock ms':>12}")
        for n, b in builds.items():
            print(f"{n:>10} {b['build_s']:>9.2f} {b['build_s'] / base['build_s']:>8.2f} "
                  f"{b['build_cpu_s']:>7.2f} {b['build_cpu_s'] / base['build_cpu_s']:>8.2f} "
                  f"{b['rss'] / MB:>8.0f} {b['put_s'] * 1e3:>8.1f} {b['put_lock_s'] * 1e3:>12.2f}")
        print(f"\n{args.lock_mb} MB build: {lock['seconds']:.1f} s, {lock['transactions']} index "
              f"transactions, longest {lock['max_hold'] * 1e3:.1f} ms")
        print(f"two {args.big_mb} MB builds: serial {pair['serial_s']:.1f} s, concurrent "
              f"{pair['concurrent_s']:.1f} s; with --jobs 1: serial "
              f"{pair['serial_s_jobs1']:.1f} s, concurrent {pair['concurrent_s_jobs1']:.1f} s")
        print(f"gc: {gc['deleted']} objects deleted in {gc['gc_s']:.1f} s\n")
        print("\n".join(harness.target_table(targets, "figure (medians; noisy shared machine)",
                                             52, 10)))
    return 0 if all(t.passed is not False for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
