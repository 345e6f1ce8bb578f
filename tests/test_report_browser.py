"""The report in a real browser (headless Chromium): each view of reports built from the
repository's example recipes loads offline without a console message, draws something,
shows the numbers ``--json`` and ``summary.json`` hold, and links to one tensor."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from weightstore.cli import main

from .browser import png_colours
from .helpers import build_example

FIGURE = re.compile(r'data-key="([^"]+)" data-value="(-?\d+)"')


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict, dict]]:
    """name -> (page, --json data, summary.json) for the scenario/device recipe and the
    two-model family's shared layout."""
    root = tmp_path_factory.mktemp("report-browser")
    folders = {
        "scenarios": build_example(root / "s", "tiny-bert-scenarios")
        / "tiny-bert-scenarios" / "1.0.0" / "release",
        "family": build_example(root / "f", "tiny-bert-family")
        / "tiny-bert-family" / "1.0.0" / "shared"}
    out = {}
    for name, folder in folders.items():
        page, data = root / f"{name}.html", root / f"{name}.json"
        assert main(["report", str(folder), "--output", str(page), "-q"]) == 0
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert main(["report", str(folder), "--json"]) == 0
        data.write_text(buffer.getvalue())
        out[name] = (page, json.loads(buffer.getvalue()),
                     json.loads((folder / "summary.json").read_text()))
    return out


def _figures(dom: str) -> dict[str, int]:
    return {key: int(value) for key, value in FIGURE.findall(dom)}


def test_a_blank_page_counts_as_blank(chromium, tmp_path):
    """The drawing check can fail: a page of one colour has almost no distinct bytes."""
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert png_colours(chromium.load(blank).screenshot) < 16


def test_every_view_loads_draws_and_logs_nothing(chromium, reports):
    shots = {}
    for name, (page, data, _) in reports.items():
        for view in data["views"]:
            loaded = chromium.load(page, view)
            assert loaded.console == [], (name, view)
            assert f'class="view on" id="view-{view}"' in loaded.dom
            assert png_colours(loaded.screenshot) > 64, (name, view)
            shots[(name, view)] = loaded.screenshot
    assert len(set(shots.values())) == len(shots)  # every view of every report differs


def test_the_numbers_shown_are_the_data_and_the_summary(chromium, reports):
    for page, data, summary in reports.values():
        figures = _figures(chromium.load(page, "package").dom)
        view = data["views"]["package"]
        for key, value in summary["totals"].items():
            if f"totals.{key}" in figures:
                assert figures[f"totals.{key}"] == value, key
        assert figures["totals.referenced_bytes"] == summary["totals"]["referenced_bytes"]
        assert figures["dedup.dedup_saved_bytes"] == summary["totals"]["dedup_saved_bytes"]
        assert figures["shared.saved_bytes"] == view["shared_payloads"]["saved_bytes"]
        for m in view["models"]:
            for key in ("referenced_bytes", "unique_bytes", "shared_bytes"):
                assert figures[f"models.{m['name']}.{key}"] == m[key]
        for row in view["variants"]:
            for key in ("download_bytes", "live_bytes", "dead_bytes", "bundle_bytes"):
                assert figures[f"variants.{row['kind']}.{row['name']}.{key}"] == row[key]
    family = reports["family"][2]["totals"]
    assert family["dedup_saved_bytes"] > 0
    devices = [r for r in reports["scenarios"][1]["views"]["package"]["variants"]
               if r["kind"] == "device"]
    assert len(devices) == 3


def test_a_link_to_a_tensor_shows_its_details(chromium, reports):
    page, data, _ = reports["family"]
    tensor = data["views"]["package"]["tensors"][3]
    dom = chromium.load(page, "package&tensor=3").dom
    details = re.search(r'<div id="details" class="details">(.*?)</div></div>', dom,
                        re.S).group(1)
    for shown in (tensor["name"], tensor["digest"], f"{tensor['bytes']:,} bytes",
                  ", ".join(tensor["shared_by"])):
        assert shown in details
    assert re.search(r'<rect class="t sel" data-i="3"', dom)


HOSTILE = "w</script><img src=x onerror=\"console.error(1)\">&amp;'\u00e9"
# "<!--<script>" in a script element's data makes Chromium's parser swallow the rest of
# the page; U+2028 ends a line in older JavaScript
COMMENT = "<!--<script>\u2028\u2029x"


def test_names_are_shown_as_text_never_run(chromium, tmp_path):
    """A tensor may be named anything: markup and a closing script tag in a name are
    shown as the name, in the treemap, the list and the details, and run nothing."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(512, dtype=np.float32), HOSTILE)
    other = numpy_helper.from_array(np.arange(256, dtype=np.float32), COMMENT)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", HOSTILE], ["y"]),
         helper.make_node("Add", ["u", COMMENT], ["v"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [256])], [weight, other])
    onnx.save_model(helper.make_model(graph), tmp_path / "model.onnx")
    (tmp_path / "r.yaml").write_text(
        'package: odd\nversion: "1.0.0"\nmodels:\n  - {name: m, source: model.onnx}\n'
        "layouts:\n  - {name: c, external_weight: combined, size_threshold: 64}\n"
        "output: out\n")
    import weightstore

    weightstore.build(tmp_path / "r.yaml")
    page = tmp_path / "odd.html"
    assert main(["report", str(tmp_path / "out" / "odd" / "1.0.0" / "c"), "--output",
                 str(page), "-q"]) == 0
    loaded = chromium.load(page, "package&tensor=0")
    assert loaded.console == []
    outside_scripts = re.sub(r"<script\b.*?</script>", "", loaded.dom, flags=re.S)
    assert "<img" not in outside_scripts  # no element was made of the name
    import html

    details = re.search(r'<div id="details" class="details">(.*?)</div></div>', loaded.dom,
                        re.S).group(1)
    assert html.escape(HOSTILE, quote=False) in details
    assert outside_scripts.count("<table") == 3  # the page after the data is markup still
    loaded = chromium.load(page, "package&tensor=1")  # the script still runs: details shown
    assert loaded.console == []
    details = re.search(r'<div id="details" class="details">(.*?)</div></div>', loaded.dom,
                        re.S).group(1)
    assert html.escape(COMMENT, quote=False) in details
    assert 'class="view on" id="view-package"' in loaded.dom


def test_accuracy_figures_show_in_the_browser(chromium, tmp_path):
    """A package whose build measured its scenarios: the page loads without a console
    message, and the accuracy table and each device's row show the summary's figures."""
    from weightstore.builder.run import BuildOptions, build

    from .test_accuracy_gate import make_case

    result = build(make_case(tmp_path), BuildOptions(jobs=2))
    package = result.packages[0]
    page = tmp_path / "report.html"
    assert main(["report", str(package.path), "--output", str(page), "-q"]) == 0
    loaded = chromium.load(page, "package")
    assert loaded.console == []
    table = loaded.dom[loaded.dom.index('class="accuracy"'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    shown = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[:5] for row in rows]
    expected = [[a["model"], a["scenario"], o["name"], f"{o['cosine']:.6g}",
                 f"{o['max_abs']:.6g}"]
                for a in package.summary["accuracy"] for o in a["outputs"]]
    assert [row for row in shown if row] == expected
    half = next(a for a in package.summary["accuracy"] if a["scenario"] == "half")
    gpu = loaded.dom[loaded.dom.index("device <b>gpu</b>"):]
    gpu = gpu[:gpu.index("</tr>")]
    for o in half["outputs"]:
        assert (f"encoder@half {o['name']}: cosine {o['cosine']:.6g}, max_abs "
                f"{o['max_abs']:.6g}") in gpu
