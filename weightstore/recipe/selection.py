"""Building part of a recipe: ``weightstore build --model NAME --layout NAME``.

A selection is made before anything is read: only the named layouts are built, and their
packages hold only the named models. Devices, and the scenarios they may name or choose
from, stay the whole recipe's, so each packaged model runs on a device as it would in a
build of the whole recipe. Such a package is a build of its own (its fingerprint covers
the models it holds), so it replaces a package of the whole recipe, or is replaced by
one, only with ``--force``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import RecipeError
from .schema import LoadedRecipe


def select_part(loaded: LoadedRecipe, models: Sequence[str] = (),
                layouts: Sequence[str] = ()) -> LoadedRecipe:
    """The recipe narrowed to ``models`` and ``layouts`` (all when empty), in recipe order.

    An unknown name is a :class:`RecipeError` naming it, the recipe, and the closest
    known name.
    """
    recipe = loaded.recipe
    if models:
        chosen = _pick(recipe.models, models, "model", loaded)
        loaded = dataclasses.replace(loaded, selected=frozenset(m.name for m in chosen))
    if layouts:
        chosen = _pick(recipe.layouts, layouts, "layout", loaded)
        loaded = dataclasses.replace(loaded, recipe=recipe.model_copy(
            update={"layouts": chosen}))
    return loaded


def _pick(items: Sequence, names: Sequence[str], kind: str, loaded: LoadedRecipe) -> list:
    known = [item.name for item in items]
    for name in names:
        if name not in known:
            import difflib  # only to word the error

            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise RecipeError(f"--{kind} '{name}' names no {kind} of the recipe "
                              f"({len(known)} {kind}s){hint}", file=str(loaded.path))
    wanted = set(names)
    return [item for item in items if item.name in wanted]


__all__ = ["select_part"]
