"""Measure ``weightstore report`` at scale: a package of 10,000 tensors and 8 devices.

Usage: ``python bench/report.py [--tensors 10000] [--devices 8] [--runs 5] [--workdir DIR]
[--keep] [--json]``

The model is one ``Concat`` of ``--tensors`` float32 initializers of varied sizes (most
of 1 to 5 kB, one in 500 of 256 kB), packaged by a recipe with a ``half`` scenario
(``cast-fp16, cleanup``), a combined layout split by scenario, and ``--devices`` devices,
half of them accelerators running ``half`` and half running the default graph. Each
round, in fresh processes:

* ``report --output``: the whole command (imports, reading the summary, resolving each
  scenario as ``check`` does, rendering, writing the page), wall and CPU seconds;
* in one process, the two halves of it: collecting the data and rendering the page;
* headless Chromium (Debian's ``chromium``) loading the page and painting it into a
  screenshot, beside the same browser doing so for an empty page (the browser's own
  start-up and shutdown): the page's load and paint is the difference, in wall and CPU
  seconds; and, as the page itself measures it in a copy with a probe appended, the
  time from navigation to the end of its load event with the layout forced.

Targets: the page <= 2 MB; written <= 1 s (the command's wall time, and the render alone
as well); loaded and painted <= 2 s (medians of ``--runs`` rounds). The machine may be
shared: the load average is printed before and after, and CPU seconds are the steadier
figure. A measurement, not a gate: the exit code is 0 whatever the figures.
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

LARGE_EVERY = 500  # one tensor in this many is large (256 kB)

# appended to a copy of the page: the time from navigation to the end of the load event
# with the layout forced, as the page itself measures it
PROBE = ("<script>addEventListener('load',function(){document.body.getBoundingClientRect();"
         "document.documentElement.setAttribute('data-loaded-ms',"
         "String(performance.now()));});</script>")

PHASES = """
import json, sys, time
from weightstore.report.data import collect_report
from weightstore.report.page import render_page
t0, c0 = time.perf_counter(), time.process_time()
data = collect_report(sys.argv[1])
t1, c1 = time.perf_counter(), time.process_time()
page = render_page(data)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"collect": t1 - t0, "collect_cpu": c1 - c0, "render": t2 - t1,
                  "render_cpu": c2 - c1, "bytes": len(page.encode())}))
"""


def make_model(path: Path, tensors: int) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, names = [], []
    for i in range(tensors):
        n = 65536 if i % LARGE_EVERY == 0 else 256 + (i * 7919) % 1024
        name = f"layers.{i // 8}.block.{i % 8}.weight"
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), name))
        names.append(name)
    total = sum(int(np.prod(t.dims)) for t in inits)
    node = helper.make_node("Concat", names, ["y"], axis=0)
    graph = helper.make_graph([node], "wide", [], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [total])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, path)


def recipe(folder: Path, devices: int) -> Path:
    lines = ["package: wide", 'version: "1.0.0"', f"store: {{path: {folder / 'store'}}}",
             "models:", "  - name: wide", f"    source: {folder / 'model.onnx'}",
             "    scenarios:",
             "      - {name: half, passes: [cast-fp16, cleanup], requires: {accelerator: npu}}",
             "layouts:", "  - {name: release, external_weight: combined, split: scenario}",
             "devices:"]
    for i in range(devices):
        if i % 2:
            lines.append(f"  - {{name: cpu{i}, scenario: null}}")
        else:
            lines.append(f"  - {{name: npu{i}, capabilities: {{accelerator: npu}}, "
                         "scenario: auto}")
    lines.append(f"output: {folder / 'dist'}")
    path = folder / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise harness.BenchError("chromium is not installed (apt-get install chromium)")
    py = sys.executable
    package = workdir / "dist" / "wide" / "1.0.0" / "release"
    if not package.is_dir():
        harness.log(f"making a model of {args.tensors} tensors and building it")
        make_model(workdir / "model.onnx", args.tensors)
        harness.run_process([py, "-m", "weightstore", "build", "-q",
                             str(recipe(workdir, args.devices))], workdir, "build")
    page = workdir / "report.html"
    blank = workdir / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>\n")

    def browser(target: Path, *what: str) -> harness.Process:
        profile = workdir / "profile"
        shutil.rmtree(profile, ignore_errors=True)
        return harness.run_process(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--window-size=1400,1000",
             *(what or (f"--screenshot={workdir / 'shot.png'}",)), target.as_uri()],
            workdir, "chromium")

    before = load_average()
    rounds: dict[str, list[float]] = {}
    for i in range(args.runs):
        harness.log(f"round {i + 1} of {args.runs}")
        cmd = harness.run_process([py, "-m", "weightstore", "report", str(package),
                                   "--output", str(page), "-q"], workdir, "report")
        phases = json.loads(harness.run_process([py, "-c", PHASES, str(package)], workdir,
                                                "phases").output)
        b_blank, b_page = browser(blank), browser(page)
        timed = workdir / "report-timed.html"
        timed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
        dom = browser(timed, "--dump-dom").output
        loaded = float(dom.split('data-loaded-ms="', 1)[1].split('"', 1)[0]) / 1000
        for key, value in (("command", cmd.seconds), ("command_cpu", cmd.cpu_seconds),
                           ("collect", phases["collect"]),
                           ("collect_cpu", phases["collect_cpu"]),
                           ("render", phases["render"]), ("render_cpu", phases["render_cpu"]),
                           ("browser_blank", b_blank.seconds),
                           ("browser_page", b_page.seconds),
                           ("browser_blank_cpu", b_blank.cpu_seconds),
                           ("browser_page_cpu", b_page.cpu_seconds),
                           ("paint", b_page.seconds - b_blank.seconds),
                           ("paint_cpu", b_page.cpu_seconds - b_blank.cpu_seconds),
                           ("in_page_load", loaded)):
            rounds.setdefault(key, []).append(value)
    summary = {k: statistics.median(v) for k, v in rounds.items()}
    summary["page_bytes"] = page.stat().st_size
    summary["tensors"] = args.tensors
    summary["devices"] = args.devices
    summary["load_before"], summary["load_after"] = before, load_average()
    summary["rounds"] = rounds
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tensors", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    harness.add_common_arguments(parser, "the model, the store and the package")
    args = parser.parse_args()
    summary = harness.in_workdir(args.workdir, args.keep, lambda w: measure(args, w))
    if summary is None:
        return 0
    targets = [Target("page MB", summary["page_bytes"] / MB, 2.0, 3),
               Target("report command s", summary["command"], 1.0),
               Target("render s", summary["render"], 1.0),
               Target("chromium load + paint s", summary["paint"], 2.0),
               Target("  in CPU s", summary["paint_cpu"], 2.0),
               Target("  in-page load + layout s", summary["in_page_load"], 2.0),
               Target("collect s", summary["collect"], None),
               Target("command CPU s", summary["command_cpu"], None),
               Target("chromium, empty page s", summary["browser_blank"], None),
               Target("chromium, report s", summary["browser_page"], None)]

    def text() -> str:
        lines = [f"{summary['tensors']} tensors, {summary['devices']} devices, medians of "
                 f"{len(summary['rounds']['command'])} rounds; load average "
                 f"{summary['load_before']} before, {summary['load_after']} after", ""]
        return "\n".join(lines + harness.target_table(targets, "figure", 28, 10))

    harness.print_figures(args.json, summary, targets, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
