"""The registry of report views: what each collects, how it renders, in tab order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import diff, package, package_page, store_view
from .request import ReportRequest


@dataclass(frozen=True)
class View:
    """One view of the page: ``name`` is its key in ``views``, its section's id
    (``view-NAME``) and its URL fragment (``#NAME``); ``title`` its tab's label."""

    name: str
    title: str
    collect: Callable[[ReportRequest], dict[str, Any] | None]
    render: Callable[[dict[str, Any], dict[str, Any]], str]
    summarize: Callable[[dict[str, Any]], list[str]] | None = None
    # the request's options this view answers ("against", "store"): an option no view
    # answers is refused rather than ignored
    answers: tuple[str, ...] = ()


VIEWS: tuple[View, ...] = (
    View("package", "Package", package.collect, package_page.render, package.summarize),
    View("diff", "Changes", diff.collect, diff.render, diff.summarize, answers=("against",)),
    View("store", "Store", store_view.collect, store_view.render, store_view.summarize,
         answers=("store",)),
)
