"""Small pieces every view's renderer shares: escaping, byte figures, tables.

Numbers the page shows carry their exact value for machines beside the rounded one for
people: ``<span data-key="KEY" data-value="N">1.37 MB</span>``. The browser tests read
them back from the DOM by their key and compare them with ``--json`` and
``summary.json``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def human_bytes(n: int | float) -> str:
    """Decimal units, three significant digits: 1.37 MB."""
    value, unit = float(n), 0
    while abs(value) >= 1000 and unit < len(UNITS) - 1:
        value, unit = value / 1000, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {UNITS[unit]}"


def figure(key: str, value: int, text: str | None = None) -> str:
    """A number shown rounded, its exact value in ``data-value`` under ``data-key``."""
    shown = human_bytes(value) if text is None else text
    return (f'<span class="fig" data-key="{esc(key)}" data-value="{int(value)}" '
            f'title="{int(value):,} bytes">{esc(shown)}</span>')


def accuracy_figure(value: float | None) -> str:
    """An accuracy figure as the summary rounds it (6 significant digits); None is an
    output that was not finite."""
    return "not finite" if value is None else f"{value:.6g}"


def count(key: str, value: int) -> str:
    """A count shown as it is, its value under ``data-key`` as :func:`figure` does."""
    return figure(key, value, f"{int(value):,}")


def table(head: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "") -> str:
    """A table of HTML cells (already escaped); numeric columns are the ones whose head
    starts with '#'."""
    numeric = [h.startswith("#") for h in head]
    th = "".join(f'<th{" class=num" if n else ""}>{esc(h.lstrip("#"))}</th>'
                 for h, n in zip(head, numeric, strict=True))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if n else ""}>{c}</td>'
                                    for c, n in zip(row, numeric, strict=True)) + "</tr>"
                   for row in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


# what HTML's script data states could take for markup (``</script``, ``<!--`` which makes
# the parser swallow the rest of the page), and the separators older JavaScript parsers
# end a line at, each written as the JSON escape it stands for
_INERT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                        "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_script(element_id: str, value: Any) -> str:
    """Data for the page's script, inline and inert: no ``<``, ``>`` or ``&`` appears in
    it (each is a ``\\u`` escape, which JSON reads back as the character), so neither
    ``</script>`` nor ``<!--`` in a name can end or change the element."""
    import json

    text = json.dumps(value, sort_keys=True, separators=(",", ":")).translate(_INERT)
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'
