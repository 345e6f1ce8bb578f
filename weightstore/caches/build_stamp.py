"""Build stamps: the up-to-date check of an unchanged recipe, without parsing it.

Deciding that a package is up to date needs the recipe's fingerprint inputs, and parsing
and validating the recipe (yaml, pydantic) costs several times what the check itself
does. A stamp records, for one invocation of ``weightstore build`` (recipe file, model and
layout selection, store choice), what the last successful build decided from::

    <user cache folder>/build-stamps/<digest of the invocation>.json
        {"format_version", "generator", "invocation", "recipe", "recipe_digest", "store",
         "sources": {model file: {"digest", "external": {location: digest}}},
         "companions": {companion source: {path below it: digest}},
         "packages": [{"layout", "path", "fingerprint"}],
         "mac"}                                       keyed blake3 over all the rest

While the recipe's bytes, the weightstore version and every source's content digest
(served by :class:`~weightstore.package.fingerprint.FileDigests`, whose stat cache makes this
cheap) are unchanged, the recipe gives the recorded fingerprints: each package is then up
to date exactly when its ``summary.json`` carries that fingerprint and its files are
intact, the test the full check ends with. Anything else (no stamp, a failed MAC, a
stamp of another invocation copied under this one's name, a changed input, a damaged
package) falls through to the full check, which parses the recipe. A stamp is only ever a
shortcut to the answer the full check would give.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import ExternalDataError, IntegrityError, RecipeError
from ..io.digests import digest_bytes, make_key
from ..io.files import atomic_write_bytes, parse_json, read_record_bytes
from ..package.fingerprint import FINGERPRINT_ALGO, FileDigests
from ..store.location import user_cache_dir
from ..store.mac import entry_mac, verify_mac
from ..version import __version__

# 3: the companion files' sources (``companions``); 4: written only by a build whose
# embedded layouts' packages list their devices (a stamp of before proves one without)
FORMAT_VERSION = 4
FOLDER = "build-stamps"


@dataclass(frozen=True)
class Invocation:
    """One way of calling ``weightstore build`` with a recipe file: the file, the
    ``--model`` and ``--layout`` selection, the store chosen without the recipe. Each has
    a stamp of its own, and the stamp names its invocation inside what the MAC covers,
    so a stamp of another selection copied under this one's name proves nothing."""

    recipe: Path
    models: tuple[str, ...]
    layouts: tuple[str, ...]
    store: Path

    def key(self) -> list[Any]:
        return [str(self.recipe), sorted(self.models), sorted(self.layouts), str(self.store)]

    def path(self) -> Path:
        """Where this invocation's stamp lives."""
        name = digest_bytes(FINGERPRINT_ALGO, json.dumps(self.key()).encode())[:32]
        return user_cache_dir() / FOLDER / f"{name}.json"


def recipe_digest(data: bytes) -> str:
    return make_key(FINGERPRINT_ALGO, digest_bytes(FINGERPRINT_ALGO, data))


def load(invocation: Invocation, data: bytes) -> dict[str, Any] | None:
    """The stamp of ``invocation`` when it is sound (well formed, its MAC holds) and
    describes this very invocation, these recipe bytes and this weightstore version; None
    otherwise."""
    try:
        doc = parse_json(read_record_bytes(invocation.path()))
        mac = doc.pop("mac")
        if doc.get("format_version") != FORMAT_VERSION or not verify_mac(doc, mac):
            return None
        if (doc["generator"] != __version__ or doc["invocation"] != invocation.key()
                or doc["recipe"] != str(invocation.recipe)
                or doc["recipe_digest"] != recipe_digest(data)):
            return None
        Path(doc["store"])
        for source in doc["sources"].values():
            if not (isinstance(source["digest"], str) and isinstance(source["external"], dict)):
                return None
        for files in doc["companions"].values():
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
                return None
        for p in doc["packages"]:
            if not all(isinstance(p[k], str) for k in ("layout", "path", "fingerprint")):
                return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return doc


def sources_unchanged(doc: Mapping[str, Any], digests: FileDigests) -> bool:
    """Does every source model, and every external data file it names, still have the
    content digest the stamp records? Locations are resolved again, as a build would."""
    try:
        for model, source in doc["sources"].items():
            path = Path(model)
            if digests.of(path) != source["digest"]:
                return False
            for location, digest in source["external"].items():
                if digests.of(resolve_location(path.parent, location, where=model)) != digest:
                    return False
    except (OSError, ExternalDataError, IntegrityError, TypeError):
        return False  # one that cannot be hashed now: the build reports why
    return _companions_unchanged(doc, digests)


def _companions_unchanged(doc: Mapping[str, Any], digests: FileDigests) -> bool:
    """Does every companion source still give the very files the stamp records (a file
    added to a folder, or removed, is a change), each with its content digest?"""
    from ..recipe.companions import source_files

    try:
        for source, files in doc["companions"].items():
            listed = source_files(Path(source))
            if [rel for rel, _ in listed] != sorted(files):
                return False
            if any(digests.of(path, files[rel].partition(":")[0]) != files[rel]
                   for rel, path in listed):
                return False
    except (OSError, RecipeError, TypeError):
        return False
    return True


def record(invocation: Invocation, data: bytes, store: Path,
           sources: Mapping[str, Mapping[str, Any]],
           packages: Sequence[tuple[str, Path, str]],
           companions: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Write the stamp of a successful build (best effort: it is only a shortcut).

    ``sources``: model file -> ``{"digest", "external": {location: digest}}``;
    ``packages``: ``(layout, folder, fingerprint)`` each; ``companions``: each local
    companion source -> ``{path below it ("" for a file): digest}``.
    """
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "generator": __version__,
        "invocation": invocation.key(), "recipe": str(invocation.recipe),
        "recipe_digest": recipe_digest(data), "store": str(store),
        "sources": {k: {"digest": v["digest"], "external": dict(v["external"])}
                    for k, v in sorted(sources.items())},
        "companions": {k: dict(v) for k, v in sorted((companions or {}).items())},
        "packages": [{"layout": name, "path": str(folder), "fingerprint": fp}
                     for name, folder, fp in packages],
    }
    mac = entry_mac(doc)
    if mac is None:  # no private key: nothing would be trusted, so write nothing
        return
    path = invocation.path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({**doc, "mac": mac}, sort_keys=True).encode())
