"""A ready session from a package against onnxruntime's own, in fresh processes.

Usage: ``python bench/ready.py [--small-mb 20] [--runs 5] [--only NAME ...]
[--export DIR ...] [--workdir DIR] [--keep] [--json]``

What a user's process does to serve a model: ``weightstore.load(weightstore.resolve(
package, device="cpu"))`` (the portable path: packages built with a combined, 4096-aligned
layout and a ``cpu`` device, not prepared), against what onnxruntime does on its own:
``onnxruntime.InferenceSession(path)`` on onnx's external-data copy of the same model
(``onnx.save_model(..., save_as_external_data=True)``), which it maps without verifying
anything. Models:

* ``chain``: the MatMul chain of ``bench/resolve.py`` (an ``If`` on the input's shape in
  front) with 10x ``--small-mb`` MB of weights;
* ``encoder``: the BERT-like encoder of ``bench/resolve.py`` (``tests.samples.make_encoder``:
  Constants with typed fields, an ``If``, a GELU function) of about 10x ``--small-mb`` MB;
* ``minilm``: a sentence-embedding transformer of MiniLM's shape (6 layers of hidden 384,
  12 heads, ffn 1536, a 30522-word vocabulary: about 90 MB in ~100 weights), generated
  with the same exporter shapes (no transformer exported by a real exporter is at hand:
  the corpus holds only Silero VAD, and the suite may not depend on it);
* ``silero``: each model of ``../shared/corpus/`` (real exports: Silero VAD, weights in
  Constant nodes inside ``If`` bodies), when that folder is there;
* each ``--export DIR``: a real exporter's model, ``DIR/source.onnx`` with its sample
  inputs in ``DIR/feed.npz`` (targeted like the bench's own), for example a torch.onnx
  export of a MiniLM-sized sentence encoder (the exporter needs torch and transformers,
  which the bench does not install).

Each round runs, per model, interleaved, one fresh process of each mode:

* ``ort``: ``import onnxruntime``, then the session creation timed;
* ``ready``: ``import onnxruntime, weightstore``, then resolve + load timed, with the
  records of an earlier process (a package loaded before and unchanged since: what a
  service restarting, or a second worker, does). The records spare the resolution and
  the model's building, not the verification: every live range is read and verified on
  this load too, through the files it pinned, while onnxruntime creates the session;
* ``first``: the same with an empty user cache (no records: what the first load of a
  package after it changed costs: resolution with onnx imported, the direct load
  verifying every live byte while onnxruntime creates the session).

Each process prints its wall and CPU seconds (every thread's) of the timed part, the
bytes it read and a digest of the outputs, which must agree between the modes.

Target: ``ready`` <= 1.1x ``ort`` (wall time, medians) on ``chain``, ``encoder`` and
``minilm``. Shown for scale: the same ratio on the corpus's models (sessions of 5 to 40
ms, where the few ms that resolving from records costs weigh 10 to 100%), the CPU-time
ratio, ``first`` against ``ort``, and the imports of each process. A
measurement, not a gate: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness
import resolve as resolve_bench
from harness import MB, Target

DEFAULT_SMALL_MB, DEFAULT_RUNS = 20, 5
MODES = ("ort", "ready", "first")
TARGETED = ["chain", "encoder", "minilm"]  # and each --export
CORPUS = harness.REPO.parent / "shared" / "corpus"

GENERATE_MINILM = r'''
import sys
from pathlib import Path
import numpy as np, onnx
sys.path.insert(0, sys.argv[2])
from tests.samples import make_encoder, sample_inputs
folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
model = make_encoder(vocab=30522, hidden=384, heads=12, layers=6, ffn=1536, max_seq=512,
                     name="minilm")
onnx.save(model, str(folder / "source.onnx"))
np.savez(folder / "feed.npz", **sample_inputs(model, batch=2, seq=64))
'''

GENERATE_CORPUS = r'''
import sys
from pathlib import Path
import numpy as np, onnx
from onnx import helper
folder, source = Path(sys.argv[1]), Path(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
model = onnx.load(str(source))
onnx.save(model, str(folder / "source.onnx"))
rng, feed = np.random.default_rng(0), {}
for value in model.graph.input:  # a 512-sample chunk of 16 kHz audio, zero state
    t = value.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
    dims = [d.dim_value or 1 for d in t.shape.dim]
    if not dims:
        feed[value.name] = np.array(16000 if "sr" in value.name else 0, dtype)
    elif "input" in value.name:  # audio: a dynamic last axis gets 512 samples
        dims[-1] = t.shape.dim[-1].dim_value or 512
        feed[value.name] = rng.standard_normal(dims).astype(dtype)
    else:
        feed[value.name] = np.zeros(dims, dtype)
np.savez(folder / "feed.npz", **feed)
'''

FINISH = r'''
import sys
from pathlib import Path
import onnx
folder, name = Path(sys.argv[1]), sys.argv[2]
model = onnx.load(str(folder / "source.onnx"))
ort_dir = folder / "onnx-external"
ort_dir.mkdir(exist_ok=True)
onnx.save_model(model, str(ort_dir / "model.onnx"), save_as_external_data=True,
                location="model.data", size_threshold=1024)
(folder / "recipe.yaml").write_text(f"""package: {name}
version: "1"
store: {{path: {folder / 'store'}}}
models: [{{name: {name}, source: {folder / 'source.onnx'}}}]
layouts: [{{name: release, external_weight: combined, alignment: 4096}}]
devices: [{{name: cpu, capabilities: {{device: cpu}}, scenario: null}}]
output: {folder / 'out'}
""")
'''

CHILD = r'''
import hashlib, json, sys, time
mode, package, ort_model, feed_path = sys.argv[1:5]
start = time.perf_counter()
import numpy, onnxruntime
if mode != "ort":
    import weightstore
    from weightstore.load import LoadReport, RecordingReader
imports = time.perf_counter() - start
feed = dict(numpy.load(feed_path))
out = {"imports": imports}
start, cpu = time.perf_counter(), time.process_time()
if mode == "ort":
    s = onnxruntime.InferenceSession(ort_model, providers=["CPUExecutionProvider"])
    out["read_bytes"] = 0
else:
    report, reader = LoadReport(), RecordingReader()
    s = weightstore.load(weightstore.resolve(package, device="cpu"), report=report,
                         reader=reader)
    out["read_bytes"] = reader.bytes_read
    out["live_bytes"] = report.live_bytes
    out["from_record"] = report.from_record
    out["onnx_imported"] = "onnx" in sys.modules
out["seconds"] = time.perf_counter() - start
out["cpu_seconds"] = time.process_time() - cpu
h = hashlib.sha256()
for array in s.run(None, feed):
    h.update(array.tobytes())
out["output"] = h.hexdigest()[:32]
print(json.dumps(out))
'''


def make_model(workdir: Path, name: str, generate: list[str]) -> Path:
    folder = workdir / name
    if not (folder / "out").is_dir():
        harness.log(f"generating {name}")
        harness.run_process([sys.executable, "-c", *generate], workdir, f"generate-{name}")
        if not (folder / "recipe.yaml").is_file():
            harness.run_process([sys.executable, "-c", FINISH, str(folder), name], workdir,
                                f"finish-{name}")
        harness.run_process([sys.executable, "-m", "weightstore", "build",
                             str(folder / "recipe.yaml")], workdir, f"build-{name}")
    return folder


COPY_EXPORT = r'''
import shutil, sys
from pathlib import Path
folder, source = Path(sys.argv[1]), Path(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
for name in ("source.onnx", "feed.npz"):
    shutil.copyfile(source / name, folder / name)
'''


def models(workdir: Path, small_mb: float, exports: list[str] = ()) -> dict[str, Path]:
    repo = str(harness.REPO)
    out = {"chain": make_model(workdir, "chain", [
        resolve_bench.GENERATE, str(workdir / "chain"), str(resolve_bench.DEFAULT_LAYERS),
        str(resolve_bench.dim_for(small_mb * 10, resolve_bench.DEFAULT_LAYERS))]),
        "encoder": make_model(workdir, "encoder", [
            resolve_bench.GENERATE_ENCODER, str(workdir / "encoder"),
            str(resolve_bench.hidden_for(small_mb * 10)), repo]),
        "minilm": make_model(workdir, "minilm", [GENERATE_MINILM, str(workdir / "minilm"),
                                                  repo])}
    for export in exports:
        name = Path(export).name
        TARGETED.append(name)
        out[name] = make_model(workdir, name, [COPY_EXPORT, str(workdir / name),
                                               str(Path(export).resolve())])
    if CORPUS.is_dir():
        for path in sorted(CORPUS.glob("*.onnx")):
            name = path.stem.replace("_", "-")
            out[name] = make_model(workdir, name, [GENERATE_CORPUS, str(workdir / name),
                                                   str(path)])
    return out


def package_of(folder: Path) -> Path:
    summary = next((folder / "out").glob("*/1/release/summary.json"))
    return summary.parent


def child(mode: str, folder: Path, workdir: Path, cache: Path) -> dict[str, Any]:
    argv = [sys.executable, "-c", CHILD, mode, str(package_of(folder)),
            str(folder / "onnx-external" / "model.onnx"), str(folder / "feed.npz")]
    proc = harness.run_process(argv, workdir, f"{mode}-{folder.name}",
                                env={"XDG_CACHE_HOME": str(cache)})
    return json.loads(proc.output.strip().splitlines()[-1])


def run_all(small_mb: float, runs: int, workdir: Path,
            only: list[str] | None = None, exports: list[str] = ()) -> dict[str, Any]:
    folders = {name: folder for name, folder in models(workdir, small_mb, exports).items()
               if not only or name in only}
    # files younger than the timestamps' granularity are not recorded: let them settle
    newest = max(p.stat().st_mtime for f in folders.values() for p in (f / "out").rglob("*"))
    time.sleep(max(0.0, newest + 2.5 - time.time()))
    warm = workdir / "cache-warm"
    for folder in folders.values():  # a first process records what later ones use
        child("ready", folder, workdir, warm)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {m: [] for m in MODES} for name in folders}
    for n in range(runs):
        harness.log(f"round {n + 1}/{runs}")
        for name, folder in folders.items():
            for mode in MODES:
                cache = warm if mode == "ready" else workdir / "cache-empty"
                if mode == "first":
                    shutil.rmtree(cache, ignore_errors=True)
                results[name][mode].append(child(mode, folder, workdir, cache))
    return {"runs": runs, "results": results}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for name, modes in data["results"].items():
        ort = _median(modes["ort"], "seconds")
        ort_cpu = _median(modes["ort"], "cpu_seconds")
        f = {m: {k: _median(modes[m], k) for k in ("seconds", "cpu_seconds", "imports",
                                                   "read_bytes")} for m in MODES}
        f["live_bytes"] = modes["ready"][0]["live_bytes"]
        f["same_outputs"] = len({r["output"] for m in MODES for r in modes[m]}) == 1
        f["ready_from_records"] = all(r["from_record"] for r in modes["ready"])
        f["ready_without_onnx"] = not any(r["onnx_imported"] for r in modes["ready"])
        summary[name] = f
        # the target is the bench models' and the transformer's; the corpus's models are
        # sessions of 5 to 40 ms, shown for scale: a fixed cost of a few ms is 10-100% there
        target = 1.1 if name in TARGETED else None
        targets += [
            Target(f"{name}: ready session / onnxruntime", f["ready"]["seconds"] / ort, target),
            Target(f"{name}:   CPU seconds / onnxruntime's",
                   f["ready"]["cpu_seconds"] / ort_cpu, None),
            Target(f"{name}: first load after a change / onnxruntime",
                   f["first"]["seconds"] / ort, None),
            Target(f"{name}:   CPU seconds / onnxruntime's",
                   f["first"]["cpu_seconds"] / ort_cpu, None),
        ]
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    lines = [f"ready session vs onnxruntime's own: medians of {data['runs']} fresh processes "
             "per mode (shared machine: noisy)", "",
             f"{'model':<28}{'mode':<8}{'wall s':>8}{'cpu s':>8}{'imports s':>11}"
             f"{'read MB':>9}"]
    for name, f in summary.items():
        for m in MODES:
            x = f[m]
            lines.append(f"{name:<28}{m:<8}{x['seconds']:>8.3f}{x['cpu_seconds']:>8.3f}"
                         f"{x['imports']:>11.3f}{x['read_bytes'] / MB:>9.1f}")
        lines.append(f"{'':<28}live {f['live_bytes'] / MB:.1f} MB; same outputs in every "
                     f"mode: {f['same_outputs']}; ready from records: "
                     f"{f['ready_from_records']}, without onnx: {f['ready_without_onnx']}")
    lines += ["", *harness.target_table(targets, "figure", 58, 10)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-mb", type=float, default=DEFAULT_SMALL_MB)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="these models alone (chain, encoder, minilm, silero-vad, ...)")
    parser.add_argument("--export", action="append", default=[], metavar="DIR",
                        help="a real exporter's model: DIR/source.onnx and DIR/feed.npz")
    harness.add_common_arguments(parser, "the generated packages, records and logs")
    args = parser.parse_args(argv)

    return harness.measure(args, lambda w: run_all(args.small_mb, args.runs, w, args.only,
                                                    args.export),
                           figures, report)


if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.exit(main())
