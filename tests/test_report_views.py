"""The report's diff view (``--against``), its store view (``--store``) and store
references: every figure checked against the command that owns it (``weightstore diff
--json``, ``store ls --json``, ``store gc --dry-run --json``, ``store stats --json``), in
the data and in headless Chromium's DOM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from weightstore.cli import main

from .browser import png_colours
from .release_helpers import CHANGED, build_two_versions

FIGURE = re.compile(r'data-key="([^"]+)" data-value="(-?\d+)"')


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-views")
    with pytest.MonkeyPatch.context() as env:  # the key the action records are MAC'd with
        env.setenv("XDG_CACHE_HOME", str(root / "cache"))
        built = build_two_versions(root)
    return {"a": built["a"][0], "a-archive": built["a"][1], "b": built["b"][0],
            "b-archive": built["b"][1], "store": root / "store", "cache": root / "cache"}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_the_diff_view_is_weightstore_diff(versions, capsys):
    data = _json(capsys, "report", str(versions["b"]), "--against", str(versions["a-archive"]))
    assert set(data["views"]) == {"package", "diff"}
    view = data["views"]["diff"]
    diff = _json(capsys, "diff", str(versions["a-archive"]), str(versions["b"]))
    assert view["old"] == versions["a-archive"].name and not view["identical"]
    for kind in ("added", "removed", "changed"):
        for what in ("model", "weight", "scenario", "device", "file"):
            assert view["counts"][what][kind] == sum(
                c["kind"] == kind and c["what"] == what for c in diff["changes"])
    assert {(t["kind"], t["name"], t["old"], t["new"]) for t in view["tensors"]} == {
        (c["kind"], c["name"], c["old"], c["new"]) for c in diff["changes"]
        if c["what"] == "weight"}
    changed = next(t for t in view["tensors"] if t["name"] == f"encoder/{CHANGED}")
    assert changed["kind"] == "changed" and changed["bytes"] == 32 * 32 * 4
    assert view["fetch"]["changed_file_bytes"] == diff["fetch"]["file_bytes"]
    assert view["fetch"]["registry_pull_bytes"] == diff["fetch"]["payload_bytes"]
    assert view["fetch"]["devices"] == diff["fetch"]["devices"]
    summary = json.loads((versions["b"] / "summary.json").read_text())
    assert view["fetch"]["package_bytes"] == sum(c["size"] for c in summary["contents"])
    assert view["fetch"]["registry_pull_bytes"] < view["fetch"]["changed_file_bytes"] \
        < view["fetch"]["package_bytes"]
    models = {m["model"]: m for m in view["models"]}
    assert models["second"]["old_bytes"] == 0 and models["second"]["new_bytes"] == \
        models["second"]["changed_bytes"] > 0
    assert models["encoder"]["old_bytes"] == models["encoder"]["new_bytes"]
    assert models["encoder"]["changed_bytes"] == changed["bytes"]
    # an identical pair says so
    same = _json(capsys, "report", str(versions["a"]), "--against", str(versions["a-archive"]))
    assert same["views"]["diff"]["identical"] and not same["views"]["diff"]["tensors"]
    assert main(["report", str(versions["b"]), "--against", str(versions["a"])]) == 0
    assert "tensors +" in capsys.readouterr().out


def test_the_store_view_is_the_store_s_own_figures(versions, capsys):
    store = str(versions["store"])
    data = _json(capsys, "report", "--store", store)
    assert set(data["views"]) == {"store"} and data["target"]["kind"] == "store"
    view = data["views"]["store"]
    roots = _json(capsys, "store", "ls", "--store", store)
    assert {r["id"]: (r["size"], r["exclusive_bytes"], r["pinned"], r["live"])
            for r in roots} == {r["id"]: (r["bytes"], r["exclusive_bytes"], r["pinned"],
                                          r["live"]) for r in view["roots"]}
    assert len(view["roots"]) >= 2 and any(r["exclusive_bytes"] > 0 for r in view["roots"])
    stats = _json(capsys, "store", "stats", "--store", store)
    assert view["totals"]["objects"] == stats["objects"]
    assert view["totals"]["payload_bytes"] == stats["payload_bytes"]
    ages = view["ages"]
    assert sum(a["objects"] for a in ages) == stats["objects"]
    assert sum(a["bytes"] for a in ages) == stats["payload_bytes"]
    assert ages[0]["objects"] == stats["objects"]  # all built within the newest day
    # pinned, dead, and what gc would free: as gc's dry run says
    assert main(["store", "pin", "pkg", "--store", store]) == 0
    capsys.readouterr()
    plan = _json(capsys, "store", "gc", "--dry-run", "--store", store)
    view = _json(capsys, "report", "--store", store)["views"]["store"]
    assert view["totals"]["pinned"] == len(roots) and all(r["pinned"] for r in view["roots"])
    assert view["gc"]["freed_bytes"] == plan["freed_bytes"]
    assert view["gc"]["garbage_objects"] == plan["garbage_objects"]
    assert main(["store", "unpin", "pkg", "--store", store]) == 0
    capsys.readouterr()
    # the same store gives the same data, whenever it is drawn
    again = _json(capsys, "report", "--store", store)
    assert again == _json(capsys, "report", "--store", store)
    assert main(["report", "--store", store]) == 0
    assert "only here" in capsys.readouterr().out


def test_a_store_reference_is_reported_as_its_build(versions, capsys, monkeypatch):
    """``PACKAGE/VERSION/LAYOUT`` with ``--store``: the build assembled from the store by
    its action record (every piece re-hashed), reported as its folder is; the store view
    comes beside it, and a reference the store does not hold is one line, exit 2."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(versions["cache"]))
    store = str(versions["store"])
    # both versions are pkg/1.0.0/combined: a root id picks one
    roots = {r["folder"]: r["id"] for r in _json(capsys, "store", "ls", "--store", store)}
    ref = f"pkg/1.0.0/combined@{roots[str(versions['b'].absolute())]}"
    by_ref = _json(capsys, "report", ref, "--store", store)
    by_folder = _json(capsys, "report", str(versions["b"]))
    assert by_ref["target"]["kind"] == "store reference"
    assert by_ref["views"]["package"] == by_folder["views"]["package"]
    assert set(by_ref["views"]) == {"package", "store"}
    assert len(_json(capsys, "store", "ls", "--store", store)) == len(roots)  # none added
    assert main(["report", "nosuch/1.0.0", "--store", store]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no build in the store matches" in err
    assert main(["report", "pkg/1.0.0/combined", "--store", store]) == 2  # two builds
    assert "several builds" in capsys.readouterr().err


def test_bad_view_input_is_one_line_and_exit_2(versions, capsys, tmp_path):
    for argv, message in (
            (["report", "--store", str(tmp_path)], "not a weight store"),
            (["report", str(versions["b"]), "--against", str(tmp_path / "nothing")],
             "no such package"),
            (["report", "--store", str(versions["store"]), "--against", str(versions["a"])],
             "give the newer one as TARGET")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_the_views_in_a_browser(versions, chromium, tmp_path, capsys):
    """Each view's section loads offline without a console message, draws something other
    than the package view, and shows the numbers the data holds."""
    page = tmp_path / "report.html"
    argv = ["report", str(versions["b"]), "--against", str(versions["a"]), "--store",
            str(versions["store"])]
    assert main([*argv, "--output", str(page)]) == 0
    capsys.readouterr()
    data = _json(capsys, *argv)
    shots = {}
    for name in ("package", "diff", "store"):
        loaded = chromium.load(page, name)
        assert loaded.console == [], loaded.console
        assert png_colours(loaded.screenshot) > 50
        shots[name] = loaded.screenshot
        if name == "package":
            continue
        view = data["views"][name]
        shown = {k: int(v) for k, v in FIGURE.findall(_section(loaded.dom, name))}
        expected = _flatten(view)
        numbers = {k: v for k, v in shown.items() if k in expected}
        assert numbers and numbers == {k: expected[k] for k in numbers}
        assert len(numbers) >= 5
    assert len(set(shots.values())) == 3


def _section(dom: str, name: str) -> str:
    start = dom.index(f'id="view-{name}"')
    end = dom.find("<section", start + 1)
    return dom[start:end if end > 0 else len(dom)]


def _flatten(view: dict) -> dict[str, int]:
    """The view's numbers under the keys the page gives them (``data-key``)."""
    out: dict[str, int] = {}
    for what, kinds in view.get("counts", {}).items():
        for kind, n in kinds.items():
            out[f"counts.{what}.{kind}"] = n
    for key, value in view.get("fetch", {}).items():
        if isinstance(value, int):
            out[f"fetch.{key}"] = value
    for name, value in view.get("fetch", {}).get("devices", {}).items():
        out[f"fetch.devices.{name}"] = value
    for m in view.get("models", []):
        for k in ("old_bytes", "new_bytes", "changed_bytes"):
            out[f"models.{m['model']}.{k}"] = m[k]
    for i, t in enumerate(view.get("tensors", [])):
        out[f"tensors.{i}.bytes"] = t["bytes"]
    if "totals" in view:
        t = view["totals"]
        out |= {"store.objects": t["objects"], "store.payload_bytes": t["payload_bytes"],
                "store.roots": t["roots"]}
        out |= {f"gc.{k}": v for k, v in view["gc"].items()}
        for r in view["roots"]:
            out |= {f"roots.{r['id']}.objects": r["objects"],
                    f"roots.{r['id']}.bytes": r["bytes"],
                    f"roots.{r['id']}.exclusive_bytes": r["exclusive_bytes"]}
        for i, a in enumerate(view["ages"]):
            out |= {f"ages.{i}.objects": a["objects"], f"ages.{i}.bytes": a["bytes"]}
    return out


def test_formats_md_shows_each_view_s_shape(versions, capsys):
    """docs/reference/formats/report-data.md's examples of the diff and store views have
    exactly the keys the data has, at every level they show."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "formats"
            / "report-data.md").read_text()
    data = _json(capsys, "report", str(versions["b"]), "--against", str(versions["a"]),
                 "--store", str(versions["store"]))["views"]
    for name, heading in (("diff", "## The diff view"), ("store", "## The store view")):
        section = text[text.index(heading):]
        start = section.index("```json") + len("```json")
        doc = json.loads(section[start:section.index("```", start)])
        real = data[name]
        assert sorted(doc) == sorted(real), name
        for key, value in doc.items():
            if isinstance(value, dict) and value and key != "devices":
                assert sorted(value) == sorted(real[key]), (name, key)
            if isinstance(value, list) and value and isinstance(value[0], dict):
                assert sorted(value[0]) == sorted(real[key][0]), (name, key)


def test_objects_by_age_are_counted_back_from_the_newest():
    """Each object falls in the bucket of its age behind the newest object: a day, a week,
    30 and 90 days are the limits, each bucket's upper limit excluded."""
    from weightstore.report.store_view import DAY, _ages

    newest = 1_800_000_000
    rows = [(newest, 1), (newest - DAY + 1, 2), (newest - DAY, 4), (newest - 7 * DAY, 8),
            (newest - 30 * DAY, 16), (newest - 89 * DAY, 32), (newest - 90 * DAY, 64),
            (newest - 400 * DAY, 128)]
    assert [(a["objects"], a["bytes"]) for a in _ages(rows)] == [
        (2, 3), (1, 4), (1, 8), (2, 48), (2, 192)]
    assert [a["objects"] for a in _ages([])] == [0, 0, 0, 0, 0]
