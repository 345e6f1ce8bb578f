"""Recipes: the YAML a build starts from.

:mod:`.schema` holds the pydantic models (and so the JSON Schema) and the loader that names
the file, line and key of every error; :mod:`.file` reads a recipe file's bytes without
yaml or pydantic (what an up-to-date check needs); :mod:`.selection` picks the models and
layouts a build or a command works on; :mod:`.companions` is the vocabulary of companion
files (kinds, the rule of their paths) and :mod:`.formats` the package format each recorded
setting needs, which readers of summaries share without pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "Recipe": ("schema", "Recipe"),
    "load_recipe": ("schema", "load_recipe"),
    "render_schema": ("schema", "render_schema"),
}
__all__ = ["Recipe", "load_recipe", "render_schema"]

if TYPE_CHECKING:
    from .schema import Recipe, load_recipe, render_schema

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
