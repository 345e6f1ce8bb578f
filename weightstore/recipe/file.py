"""Reading a recipe file: a regular file, capped in size, as bytes.

Kept apart from :mod:`weightstore.recipe.schema` (yaml and pydantic) so that an up-to-date build
can compare a recipe's bytes with its build stamp before paying for parsing; the bytes
read here are the ones parsed, so a stamp never describes a recipe other than the one
validated.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import RecipeError
from ..io.files import NotRegularFileError, open_regular

RECIPE_SIZE_LIMIT = 1 << 20  # bytes: a recipe is a page of YAML; this is far beyond any


def read_recipe_file(path: str | os.PathLike[str]) -> tuple[Path, bytes]:
    """The recipe's absolute path and bytes; every failure is a :class:`RecipeError`."""
    filename = os.fspath(path)
    absolute = Path(os.path.abspath(filename))
    try:
        with os.fdopen(open_regular(absolute), "rb") as f:
            data = f.read(RECIPE_SIZE_LIMIT + 1)
    except FileNotFoundError:
        raise RecipeError("recipe file not found", file=filename) from None
    except NotRegularFileError as exc:
        raise RecipeError(f"recipe path is {exc}", file=filename) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise RecipeError(f"cannot read recipe: {reason}", file=filename) from None
    if len(data) > RECIPE_SIZE_LIMIT:
        raise RecipeError(f"recipe is larger than {RECIPE_SIZE_LIMIT >> 20} MiB",
                          file=filename)
    return absolute, data
