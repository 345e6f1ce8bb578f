"""The README is the five-minute way in: short, its set-up commands the ones CI runs, and
every page it links to there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BUILD = ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
         ".venv/bin/weightstore build recipes/tiny-bert.yaml")
TEST = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && "
        ".venv/bin/python -m pytest -q")


def test_readme_is_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes; move the detail into docs/"


def test_the_two_set_up_commands_come_first_and_ci_runs_the_second_verbatim():
    text = README.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert [b.strip() for b in blocks[:2]] == [BUILD, TEST]
    assert text.index(BUILD) < text.index("## A tour")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST in ci, ".ci/run must run the README's test command verbatim"


def test_every_relative_link_of_the_readme_names_a_file_of_the_checkout():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in relative)
    missing = [link for link in relative if not (ROOT / link).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
