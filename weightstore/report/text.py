"""The terminal summary ``weightstore report TARGET`` prints without ``--output``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .views import VIEWS


def render_text(data: Mapping[str, Any]) -> str:
    """Each present view's lines (:attr:`~.views.View.summarize`), in tab order."""
    lines: list[str] = []
    for view in VIEWS:
        if view.name in data["views"] and view.summarize is not None:
            lines += view.summarize(data["views"][view.name])
    return "\n".join(lines) + "\n"
