"""mkdocs hooks (``hooks:`` in mkdocs.yml): a block the example tests skip says why.

``<!-- not-run: reason -->`` on the line before a fenced block marks a block that
tests/test_doc_examples.py does not run. An HTML comment is invisible on the page, so the
site shows the reason in a note above the block, at the block's indentation (a block in a
list item keeps its note in the item).
"""

from __future__ import annotations

import re
from typing import Any

NOT_RUN = re.compile(r"^(?P<indent>[ \t]*)<!--\s*not-run:(?P<reason>.*?)-->[ \t]*$", re.M)
TITLE = "Not run by the documentation tests"


def show_not_run(markdown: str) -> str:
    """``markdown`` with each not-run marker turned into an admonition with its reason."""
    def note(m: re.Match[str]) -> str:
        indent = m["indent"]
        return f'{indent}!!! info "{TITLE}"\n{indent}    {m["reason"].strip()}\n\n'

    return NOT_RUN.sub(note, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return show_not_run(markdown)
