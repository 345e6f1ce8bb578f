"""Every shell, console and Python example of README.md and docs/ runs, one test per page.

The conventions the pages follow (where blocks run, a fresh home, ``$REGISTRY``, the
``<!-- not-run: reason -->`` marker, how console output is compared) are the runner's:
see tests/doc_examples.py. ``pytest tests/test_doc_examples.py -k first-package`` runs
one page.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import stat
from pathlib import Path

import pytest

from tests.doc_examples import (
    REPO,
    ExampleError,
    Page,
    make_sandbox,
    needs_registry,
    pages,
    parse_page,
    run_block,
)
from tests.registry_server import BINARY, SKIP_REASON, running_registry


def run_page(page: Page, root: Path) -> None:
    if page.errors:
        raise ExampleError("\n".join(page.errors))
    runnable = [b for b in page.blocks if b.not_run is None]
    if not runnable:
        return
    registry = needs_registry(page)
    if registry and BINARY is None:
        pytest.skip(f"{page.name} pushes to a registry: {SKIP_REASON}")
    if any("import onnxruntime_genai" in b.text for b in runnable) \
            and importlib.util.find_spec("onnxruntime_genai") is None:
        pytest.skip(f"{page.name} opens a folder with onnxruntime-genai: the genai extra is "
                    "not installed (onnxruntime-genai 0.18 needs Python 3.11)")
    with contextlib.ExitStack() as stack:
        box = make_sandbox(root)
        stack.callback(box.close)
        if registry:
            server = stack.enter_context(running_registry(root / "registry"))
            box.env["REGISTRY"] = server.host
        for block in runnable:
            run_block(box, block)


def _page_id(path: Path) -> str:
    return str(path.relative_to(REPO)).removesuffix(".md")


@pytest.mark.parametrize("path", pages(), ids=_page_id)
def test_page_examples_run(path: Path, tmp_path: Path) -> None:
    try:
        run_page(parse_page(path), tmp_path)
    except ExampleError as exc:
        failure = str(exc)
    else:
        return
    pytest.fail(failure, pytrace=False)


# the runner itself, on small pages of its own

def _page(tmp_path: Path, text: str) -> Page:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "page.md"
    path.write_text(text)
    return parse_page(path, "page.md")


def _run(tmp_path: Path, text: str) -> None:
    run_page(_page(tmp_path, text), tmp_path / "run")


def test_blocks_run_in_order_in_a_fresh_clone_and_home(tmp_path: Path) -> None:
    _run(tmp_path, "# t\n\n```sh\ntest -f recipes/tiny-bert.yaml\n"
                   "test -z \"$(ls -A ~)\"\ntest -z \"${SOURCE_DATE_EPOCH:-}\"\n"
                   "git log -1 --format=%ct | grep -qx '[0-9]*'\n"
                   "export GREETING=hello\nmkdir sub && cd sub\n```\n\n"
                   "```yaml\nnot: run\n```\n\n"
                   "```python\nimport os, pathlib\nassert os.environ['GREETING'] == 'hello'\n"
                   "assert pathlib.Path.cwd().name == 'sub'\nmade = 1\n```\n\n"
                   "```python\nassert made == 1  # a page's Python blocks share names\n```\n")


def test_a_failing_command_names_page_line_and_stderr(tmp_path: Path) -> None:
    with pytest.raises(ExampleError) as err:
        _run(tmp_path, "# t\n\n```bash\ntrue\nls no-such-file\ntrue\n```\n")
    message = str(err.value)
    assert message.startswith("page.md:5: exit 2: ls no-such-file")
    assert "No such file" in message


def test_console_commands_run_and_their_shown_output_is_checked(tmp_path: Path) -> None:
    _run(tmp_path, "```console\n$ printf 'a  b\\nnoise\\nsize 12.5 MB\\n'\na b\n...\n"
                   "size … MB\n$ echo one \\\n  two\none two\n```\n")
    with pytest.raises(ExampleError, match=r"page.md:2: .*\n.*'b'"):
        _run(tmp_path / "2", "```console\n$ printf 'b\\na\\n'\na\nb\n```\n")


def test_not_run_blocks_are_skipped_and_need_a_reason(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- not-run: needs a cloud registry -->\n```sh\nfalse\n```\n")
    assert [b.not_run for b in page.blocks] == ["needs a cloud registry"]
    run_page(page, tmp_path / "run")
    assert _page(tmp_path, "<!-- not-run: -->\n```sh\nfalse\n```\n").errors == [
        "page.md:1: a not-run marker needs a reason"]
    assert _page(tmp_path, "<!-- not-run: why -->\n\n```sh\nfalse\n```\n").errors


def test_indented_blocks_in_lists_run(tmp_path: Path) -> None:
    page = _page(tmp_path, "- item:\n\n  ```sh\n  exit 3\n  ```\n")
    assert [(b.line, b.text) for b in page.blocks] == [(3, "exit 3\n")]


def test_registry_pages_get_a_real_registry(tmp_path: Path) -> None:
    if BINARY is None:
        pytest.skip(SKIP_REASON)
    _run(tmp_path, "```sh\nweightstore build recipes/tiny-bert.yaml\n"
                   "weightstore push dist/tiny-bert/1.0.0/release $REGISTRY/team/tiny-bert:1\n"
                   "weightstore pull $REGISTRY/team/tiny-bert:1 pulled\n"
                   "test -f pulled/summary.json\n```\n")


def test_key_generate_makes_the_config_folder_private(tmp_path: Path) -> None:
    """The README's first signing step, on a fresh home."""
    _run(tmp_path, "```sh\nweightstore key generate ~/.config/weightstore/release.pem\n```\n")
    home = tmp_path / "run" / "home"
    for folder in (home / ".config", home / ".config" / "weightstore"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".config/weightstore/release.pem").stat().st_mode) == 0o600


def test_the_site_shows_why_a_block_is_not_run() -> None:
    """The marker is an HTML comment; the site's hook (mkdocs.yml) turns it into a note
    above the block, rendered here with the site's Markdown extensions."""
    markdown = pytest.importorskip("markdown", reason="the docs extra is not installed")
    from tools.mkdocs_hooks import TITLE, show_not_run

    page = ("Intro.\n\n<!-- not-run: needs cosign -->\n```sh\ncosign version\n```\n\n"
            "- an item:\n\n    <!-- not-run: needs oras -->\n    ```sh\n    oras version\n"
            "    ```\n")
    html = markdown.markdown(show_not_run(page), extensions=[
        "admonition", "pymdownx.superfences"])
    assert html.count(f'<p class="admonition-title">{TITLE}</p>') == 2
    assert "<p>needs cosign</p>" in html and "<p>needs oras</p>" in html
    assert html.index("needs oras") > html.index("<li>")  # the note stays in its item
    blocks = re.findall(r"<pre>(.*?)</pre>", html, flags=re.S)  # still code blocks
    assert [re.sub(r"<[^>]+>", "", b).strip() for b in blocks] == ["cosign version",
                                                                   "oras version"]
    assert "not-run" not in html
