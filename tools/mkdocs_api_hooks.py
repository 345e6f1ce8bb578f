"""mkdocs hooks (``hooks:`` in mkdocs.yml): the Python API page's docstrings read as text.

The package's docstrings cross-reference in Sphinx's roles (``:class:`Recipe```,
``:func:`~weightstore.build```), which mkdocstrings renders as the role's name followed by
the code. The page shows the code alone, as a reader of the docstring would read it (a
leading ``~``, Sphinx's "show the last part", keeps only the last dotted part).
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):"
                  r"(?P<open><code[^>]*>)(?P<tilde>~)?(?P<name>[^<]*)</code>")


def strip_roles(html: str) -> str:
    """``html`` with each rendered Sphinx role reduced to its code."""
    def code(m: re.Match[str]) -> str:
        name = m["name"].rsplit(".", 1)[-1] if m["tilde"] else m["name"]
        return f"{m['open']}{name}</code>"

    return ROLE.sub(code, html)


def on_page_content(html: str, **_: Any) -> str:
    return strip_roles(html)
