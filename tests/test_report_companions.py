"""Companion files in ``weightstore report``: the package view lists them (path, kind,
size, digest) with a preview of a text file's first bytes, the diff view shows a changed
text file as a unified diff and a binary one by size and digest; checked in the data and
in headless Chromium, with markup in a file shown as text and never run."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from weightstore.cli import main

from .release_helpers import HOSTILE_TEXT, companion_sources, make_companion_checkout

FIGURE = re.compile(r'data-key="([^"]+)" data-value="(-?\d+)"')


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory, _encoder_master) -> dict[str, Path]:
    from weightstore.builder.run import BuildOptions, build
    from weightstore.release.api import ReleaseOptions, release

    root = tmp_path_factory.mktemp("report-companions")
    out = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(root / "cache"))
        for version in (1, 2):
            recipe = make_companion_checkout(root / f"v{version}", _encoder_master, version)
            build(recipe, BuildOptions(jobs=2))
            out[f"v{version}"] = recipe.parent / "out" / "pkg" / "1.0.0" / "combined"
        released = release(out["v1"], ReleaseOptions(output=str(root / "rel"), jobs=2))
    out["v1-archive"] = released.output / released.archives[0].file_name
    return out


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_package_view_lists_companions_with_a_preview_of_text(versions, capsys):
    from weightstore.report.package import PREVIEW_BYTES

    view = _json(capsys, str(versions["v1"]))["views"]["package"]
    summary = json.loads((versions["v1"] / "summary.json").read_text())
    sources = companion_sources(1)
    listed = {(c["path"], c["device"]): c for c in view["companions"]}
    assert set(listed) == {(c["path"], None) for c in summary["companions"]} | {
        ("genai_config.json", "cpu")}
    for c in summary["companions"]:
        entry = listed[(c["path"], None)]
        assert {k: entry[k] for k in ("kind", "size", "digest")} == {
            k: c[k] for k in ("kind", "size", "digest")}
        assert entry["file"] == c["path"]
    cpu = listed[("genai_config.json", "cpu")]
    assert cpu["file"] == "devices/cpu/genai_config.json"
    assert cpu["preview"] == sources["devices/cpu/genai_config.json"].decode()
    assert listed[("LICENSE", None)]["preview"] == sources["LICENSE"].decode()
    tokenizer = listed[("tokenizer.json", None)]
    assert len(sources["tokenizer.json"]) > PREVIEW_BYTES and tokenizer["truncated"]
    assert tokenizer["preview"] == sources["tokenizer.json"][:PREVIEW_BYTES].decode()
    blob = listed[("extra/blob.bin", None)]
    assert blob["preview"] is None and blob["kind"] == "weights"  # bytes, not text


def test_a_companion_edited_in_the_folder_is_refused_not_shown(versions, tmp_path, capsys):
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(versions["v1"], folder)
    licence = folder / "LICENSE"
    licence.write_bytes(licence.read_bytes().replace(b"Sample", b"Simple"))
    assert main(["report", str(folder), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LICENSE" in err


def test_the_diff_view_shows_a_changed_text_file_as_a_unified_diff(versions, capsys):
    view = _json(capsys, str(versions["v2"]), "--against", str(versions["v1"]))["views"][
        "diff"]
    old, new = companion_sources(1), companion_sources(2)
    by = {(c["kind"], c["path"], c["device"]): c for c in view["companions"]}
    assert set(by) == {("removed", "LICENSE", None), ("added", "README.md", None),
                       ("changed", "tokenizer.json", None),
                       ("changed", "genai_config.json", None),
                       ("changed", "extra/blob.bin", None),
                       ("changed", "genai_config.json", "cpu")}
    config = by[("changed", "genai_config.json", None)]
    assert config["diff"].startswith("--- a/genai_config.json\n+++ b/genai_config.json\n@@")
    assert '-    "max_length": 64\n+    "max_length": 128\n' in config["diff"]
    assert (config["old_size"], config["new_size"]) == (len(old["genai_config.json"]),
                                                          len(new["genai_config.json"]))
    blob = by[("changed", "extra/blob.bin", None)]  # bytes: by size and digest only
    assert blob["diff"] is None and blob["old_digest"] != blob["new_digest"]
    readme = by[("added", "README.md", None)]
    assert readme["diff"] == "--- /dev/null\n+++ b/README.md\n@@ -0,0 +1,3 @@\n" \
        "+# pkg\n+\n+A model card.\n"
    assert by[("removed", "LICENSE", None)]["old_kind"] == "doc"


def test_an_archive_s_companions_are_read_as_unpack_reads_them(versions, capsys):
    """Against an archive, the diff view has the same companion changes, diffs and all,
    as against the folder it was made of; the archive as the target too."""
    folder = _json(capsys, str(versions["v2"]), "--against", str(versions["v1"]))["views"]
    archive = _json(capsys, str(versions["v2"]), "--against", str(versions["v1-archive"]))[
        "views"]
    assert archive["diff"]["companions"] == folder["diff"]["companions"]
    assert [c["diff"] for c in folder["diff"]["companions"]].count(None) == 1  # the blob
    mine = _json(capsys, str(versions["v1-archive"]))["views"]["package"]["companions"]
    assert mine == _json(capsys, str(versions["v1"]))["views"]["package"]["companions"]


def test_a_long_text_diff_is_bounded(versions, capsys, monkeypatch):
    from weightstore.report import diff as diff_view

    monkeypatch.setattr(diff_view, "DIFF_LINES", 5)
    view = _json(capsys, str(versions["v2"]), "--against", str(versions["v1"]))["views"][
        "diff"]
    tokenizer = next(c for c in view["companions"] if c["path"] == "tokenizer.json")
    assert tokenizer["diff"].count("\n") == 5 and tokenizer["diff_truncated"]


def test_companions_in_a_browser(versions, chromium, tmp_path, capsys):
    """The package view's table and previews, and the diff view's unified diff, as the
    browser shows them: every size the data's, a preview that opens, markup in a licence
    shown as text, and nothing logged."""
    page = tmp_path / "report.html"
    argv = ["report", str(versions["v2"]), "--against", str(versions["v1"])]
    assert main([*argv, "--output", str(page), "-q"]) == 0
    data = _json(capsys, *argv[1:])["views"]
    loaded = chromium.load(page, "package")
    assert loaded.console == [], loaded.console
    section = _section(loaded.dom, "package")
    shown = dict(FIGURE.findall(section))
    for c in data["package"]["companions"]:
        key = f"companions.{c['device'] or ''}.{c['path']}.size"
        assert int(shown[key]) == c["size"], key
        assert html.escape(c["digest"]) in section
    assert '<details class="preview"' in section
    assert html.escape("# pkg\n\nA model card.\n", quote=False) in section

    old = tmp_path / "old.html"  # v1 holds the licence with markup in it
    assert main(["report", str(versions["v1"]), "--output", str(old), "-q"]) == 0
    loaded = chromium.load(old, "package")
    assert loaded.console == []
    outside_scripts = re.sub(r"<script\b.*?</script>", "", loaded.dom, flags=re.S)
    assert "<img" not in outside_scripts
    assert html.escape(HOSTILE_TEXT, quote=False) in outside_scripts

    loaded = chromium.load(page, "diff")
    assert loaded.console == []
    section = _section(loaded.dom, "diff")
    assert html.escape('-    "max_length": 64', quote=False) in section
    assert html.escape('+    "max_length": 128', quote=False) in section
    # the licence removed: its markup is text in the diff too
    assert "<img" not in re.sub(r"<script\b.*?</script>", "", section, flags=re.S)
    shown = dict(FIGURE.findall(section))
    for c in data["diff"]["companions"]:
        key = f"companions.{c['device'] or ''}.{c['path']}"
        for side in ("old", "new"):
            if c[f"{side}_size"] is not None:
                assert int(shown[f"{key}.{side}_size"]) == c[f"{side}_size"]


def _section(dom: str, name: str) -> str:
    start = dom.index(f'id="view-{name}"')
    end = dom.find("<section", start + 1)
    return dom[start:end if end > 0 else len(dom)]
