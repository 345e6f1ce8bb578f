"""The documentation site (mkdocs.yml, docs/): its generated reference pages are what the
code says now, ``mkdocs build --strict`` has no warning, and the built site, served over a
loopback HTTP server and opened in headless Chromium, renders every page without an error,
finds pages by search (its index runs in a web worker, so not from file://), and holds no
broken link: every link within the site reaches a page, and its anchor an element of it."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("material", reason="the docs extra is not installed (mkdocs-material)")

from tests.browser import DevTools
from tools import gen_reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_reference_is_up_to_date() -> None:
    """docs/reference/cli.md and recipe.md are the parser's and the schema's rendering now."""
    for path, text in gen_reference.pages().items():
        assert path.exists() and path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is out of date: run `python tools/gen_reference.py`")


def test_the_cli_reference_has_every_command_and_argument() -> None:
    """Every parser (command and subcommand) has its section, and every argument it takes
    is in that section's table, its default too (the machine's --jobs by its rule)."""
    from weightstore import cli

    page = (ROOT / gen_reference.CLI_PAGE).read_text(encoding="utf-8")
    sections = {s.split("`", 2)[1]: s for s in page.split("\n#")[1:]
                if s.lstrip("#").startswith(" `")}
    parsers = cli._subparsers(cli._parser())
    assert parsers and {p.prog for p in parsers} == set(sections)
    for parser in parsers:
        for action in gen_reference._arguments(parser, frozenset({"-q", "--quiet", "-v",
                                                                 "--verbose"})):
            assert f"| `{gen_reference._invocation(action)}` |" in sections[parser.prog]
    assert "| `--jobs JOBS` | one per CPU, at most 8 |" in sections["weightstore build"]
    assert "| `--output OUTPUT` |" in sections["weightstore schema"]


def test_the_recipe_reference_has_every_key_of_every_model() -> None:
    import json

    schema = json.loads((ROOT / "schemas" / "recipe.schema.json").read_text(encoding="utf-8"))
    page = (ROOT / gen_reference.RECIPE_PAGE).read_text(encoding="utf-8")
    models = {"The recipe": schema, **schema["$defs"]}
    for name, model in models.items():
        heading = f"## {name}\n" if name == "The recipe" or not name.endswith("Pass") else (
            f"### {name}\n")
        assert heading in page, name
        section = page.split(heading, 1)[1].split("\n#", 1)[0]
        for key in model["properties"]:
            assert f"| `{key}` |" in section, (name, key)
    assert '| `block_size` | integer | `128` |' in page  # a pass's parameter, its default


def test_every_format_page_states_its_versions_and_is_listed() -> None:
    """One page per on-disk format under docs/reference/formats/, each stating its
    format_version(s) under its title, each listed on the formats' index page."""
    folder = ROOT / "docs" / "reference" / "formats"
    index = (folder / "index.md").read_text(encoding="utf-8")
    pages = sorted(p for p in folder.glob("*.md") if p.name != "index.md")
    assert len(pages) >= 8
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("**format_version:**"), page
        assert f"]({page.name})" in index, page.name


@dataclass(frozen=True)
class Built:
    site: Path
    log: str
    returncode: int


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1",
             "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    return Built(site, done.stdout + done.stderr, done.returncode)


def test_the_strict_build_has_no_warning(built: Built) -> None:
    assert built.returncode == 0, built.log[-4000:]
    assert "WARNING" not in built.log and "ERROR" not in built.log, built.log[-4000:]


def test_the_api_page_renders_every_public_name_as_text(built: Built) -> None:
    """Each public name has its section, rendered from its docstring, and the docstrings'
    Sphinx roles read as code (tools/mkdocs_api_hooks.py), not ``:class:Recipe``."""
    import re

    import weightstore

    if built.returncode:
        pytest.fail("the site did not build (test_the_strict_build_has_no_warning)")
    html = (built.site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    headings = re.findall(r'<h4 id="weightstore\.[^"]*" class="doc doc-heading">\s*(\S+)',
                          html)
    assert sorted(headings) == sorted(f"weightstore.{n}" for n in weightstore.__all__
                                      if n != "__version__")
    assert "doc-contents" in html
    assert not re.findall(r":[a-z]+:<code", html)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(built: Built) -> Iterator[str]:
    """The built site over HTTP on a loopback port: its base URL."""
    if built.returncode:
        pytest.fail("the site did not build (test_the_strict_build_has_no_warning)")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(built.site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()
    thread.join()


@dataclass(frozen=True)
class Page:
    title: str
    h1: str
    links: list[str]  # every <a href>, resolved by the browser
    ids: set[str]  # every element id (an anchor's target)
    errors: list[str]  # exceptions, console errors, failed loads


_PAGE_FACTS = """({
  title: document.title,
  h1: [...(document.querySelector("article h1") || {childNodes: []}).childNodes]
    .filter(n => !(n.classList && n.classList.contains("headerlink")))
    .map(n => n.textContent).join("").trim(),
  links: [...document.querySelectorAll("a[href]")].map(a => a.href),
  ids: [...document.querySelectorAll("[id]")].map(e => e.id)
    .concat([...document.querySelectorAll("a[name]")].map(a => a.name)),
})"""


def _page_paths(site: Path) -> list[str]:
    """Each page of the built site by its URL path (``reference/cli/``; the home ``""``)."""
    paths = (p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    return sorted("" if p == "." else p + "/" for p in paths)


@pytest.fixture(scope="module")
def pages(built: Built, served: str, chromium: Any) -> dict[str, Page]:
    """Every page the site has, as Chromium showed it, by URL path."""
    out = {}
    with DevTools(chromium.binary) as browser:
        for path in _page_paths(built.site):
            browser.console.clear()
            browser.navigate(served + path)
            facts = browser.evaluate(_PAGE_FACTS)
            out[path] = Page(facts["title"], facts["h1"], facts["links"], set(facts["ids"]),
                             list(browser.console))
    return out


def test_every_page_renders(pages: dict[str, Page]) -> None:
    nav = ["", "reference/cli/", "reference/recipe/", "reference/api/",
           "reference/formats/", "reference/formats/store/", "explanation/architecture/",
           "how-to/reading-a-report/"]
    assert set(nav) <= set(pages), sorted(pages)
    for path, page in pages.items():
        assert page.title.endswith("weightstore") and page.h1, (path, page.title, page.h1)
        assert page.errors == [], (path, page.errors)
    assert pages["reference/cli/"].h1 == "Command line"
    assert "weightstore-build" in pages["reference/cli/"].ids


def _target(url: str, base: str) -> tuple[str, str] | None:
    """A link within the site as (page path, fragment); None for one leaving it."""
    if not url.startswith(base):
        return None
    parts = urlsplit(url)
    path = unquote(parts.path)[len(urlsplit(base).path):]
    return path.removesuffix("index.html"), unquote(parts.fragment)


def test_no_link_is_broken(pages: dict[str, Page], served: str, built: Built) -> None:
    broken = []
    links = 0
    for path, page in pages.items():
        for url in page.links:
            target = _target(url, served)
            if target is None:
                continue
            links += 1
            to, fragment = target
            if to in pages:
                if fragment and fragment not in pages[to].ids:
                    broken.append((path, url, "no such anchor"))
            elif not (built.site / to).is_file():
                broken.append((path, url, "no such page"))
    assert links > 100 and broken == []


def test_the_link_check_sees_a_broken_link(pages: dict[str, Page], served: str) -> None:
    assert _target(served + "reference/cli/#weightstore-build", served) == (
        "reference/cli/", "weightstore-build")
    assert _target("https://github.com/weightstore/weightstore", served) is None
    assert "no-such-anchor" not in pages["reference/cli/"].ids


def test_search_finds_pages(served: str, chromium: Any) -> None:
    """Typed into the search box, a query lists the pages that hold it (the index is
    loaded and searched by the theme's web worker)."""
    with DevTools(chromium.binary) as browser:
        browser.navigate(served + "reference/recipe/")
        browser.evaluate('document.querySelector("[data-md-toggle=search]").click();'
                         'document.querySelector("input[data-md-component=search-query]")'
                         '.focus()')
        browser.call("Input.insertText", {"text": "QuantizeWeightsPass"})
        found = browser.wait_for(
            '[...document.querySelectorAll(".md-search-result__item a")].map(a => a.href)')
        assert found, "the search listed nothing"
        assert any("/reference/recipe/" in url for url in found), found
        assert browser.console == []
