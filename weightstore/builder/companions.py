"""A recipe's companion files (``files:``, and each device's), listed from disk: each
file's path in the package or the device's runtime folder, its kind and the source file
holding its bytes (a pinned source's, once fetched as a model's is: :mod:`.sources`).

A folder source gives every regular file below it, in sorted path order, hidden names
(``.git``, ``.cache``) left out; a link or other special file inside it is refused, so a
package never ships what a link points at. Every path is checked again here (the recipe
could check only the names it spells), against the package's own names, the models'
files and the other companions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RecipeError
from ..package.summary import CompanionEntry
from ..recipe.companions import (
    colliding,
    default_kind,
    path_problem,
    source_files,
)

if TYPE_CHECKING:
    from ..package.fingerprint import FileDigests
    from ..recipe.schema import CompanionFile, LoadedRecipe, PinnedSource


@dataclass(frozen=True)
class Companion:
    """One companion file of the packages: where it goes (``path`` in the runtime folder:
    the package's, or ``device``'s), what it is, where it comes from (``file``; None for
    a ``pin`` not fetched yet); once hashed (:func:`hashed`), its size and digest."""

    path: str
    kind: str
    file: Path | None
    device: str | None = None
    pin: PinnedSource | None = None
    key: str = ""  # its recipe entry, for messages: files[0], devices[1].files[0]
    size: int = 0
    digest: str = ""

    def entry(self) -> CompanionEntry:
        return CompanionEntry(self.path, self.size, self.digest, self.kind)


def companion_files(loaded: LoadedRecipe) -> list[Companion]:
    """Every companion file of ``loaded``'s packages: the top-level ones sorted by path,
    then each device's own, in recipe order; a source that is missing, a link or special
    file in a folder, or a path that collides is a :class:`RecipeError` naming the recipe
    entry. A pinned source is not fetched here (:func:`fetched`)."""
    from ..recipe.schema import model_file_name

    recipe = loaded.recipe
    models = [model_file_name(m) for m in recipe.models]
    out = _entries(loaded, recipe.files, "files", None, models)
    top = [c.path for c in out]
    for i, device in enumerate(recipe.devices):
        own = _entries(loaded, device.files, f"devices[{i}].files", device.name, models)
        # the same path replaces; one a folder of the other cannot be (one pass)
        replaced = {c.path for c in own}
        hit = colliding((c.path for c in own), [p for p in top if p not in replaced])
        if hit is not None:
            c = own[hit[0]]
            raise RecipeError(f"companion path '{c.path}' collides with '{hit[1]}' in "
                              "the device's folder", file=str(loaded.path), key=c.key)
        out += own
    return out


def _entries(loaded: LoadedRecipe, entries: Sequence[CompanionFile], at: str,
             device: str | None, models: list[str]) -> list[Companion]:
    from ..recipe.schema import companion_path

    where = str(loaded.path)
    out: list[Companion] = []
    for i, entry in enumerate(entries):
        key = f"{at}[{i}]"
        base = companion_path(entry)
        if isinstance(entry.source, str):
            listed = _listed(loaded.resolve(entry.source), entry, where, key)
        else:
            listed = [("", None)]
        for rel, file in listed:
            path = rel if base == "." else f"{base}/{rel}" if rel else base
            problem = path_problem(path)
            if problem is not None:
                raise RecipeError(f"{problem}, got {path!r}", file=where, key=key)
            out.append(Companion(path, entry.kind or default_kind(path), file, device,
                                 None if isinstance(entry.source, str) else entry.source,
                                 key))
    # each path against the models' files and every earlier one, in one pass (a folder
    # source may give thousands)
    hit = colliding((c.path for c in out), models)
    if hit is not None:
        c = out[hit[0]]
        raise RecipeError(f"companion path '{c.path}' collides with '{hit[1]}' in the "
                          "package", file=where, key=c.key)
    return sorted(out, key=lambda c: c.path)


def device_sets(companions: Sequence[Companion],
                devices: Iterable[str]) -> dict[str, list[Companion]]:
    """Each device's complete set, sorted by path: the top-level companions, a device's
    own replacing the one at its path."""
    top = {c.path: c for c in companions if c.device is None}
    out = {}
    for name in devices:
        merged = {**top, **{c.path: c for c in companions if c.device == name}}
        out[name] = [merged[p] for p in sorted(merged)]
    return out


def _listed(source: Path, entry: CompanionFile, where: str,
            key: str) -> list[tuple[str, Path | None]]:
    """``(path below the source, file)`` of each file the entry gives: ``("", source)``
    for a file (:func:`~weightstore.recipe.companions.source_files`), its errors naming
    the recipe entry."""
    try:
        found: list[tuple[str, Path | None]] = list(source_files(source))
    except RecipeError as exc:
        raise RecipeError(exc.message, file=where, key=f"{key}.source",
                          **exc.context) from None
    if found == [("", source)] and entry.path == ".":
        raise RecipeError("path '.' (the package root) is for a folder source; give the "
                          "file a name", file=where, key=f"{key}.path")
    return found


def hashed(companions: Iterable[Companion], digests: FileDigests, algo: str,
           ) -> list[Companion]:
    """Each companion with its size and the ``algo`` digest of its bytes (the stat cache
    serves an unchanged file without reading it); a pinned one not fetched yet is left
    as it is."""
    out = []
    for c in companions:
        if c.file is None:
            out.append(c)
            continue
        try:
            size = c.file.stat().st_size
            digest = digests.of(c.file, algo)
        except OSError as exc:
            raise RecipeError(f"companion file cannot be read: {exc.strerror or exc}",
                              path=str(c.file)) from None
        out.append(replace(c, size=size, digest=digest))
    return out


def fetched(companions: Iterable[Companion], store_root: Path, digests: FileDigests,
            algo: str) -> list[Companion]:
    """The companions with every pinned source fetched (once, into the store's
    ``sources/``, as a model's: :mod:`.sources`) and hashed."""
    from .sources import pinned_file

    out = [c if c.pin is None or c.file is not None else
           replace(c, file=pinned_file(c.key, c.pin, store_root, digests, what="file"))
           for c in companions]
    return hashed(out, digests, algo)


def identities(companions: Iterable[Companion]) -> list[dict[str, Any]]:
    """What the companions contribute to a package's fingerprint: path, kind, digest (a
    pinned source's: the digest it is pinned by, and its path in a pinned artifact, so
    that deciding a build fetches nothing), and the device of a device's own."""
    out = []
    for c in companions:
        identity: dict[str, Any] = {"path": c.path, "kind": c.kind, "digest": c.digest}
        if c.pin is not None:
            identity["digest"] = c.pin.digest
            if c.pin.ref is not None:
                identity["pinned"] = {"ref": c.pin.ref, "path": c.pin.path}
        if c.device is not None:
            identity["device"] = c.device
        out.append(identity)
    return out
