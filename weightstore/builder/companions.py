"""A recipe's companion files (``files:``), listed from disk: each file's path in the
package, its kind and the source file holding its bytes.

A folder source gives every regular file below it, in sorted path order, hidden names
(``.git``, ``.cache``) left out; a link or other special file inside it is refused, so a
package never ships what a link points at. Every path is checked again here (the recipe
could check only the names it spells), against the package's own names, the models'
files and the other companions.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RecipeError
from ..package.summary import CompanionEntry
from ..recipe.companions import collision, default_kind, path_problem

if TYPE_CHECKING:
    from ..package.fingerprint import FileDigests
    from ..recipe.schema import CompanionFile, LoadedRecipe


@dataclass(frozen=True)
class Companion:
    """One companion file of the packages: where it goes, what it is, where it comes from;
    once hashed (:func:`hashed`), its size and digest."""

    path: str
    kind: str
    file: Path
    size: int = 0
    digest: str = ""

    def entry(self) -> CompanionEntry:
        return CompanionEntry(self.path, self.size, self.digest, self.kind)


def companion_files(loaded: LoadedRecipe) -> list[Companion]:
    """Every companion file of ``loaded``'s packages, sorted by path; a source that is
    missing, a link or special file in a folder, or a path that collides is a
    :class:`RecipeError` naming the recipe entry."""
    from ..recipe.schema import companion_path, model_file_name

    recipe = loaded.recipe
    where = str(loaded.path)
    models = [model_file_name(m) for m in recipe.models]
    out: list[Companion] = []
    for i, entry in enumerate(recipe.files):
        key = f"files[{i}]"
        source = loaded.resolve(entry.source)
        base = companion_path(entry)
        for rel, file in _listed(source, entry, where, key):
            path = rel if base == "." else f"{base}/{rel}" if rel else base
            problem = path_problem(path)
            if problem is not None:
                raise RecipeError(f"{problem}, got {path!r}", file=where, key=key)
            kind = entry.kind or default_kind(path)
            other = collision(path, [*models, *(c.path for c in out)])
            if other is not None:
                raise RecipeError(f"companion path '{path}' collides with '{other}' in the "
                                  "package", file=where, key=key)
            out.append(Companion(path, kind, file))
    return sorted(out, key=lambda c: c.path)


def _listed(source: Path, entry: CompanionFile, where: str,
            key: str) -> list[tuple[str, Path]]:
    """``(path below the source, file)`` of each file the entry gives: ``("", source)``
    for a file."""
    try:
        st = os.stat(source)
    except OSError as exc:
        raise RecipeError(f"companion source cannot be read: {exc.strerror or exc}",
                          file=where, key=f"{key}.source", path=str(source)) from None
    if stat.S_ISREG(st.st_mode):
        if entry.path == ".":
            raise RecipeError("path '.' (the package root) is for a folder source; give "
                              "the file a name", file=where, key=f"{key}.path")
        return [("", source)]
    if not stat.S_ISDIR(st.st_mode):
        raise RecipeError("companion source is neither a file nor a folder", file=where,
                          key=f"{key}.source", path=str(source))
    found: list[tuple[str, Path]] = []
    try:
        for root, dirs, files in os.walk(source, onerror=_raise):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in [*dirs, *(f for f in files if not f.startswith("."))]:
                path = Path(root) / name
                mode = os.lstat(path).st_mode
                if name in dirs and stat.S_ISDIR(mode):
                    continue
                rel = path.relative_to(source).as_posix()
                if not stat.S_ISREG(mode):
                    raise RecipeError("a companion folder holds only regular files and "
                                      "folders; this is a link or a special file",
                                      file=where, key=f"{key}.source", path=rel)
                found.append((rel, path))
    except OSError as exc:
        raise RecipeError(f"companion folder cannot be read: {exc.strerror or exc}",
                          file=where, key=f"{key}.source",
                          path=str(exc.filename or source)) from None
    if not found:
        raise RecipeError("companion folder holds no file", file=where,
                          key=f"{key}.source", path=str(source))
    return sorted(found)


def _raise(exc: OSError) -> None:
    raise exc


def hashed(companions: Iterable[Companion], digests: FileDigests, algo: str,
           ) -> list[Companion]:
    """Each companion with its size and the ``algo`` digest of its bytes (the stat cache
    serves an unchanged file without reading it)."""
    out = []
    for c in companions:
        try:
            size = c.file.stat().st_size
            digest = digests.of(c.file, algo)
        except OSError as exc:
            raise RecipeError(f"companion file cannot be read: {exc.strerror or exc}",
                              path=str(c.file)) from None
        out.append(replace(c, size=size, digest=digest))
    return out


def identities(companions: Iterable[Companion]) -> list[dict[str, Any]]:
    """What the companions contribute to a package's fingerprint: path, kind, digest."""
    return [{"path": c.path, "kind": c.kind, "digest": c.digest} for c in companions]
