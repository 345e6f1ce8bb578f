"""Measure the commands that decide liveness against their pre-migration selves and onnx.load.

Usage: ``python bench/liveness.py [--model PATH]... [--layers 24] [--runs 5]
[--baseline REV] [--workdir DIR] [--keep] [--json]``

``check``, ``check --verify``, ``bundle``, ``resolve --json`` and a split-layout build all
resolve a variant with the phases a load resolves with (replay, cleanup, constant-result
analysis folding known ``If`` conditions, payload closure). Each is timed here on two
models, each packaged by a small recipe (a ``half`` scenario of ``cast-fp16, cleanup``; a
combined layout split by scenario; an ``npu`` device running ``half`` and a ``reference``
device running the default graph):

* ``encoder``: ``tests/samples.make_encoder`` with ``--layers`` layers (default 24): word,
  position and token-type embeddings, LayerNorms, Q/K/V and output MatMuls with biases,
  a GELU function, an FFN per layer, Constants with typed fields, an ``If`` on a dynamic
  input: hundreds of small tensors;
* each ``--model`` (default: ``silero_vad.onnx`` of the ``shared/corpus`` folder beside
  the checkout, when present): a real export, whose weights sit in Constant nodes inside
  nested ``If`` subgraphs.

Two comparisons, in the same rounds:

* ``--baseline REV`` (default ``4cbcf0e^``, the last commit before ``check``, bundles and
  the build's split planning moved onto resolution's phases): a temporary git worktree of
  that commit builds its own packages from the same recipes and runs the same commands;
* ``onnx.load`` of the packaged model with its external data (the bytes ``check
  --verify`` hashes), and without it (``onnx.load(..., load_external_data=False)``: what
  a metadata-only ``resolve`` reads), the alternative a user would reach for.

Every figure comes twice: the whole process (``python -m weightstore ...``, fresh each
time, imports included), and in-process (one fresh process per checkout and round calls
each operation once to warm up, then ``--calls`` times; the median of those, wall and CPU
seconds). Rounds alternate the checkouts; medians over ``--runs`` rounds are reported, with
the load average before and after (the machine is shared: expect noise, CPU seconds are
the steadier figure). Targets: ``check`` and ``bundle`` within 1.5x of the baseline;
``check`` and ``resolve --json`` no slower than the matching ``onnx.load`` as whole
processes. A measurement, not a gate: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness
from harness import Target

DEFAULT_LAYERS, DEFAULT_RUNS, DEFAULT_CALLS = 24, 5, 7
DEFAULT_BASELINE = "4cbcf0e^"
CORPUS_MODEL = harness.REPO.parent / "shared" / "corpus" / "silero_vad.onnx"
COMMANDS = ("check", "check --verify", "bundle", "resolve --json", "build (split)")
LOADS = ("onnx.load", "onnx.load (no external data)")

GENERATE_ENCODER = r'''
import sys
import onnx
sys.path.insert(0, sys.argv[3])
from tests.samples import make_encoder
onnx.save(make_encoder(layers=int(sys.argv[2]), name="encoder"), sys.argv[1])
'''

RECIPE = """package: {name}
version: "1"
store: {{path: {folder}/store}}
models:
  - name: {name}
    source: {source}
    scenarios:
      - {{name: half, passes: [cast-fp16, cleanup], requires: {{accelerator: npu}}}}
layouts:
  - {{name: release, external_weight: combined, alignment: 512, size_threshold: 1024,
     split: scenario}}
devices:
  - {{name: npu, capabilities: {{accelerator: npu}}, scenario: auto}}
  - {{name: reference, scenario: null}}
output: {folder}/out
"""

INPROCESS = r'''
import json, shutil, statistics, sys, time
recipe, package, bundle_dir, model, calls = sys.argv[1:6]
import onnx
import weightstore
from weightstore.builder import BuildOptions, build
from weightstore.packaging.bundles import assemble
from weightstore.packaging.check import check_package

def bundle():
    shutil.rmtree(bundle_dir, ignore_errors=True)
    assemble(package, "npu", bundle_dir)

import inspect
from weightstore.resolve import api as resolve_api
# the resolution itself each time, not the record the first call keeps (trees that keep
# none have no such option)
UNCACHED = ({"cache": False} if "cache" in inspect.signature(resolve_api.resolve).parameters
            else {})

def resolve_json():
    with weightstore.resolve(package, **UNCACHED) as r:
        json.dumps(r.to_dict())

operations = {
    "check": lambda: check_package(package),
    "check --verify": lambda: check_package(package, verify=True),
    "bundle": bundle,
    "resolve --json": resolve_json,
    "build (split)": lambda: build(recipe, BuildOptions(force=True)),
    "onnx.load": lambda: onnx.load(model),
    "onnx.load (no external data)": lambda: onnx.load(model, load_external_data=False),
}
out = {"weightstore": weightstore.__file__}
for name, call in operations.items():
    call()  # first call: one-time costs (schema registries, caches) paid
    wall, cpu = [], []
    for _ in range(int(calls)):
        w, c = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    out[name] = {"seconds": statistics.median(wall), "cpu_seconds": statistics.median(cpu)}
print(json.dumps(out))
'''

LOAD = "import sys, onnx; onnx.load(sys.argv[1], load_external_data=sys.argv[2] == '1')"


def baseline_checkout(rev: str, workdir: Path) -> Path | None:
    """A detached worktree of ``rev`` in the workdir (made once), or None without git."""
    folder = workdir / "baseline-checkout"
    if (folder / "weightstore").is_dir():
        return folder
    try:
        subprocess.run(["git", "-C", str(harness.REPO), "worktree", "add", "--detach",
                        str(folder), rev], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        harness.log(f"no baseline ({rev}): {getattr(exc, 'stderr', b'') or exc}")
        return None
    return folder


def drop_checkout(folder: Path) -> None:
    subprocess.run(["git", "-C", str(harness.REPO), "worktree", "remove", "--force",
                    str(folder)], capture_output=True)


def prepare(models: dict[str, Path], checkouts: dict[str, Path], layers: int,
            workdir: Path) -> dict[tuple[str, str], Path]:
    """Per checkout and model: a folder with its recipe, built by that checkout."""
    if "encoder" in models and not models["encoder"].is_file():
        harness.run_process([sys.executable, "-c", GENERATE_ENCODER, str(models["encoder"]),
                             str(layers), str(harness.REPO)], workdir, "generate-encoder")
    out = {}
    for tree, checkout in checkouts.items():
        for name, source in models.items():
            folder = workdir / tree / name
            if not (folder / "out").is_dir():
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "recipe.yaml").write_text(
                    RECIPE.format(name=name, folder=folder, source=source.resolve()))
                harness.log(f"building {name} with {tree}")
                harness.run_process([sys.executable, "-m", "weightstore", "-q", "build",
                                     str(folder / "recipe.yaml")], workdir,
                                    f"build-{tree}-{name}", checkout=checkout, cwd=workdir)
            out[(tree, name)] = folder
    return out


def package_of(folder: Path, name: str) -> Path:
    return folder / "out" / name / "1" / "release"


def whole(tree: str, checkout: Path, folder: Path, name: str,
          workdir: Path) -> dict[str, dict[str, float]]:
    """Each command, and onnx.load, in a fresh process of its own."""
    package = package_of(folder, name)
    bundle = folder / "bundle"
    argv = {
        "check": ["check", str(package)],
        "check --verify": ["check", str(package), "--verify"],
        "bundle": ["bundle", str(package), "npu", "--output", str(bundle)],
        "resolve --json": ["resolve", str(package), "--json"],
        "build (split)": ["build", str(folder / "recipe.yaml"), "--force"],
    }
    out = {}
    for command, args in argv.items():
        shutil.rmtree(bundle, ignore_errors=True)
        # resolve with an empty user cache: the resolution itself, not a record of it
        fresh = workdir / "user-cache"
        shutil.rmtree(fresh, ignore_errors=True)
        proc = harness.run_process([sys.executable, "-m", "weightstore", "-q", *args],
                                   workdir, f"{tree}-{name}", checkout=checkout, cwd=workdir,
                                   env={"XDG_CACHE_HOME": str(fresh)}
                                   if command.startswith("resolve") else None)
        out[command] = {"seconds": proc.seconds, "cpu_seconds": proc.cpu_seconds}
    for label, external in zip(LOADS, ("1", "0"), strict=True):
        proc = harness.run_process([sys.executable, "-c", LOAD,
                                    str(package / f"{name}.onnx"), external], workdir,
                                   f"{tree}-{name}-load", checkout=checkout, cwd=workdir)
        out[label] = {"seconds": proc.seconds, "cpu_seconds": proc.cpu_seconds}
    return out


def in_process(tree: str, checkout: Path, folder: Path, name: str, calls: int,
               workdir: Path) -> dict[str, Any]:
    package = package_of(folder, name)
    proc = harness.run_process(
        [sys.executable, "-c", INPROCESS, str(folder / "recipe.yaml"), str(package),
         str(folder / "bundle-in-process"), str(package / f"{name}.onnx"), str(calls)],
        workdir, f"{tree}-{name}-in-process", checkout=checkout, cwd=workdir)
    out = json.loads(proc.output.strip().splitlines()[-1])
    where = Path(out.pop("weightstore")).resolve()
    if checkout.resolve() not in where.parents:
        raise harness.BenchError(f"{tree} imported weightstore from {where}")
    return out


def run_all(models: dict[str, Path], layers: int, runs: int, calls: int, rev: str,
            workdir: Path) -> dict[str, Any]:
    checkouts = {"current": harness.REPO}
    base = baseline_checkout(rev, workdir)
    if base is not None:
        checkouts["baseline"] = base
    try:
        folders = prepare(models, checkouts, layers, workdir)
        load = [os.getloadavg()[0]]
        rows: dict[str, dict[str, dict[str, list]]] = {}
        for n in range(runs):
            harness.log(f"round {n + 1}/{runs}")
            for name in models:
                for tree, checkout in checkouts.items():
                    folder = folders[(tree, name)]
                    r = rows.setdefault(name, {}).setdefault(tree, {"whole": [], "in": []})
                    r["whole"].append(whole(tree, checkout, folder, name, workdir))
                    r["in"].append(in_process(tree, checkout, folder, name, calls, workdir))
        load.append(os.getloadavg()[0])
    finally:
        if base is not None:
            drop_checkout(base)
    return {"rows": rows, "runs": runs, "calls": calls, "layers": layers, "baseline": rev,
            "load_average": load, "trees": list(checkouts)}


def medians(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {k: {m: statistics.median(r[k][m] for r in rows) for m in ("seconds", "cpu_seconds")}
            for k in rows[0]}


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for name, trees in data["rows"].items():
        summary[name] = {tree: {"whole": medians(r["whole"]), "in": medians(r["in"])}
                         for tree, r in trees.items()}
        cur = summary[name]["current"]
        base = summary[name].get("baseline")
        for how, label in (("whole", "whole process"), ("in", "in-process")):
            if base is not None:
                for command in COMMANDS:
                    ratio = cur[how][command]["seconds"] / base[how][command]["seconds"]
                    cpu = cur[how][command]["cpu_seconds"] / base[how][command]["cpu_seconds"]
                    wanted = 1.5 if command in ("check", "bundle") else None
                    targets += [Target(f"{name}: {command} / baseline ({label})", ratio, wanted),
                                Target(f"{name}:   in CPU seconds", cpu, None)]
            for command, load in (("check", "onnx.load"), ("check --verify", "onnx.load"),
                                  ("resolve --json", LOADS[1]), ("bundle", "onnx.load")):
                wanted = 1.0 if how == "whole" and command in ("check", "resolve --json") \
                    else None
                targets.append(Target(f"{name}: {command} / {load} ({label})",
                                      cur[how][command]["seconds"] / cur[how][load]["seconds"],
                                      wanted))
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    la = data["load_average"]
    lines = [f"liveness benchmark: medians of {data['runs']} rounds (in-process: median of "
             f"{data['calls']} calls after a first); baseline {data['baseline']}; load "
             f"average {la[0]:.2f} before, {la[1]:.2f} after (shared machine: noisy)", ""]
    for name, trees in summary.items():
        head = f"{name:<30}" + "".join(f"{f'{t} {h}':>22}" for h in ("whole s", "in-proc ms")
                                       for t in trees)
        lines += [head]
        for command in (*COMMANDS, *LOADS):
            row = f"  {command:<28}"
            for how, scale in (("whole", 1), ("in", 1000)):
                for tree in trees:
                    x = trees[tree][how][command]
                    row += f"{x['seconds'] * scale:>12.3f} ({x['cpu_seconds'] * scale:>6.3f})"
            lines.append(row)
        lines.append("")
    lines.append("(wall, and CPU seconds of the process or the call in brackets)")
    lines.append("")
    lines += harness.target_table(targets, "figure", 64, 10)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append",
                        help="a real model to package and measure (repeatable)")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                        help="layers of the generated encoder")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS,
                        help="calls per operation in each in-process run")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help="the git revision to compare with")
    harness.add_common_arguments(parser, "the packages, checkouts and logs")
    args = parser.parse_args(argv)
    extra = args.model if args.model else [CORPUS_MODEL] if CORPUS_MODEL.is_file() else []

    def work(workdir: Path) -> int:
        models = {"encoder": workdir / "encoder.onnx"}
        models.update((p.stem.replace("_", "-"), p) for p in extra)
        data = run_all(models, args.layers, args.runs, args.calls, args.baseline, workdir)
        summary, targets = figures(data)
        harness.print_figures(args.json, summary, targets,
                              lambda: report(data, summary, targets),
                              load_average=data["load_average"])
        return 0

    harness.in_workdir(args.workdir, args.keep, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
