"""``weightstore report``: the data behind the page, the page, the terminal summary, bad
input. The browser's view of the page is in test_report_browser.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from weightstore.cli import main

from .helpers import build_example


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The repository's scenario/device recipe and its two-model family, built once."""
    root = tmp_path_factory.mktemp("report")
    dist = build_example(root / "scenarios", "tiny-bert-scenarios")
    family = build_example(root / "family", "tiny-bert-family")
    layouts = build_example(root / "layouts", "tiny-bert")
    return {"scenarios": dist / "tiny-bert-scenarios" / "1.0.0" / "release",
            "family": family / "tiny-bert-family" / "1.0.0" / "shared",
            "family-release": family / "tiny-bert-family" / "1.0.0" / "release",
            "separate": layouts / "tiny-bert" / "1.0.0" / "separate",
            "embedded": layouts / "tiny-bert" / "1.0.0" / "embedded",
            "file-constant": layouts / "tiny-bert" / "1.0.0" / "ge-combined"}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_the_data_holds_the_summary_totals_and_every_weight(packages, capsys):
    data = _json(capsys, str(packages["family"]))
    assert data["format_version"] == 1 and set(data["views"]) == {"package"}
    view = data["views"]["package"]
    summary = _summary(packages["family"])
    assert view["totals"] == summary["totals"]
    assert view["totals"]["dedup_saved_bytes"] > 0  # the family shares weights
    # the treemap's leaves add up to every byte the models reference
    assert view["treemap"]["bytes"] == summary["totals"]["referenced_bytes"]
    assert sum(m["referenced_bytes"] for m in view["models"]) == \
        summary["totals"]["referenced_bytes"]
    # what sharing saved, payload by payload, is the summary's dedup figure
    assert view["shared_payloads"]["saved_bytes"] == summary["totals"]["dedup_saved_bytes"]
    for m, s in zip(view["models"], summary["models"], strict=True):
        ids = {w["id"]: w["size"] for w in s["external_weights"]}
        assert m["unique_bytes"] == sum(ids.values())
    largest = max(w["size"] for m in summary["models"] for w in m["external_weights"])
    assert view["tensors"][0]["bytes"] == largest
    assert view["tensors"][0]["shared_by"] == ["encoder", "finetuned"]


def test_devices_need_what_check_resolves(packages, capsys):
    """Each device's row has the files ``check --device`` resolves the live weights to and
    their live bytes; it downloads what its bundle lists; live + dead = download."""
    folder = packages["scenarios"]
    view = _json(capsys, str(folder))["views"]["package"]
    devices = {r["name"]: r for r in view["variants"] if r["kind"] == "device"}
    assert sorted(devices) == sorted(d["name"] for d in _summary(folder)["devices"])
    for name, row in devices.items():
        assert main(["check", str(folder), "--device", name, "--json"]) == 0
        checked = json.loads(capsys.readouterr().out)
        assert {f["name"] for f in row["files"] if f["live_bytes"]} == \
            set().union(*(m["files"] for m in checked["models"]))
        assert row["live_bytes"] == sum(m["live_bytes"] for m in checked["models"])
        record = json.loads((folder / "devices" / name / "bundle.json").read_text())
        listed = {f["name"] if isinstance(f, dict) else f for f in record["files"]}
        assert {f["name"] for f in row["files"]} == listed
        assert row["live_bytes"] + row["dead_bytes"] == row["download_bytes"]
    # the accelerator's half-precision weights leave the float32 ones it downloads dead
    assert devices["npu"]["dead_bytes"] > 0 and devices["reference"]["dead_bytes"] == 0
    scenarios = [r["name"] for r in view["variants"] if r["kind"] == "scenario"]
    assert scenarios == ["default", "fused", "half"]


@pytest.mark.parametrize("package", ["scenarios", "family", "file-constant"])
def test_scenarios_need_what_check_resolves(packages, capsys, package):
    """Every scenario row (from the device records where a device runs it, from check's
    resolution where none does: the family has no devices) is what ``check`` says."""
    folder = packages[package]
    view = _json(capsys, str(folder))["views"]["package"]
    for row in (r for r in view["variants"] if r["kind"] == "scenario"):
        scenario = [] if row["scenario"] is None else ["--scenario", row["scenario"]]
        assert main(["check", str(folder), *scenario, "--json"]) == 0
        checked = json.loads(capsys.readouterr().out)
        assert {f["name"] for f in row["files"]} == \
            set().union(*(m["files"] for m in checked["models"]))
        each = sum(m["live_bytes"] for m in checked["models"])
        if package == "family":  # two models, one shared file: each shared range once
            totals = _summary(folder)["totals"]
            assert each == totals["referenced_bytes"] > totals["unique_payload_bytes"]
            assert row["live_bytes"] == totals["unique_payload_bytes"]
        else:
            assert row["live_bytes"] == each
        assert row["models"] == {m["file"]: m["scenario"] for m in checked["models"]}


def test_same_inputs_same_bytes_wherever_they_lie(packages, tmp_path, capsys):
    moved = tmp_path / "elsewhere" / "release"
    shutil.copytree(packages["scenarios"], moved)
    first, second = tmp_path / "a.html", tmp_path / "b.html"
    assert main(["report", str(packages["scenarios"]), "--output", str(first)]) == 0
    assert main(["report", str(moved), "--output", str(second), "-q"]) == 0
    assert first.read_bytes() == second.read_bytes()
    capsys.readouterr()
    assert _json(capsys, str(packages["scenarios"])) == _json(capsys, str(moved))
    page = first.read_text()
    assert str(tmp_path) not in page and str(packages["scenarios"].parent) not in page
    # self-contained: nothing fetched when viewed
    assert "http://" not in page and "https://" not in page and " src=" not in page


def test_an_archive_reports_as_its_folder(packages, tmp_path, capsys):
    assert main(["release", str(packages["family-release"]), "--output",
                 str(tmp_path / "rel"), "-q"]) == 0
    archive = next((tmp_path / "rel").glob("*.tar.zst"))
    from_archive = _json(capsys, str(archive))
    from_folder = _json(capsys, str(packages["family-release"]))
    assert from_archive["target"] == {"kind": "archive", "name": archive.name}
    assert from_archive["views"] == from_folder["views"]
    assert not list(Path(tmp_path).glob("**/weightstore-report-*"))


def test_without_output_a_text_summary(packages, capsys):
    assert main(["report", str(packages["scenarios"])]) == 0
    out = capsys.readouterr().out
    summary = _summary(packages["scenarios"])
    assert "top tensors:" in out and "embeddings.word_embeddings.weight" in out
    assert "device npu: live" in out and "dedup:" in out
    assert f"{summary['totals']['external_weights']} external weights" in out


@pytest.mark.parametrize("package", ["scenarios", "separate"])
def test_large_packages_name_their_largest_tensors_and_sum_the_rest(packages, monkeypatch,
                                                                     capsys, package):
    """Only the largest tensors have a cell; the others are one cell per weight file, and
    the files holding none of those (a separate layout's, one a weight) one cell."""
    from weightstore.report import package as collector

    monkeypatch.setattr(collector, "TOP_TENSORS", 5)
    view = _json(capsys, str(packages[package]))["views"]["package"]
    assert len(view["tensors"]) == 5
    leaves = []

    def walk(node):
        for child in node.get("children", ()):
            walk(child) if "children" in child else leaves.append(child)

    walk(view["treemap"])
    named = [leaf for leaf in leaves if leaf["kind"] == "tensor"]
    rest = [leaf for leaf in leaves if leaf["kind"] == "rest"]
    assert sorted(leaf["tensor"] for leaf in named) == list(range(5))
    assert sum(leaf["count"] for leaf in rest) == \
        _summary(packages[package])["totals"]["external_weights"] - 5
    assert sum(leaf["bytes"] for leaf in leaves) == view["treemap"]["bytes"]
    assert len(leaves) <= 5 + 5 + 3  # a rest per file with a named tensor, per scenario


def _corrupt_archive(folder: Path) -> Path:
    path = folder / "broken.tar.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd garbage")  # a zstd magic, then nothing of one
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such package folder or archive"),
    (lambda p: p, "not a package folder"),
    (_corrupt_archive, "corrupt archive"),
])
def test_bad_targets_are_one_line_and_exit_2(tmp_path, capsys, make, message):
    target = make(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", str(target), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_without_squarify_the_page_says_how_to_install_it(packages, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.setitem(__import__("sys").modules, "squarify", None)  # import fails
    out = tmp_path / "r.html"
    assert main(["report", str(packages["family"]), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'weightstore[report]'" in err
    assert not out.exists()
    assert main(["report", str(packages["family"])]) == 0  # the text needs no drawing


def test_the_page_does_not_depend_on_the_hash_seed(packages, tmp_path):
    """Two processes with different string hashing (set and dict orders) write the same
    page and the same data."""
    import os
    import subprocess
    import sys

    out = {}
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        page = tmp_path / f"{seed}.html"
        done = subprocess.run([sys.executable, "-m", "weightstore", "report",
                               str(packages["family"]), "--output", str(page), "--json"],
                              env=env, capture_output=True, check=True)
        out[seed] = (page.read_bytes(), done.stdout)
    assert out["1"] == out["2"]


def test_an_embedded_package_has_no_weight_files_to_draw(packages, tmp_path, capsys):
    page = tmp_path / "r.html"
    assert main(["report", str(packages["embedded"]), "--output", str(page)]) == 0
    assert "No external weights" in page.read_text()
    capsys.readouterr()
    view = _json(capsys, str(packages["embedded"]))["views"]["package"]
    assert view["tensors"] == [] and view["treemap"]["bytes"] == 0
    assert [(r["name"], r["files"]) for r in view["variants"]] == [("default", [])]


def test_a_release_can_hold_each_layout_s_report(packages, tmp_path, capsys):
    """release --report writes beside each archive the page report writes of that archive,
    lists it in SHA256SUMS (checked by coreutils' sha256sum) and in release.json."""
    import subprocess

    out = tmp_path / "rel"
    version = packages["family"].parent
    assert main(["release", str(version), "--output", str(out), "--report", "-q"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["SHA256SUMS", "release.json",
                     "tiny-bert-family-1.0.0-release.report.html",
                     "tiny-bert-family-1.0.0-release.tar.zst",
                     "tiny-bert-family-1.0.0-shared.report.html",
                     "tiny-bert-family-1.0.0-shared.tar.zst"]
    for layout in ("release", "shared"):
        archive = out / f"tiny-bert-family-1.0.0-{layout}.tar.zst"
        page = tmp_path / f"{layout}.html"
        assert main(["report", str(archive), "--output", str(page), "-q"]) == 0
        assert page.read_bytes() == (out / f"tiny-bert-family-1.0.0-{layout}.report.html"
                                     ).read_bytes()
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=out, check=True,
                       capture_output=True)
    assert sum(".report.html" in line for line in (out / "SHA256SUMS").read_text()
               .splitlines()) == 2
    statement = json.loads((out / "release.json").read_text())
    assert [s["name"] for s in statement["subject"]] == names[2:]
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["report"] is True


def test_a_release_with_reports_is_reproducible(tmp_path, capsys):
    """release --check rebuilds the reports too (release.json says they were written),
    and finds them identical; a release without them has no report key at all."""
    dist = build_example(tmp_path, "tiny-bert-family")
    recipe = tmp_path / "tiny-bert-family.yaml"
    out = tmp_path / "rel"
    assert main(["release", str(recipe), "--output", str(out), "--report", "-q"]) == 0
    assert main(["release", "--check", str(recipe), "--output", str(out), "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] and sum(n.endswith(".report.html") for n in checked["compared"]) == 2
    (out / "tiny-bert-family-1.0.0-shared.report.html").write_text("changed")
    assert main(["release", "--check", str(recipe), "--output", str(out), "-q"]) == 1
    plain = tmp_path / "plain"
    assert main(["release", str(dist / "tiny-bert-family" / "1.0.0"), "--output",
                 str(plain), "-q"]) == 0
    params = json.loads((plain / "release.json").read_text())["predicate"][
        "buildDefinition"]["externalParameters"]
    assert "report" not in params


def test_an_option_no_view_answers_is_refused(packages, capsys, monkeypatch):
    """An option no registered view answers is refused, never ignored: the diff and store
    views answer --against and --store, and without them both are refused."""
    import weightstore.report.data as data_module
    from weightstore.report.views import VIEWS

    assert {o for v in VIEWS for o in v.answers} == {"against", "store"}
    monkeypatch.setattr(data_module, "VIEWS", tuple(v for v in VIEWS if not v.answers))
    for option in ("--against", "--store"):
        code = main(["report", str(packages["family"]), option, str(packages["family"])])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "not supported" in err


def test_formats_md_shows_the_data_s_shape(packages, capsys):
    """docs/reference/formats/report-data.md's example of the report data has exactly the
    keys the data has, at every level it shows (a key added or renamed must be documented)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "formats"
            / "report-data.md").read_text()
    section = text[text.index("# Report data"):]
    start = section.index("```json") + len("```json")
    doc = json.loads(section[start:section.index("```", start)])
    data = _json(capsys, str(packages["scenarios"]))

    def keys(value):
        return sorted(value)

    assert keys(doc) == keys(data) and keys(doc["target"]) == keys(data["target"])
    d, v = doc["views"]["package"], data["views"]["package"]
    assert keys(d) == keys(v)
    for name in ("models", "tensors", "files", "variants"):
        assert keys(d[name][0]) == keys(v[name][0]), name
    assert keys(d["variants"][0]["files"][0]) == keys(v["variants"][0]["files"][0])
    assert keys(d["shared_payloads"]) == keys(v["shared_payloads"])
    family = _json(capsys, str(packages["family"]))["views"]["package"]
    assert keys(d["shared_payloads"]["payloads"][0]) == \
        keys(family["shared_payloads"]["payloads"][0])
    tree = d["treemap"]
    model = tree["children"][0]
    scenario = model["children"][0]
    file = scenario["children"][0]
    real = v["treemap"]
    assert keys(tree) == keys(real) and keys(model) == keys(real["children"][0])
    assert keys(scenario) == keys(real["children"][0]["children"][0])
    real_file = real["children"][0]["children"][0]["children"][0]
    assert keys(file) == keys(real_file)
    assert keys(file["children"][0]) == keys(real_file["children"][0])  # a tensor
