"""``weightstore report``: one self-contained HTML page of where a package's bytes go.

The report is made in two steps that never mix:

* :mod:`.data` collects everything the page shows into one JSON-serializable dict (what
  ``report --json`` prints): ``{"format_version", "generator", "target", "views"}``, where
  ``views`` maps each view's name to its own data. It is deterministic: keys sorted when
  written, lists in a defined order, no timestamps, no absolute paths.
* :mod:`.page` renders the HTML from that dict alone (one file, everything inline: no
  CDN, no network, no external fonts), and :mod:`.text` the terminal summary. Neither
  reads a package or computes a figure the dict does not hold.

How a view plugs in: write its collector, ``collect(request) -> dict | None`` (a
:class:`~.views.ReportRequest` in; its data out, or None when the view does not apply to
this request), its renderer, ``render(view, data) -> str`` (the view's data and the whole
report in; an HTML fragment out, which the page wraps in ``<section id="view-NAME">``
with its own tab, shown at ``report.html#NAME``), and optionally ``summarize(view) ->
list[str]`` (lines for the terminal summary); then add one :class:`~.views.View` to
:data:`~.views.VIEWS`, in the order of the tabs, with ``answers`` naming the command's
options it serves (``("against",)`` for a diff view: an option no view answers is
refused, never silently ignored). Shared pieces for renderers (byte
formatting, tables, the ``data-key``/``data-value`` attributes the browser tests read
numbers by) are in :mod:`.html`. The package view (:mod:`.package`,
:mod:`.package_page`, :mod:`.treemap`) is the first one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports, make_callable

_EXPORTS: dict[str, tuple[str, str | None]] = {"report": ("api", "report")}
__all__ = ["report"]

if TYPE_CHECKING:
    from .api import report

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
make_callable(__name__, "report")  # weightstore.report(target) is the function
