"""The build: a recipe's models hashed into the store and written as packages.

:mod:`.run` is ``weightstore build`` end to end (recipe -> catalogue -> store -> packages),
:mod:`.plan` renders what ``build --dry-run`` would do. ``weightstore.build(recipe)`` is
:func:`.run.build`. (The folder is not named ``build/``: that name is ignored as a build
output at any depth by common ``.gitignore`` templates and skipped by tools.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "build": ("run", "build"),
    "BuildOptions": ("run", "BuildOptions"),
    "BuildResult": ("run", "BuildResult"),
    "PackageResult": ("run", "PackageResult"),
    "render_plan": ("plan", "render_plan"),
}
__all__ = ["BuildOptions", "BuildResult", "PackageResult", "build", "render_plan"]

if TYPE_CHECKING:
    from .plan import render_plan
    from .run import BuildOptions, BuildResult, PackageResult, build

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
