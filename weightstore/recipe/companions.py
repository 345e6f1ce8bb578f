"""Companion files: what a package ships beside its models (configs, tokenizers, licences,
model cards), so that its folder is the runtime folder a runtime opens as it is.

The vocabulary every layer shares, without yaml or pydantic: the kinds (as the CNCF
ModelPack spec names its layers), the kind a file name gets by default, the one rule of a
companion's path in a package, which the recipe, the build and every reader of a summary
apply, and the files a local source gives (:func:`source_files`, which the build and its
stamp both list them by).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..errors import RecipeError
from ..io.files import is_relative_inside

KINDS = ("config", "doc", "code", "dataset", "weights")
COMPANIONS_SINCE = 5  # the package format whose summary lists ``companions``

# names a package keeps for itself: its summary, a device folder's record (at the root of
# the runtime folder ``bundle`` makes), its device folders, the files a registry gives each
# payload, the prepared graphs ``weightstore prepare`` writes beside a package
RESERVED_NAMES = ("summary.json", "bundle.json")
RESERVED_FOLDERS = ("devices", "payloads", "prepared")
_SEPARATE = re.compile(r"weight_[0-9a-f]{64}")  # a separate layout's weight file
_COMBINED_SUFFIX = "_weight_combined"

_DOC_PREFIXES = ("license", "licence", "copying", "notice", "readme")
_DOC_SUFFIXES = (".md", ".rst", ".txt")
_CODE_SUFFIXES = (".py", ".sh")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".data")
# text files that hold what a model reads (vocabularies, merges, labels): configuration
_CONFIG_TEXT = ("vocab.txt", "merges.txt", "added_tokens.txt")


def default_kind(path: str) -> str:
    """The kind of a companion at ``path`` when its recipe entry names none: licences,
    notices, read-mes and documents (``*.md``, ``*.rst``, ``*.txt``) are ``doc``, scripts
    ``code``, weight files ``weights``, everything else (``config.json``,
    ``tokenizer.json``, ``genai_config.json``, chat templates, vocabularies) ``config``."""
    name = PurePosixPath(path).name.lower()
    if name.startswith(_DOC_PREFIXES):
        return "doc"
    if name in _CONFIG_TEXT:
        return "config"
    if name.endswith(_DOC_SUFFIXES):
        return "doc"
    if name.endswith(_CODE_SUFFIXES):
        return "code"
    if name.endswith(_WEIGHT_SUFFIXES):
        return "weights"
    return "config"


def path_problem(path: object) -> str | None:
    """Why ``path`` cannot be a companion's path in a package, None when it can: a
    relative '/'-separated path, normalised (no ``.``, ``..`` or empty component), no
    backslash or NUL, no hidden component (temp files and locks are hidden), and none of
    the names a package keeps for itself (``summary.json``, ``bundle.json``,
    ``devices/``, ``payloads/``, ``prepared/``: neither as a file nor as a folder) or
    gives its weight files (``weight_<hex>``, ``*_weight_combined``), in any case."""
    if not is_relative_inside(path, hidden=False):
        return _outside(path)
    parts = path.split("/")
    # case-folded: on the case-insensitive file systems of macOS and Windows,
    # ``Summary.json`` is ``summary.json``
    first, last = parts[0].casefold(), parts[-1].casefold()
    if first in RESERVED_NAMES or first in RESERVED_FOLDERS:
        return f"'{parts[0]}' is a name the package keeps for itself"
    if _SEPARATE.fullmatch(last) or first.endswith(_COMBINED_SUFFIX):
        return "a companion path may not take a weight file's name"
    return None


def _outside(path: object) -> str:
    """Which rule of :func:`.io.files.is_relative_inside` (hidden parts refused) ``path``
    breaks, in words."""
    if not isinstance(path, str) or not path:
        return "a companion path is a non-empty relative path"
    if path.startswith("/"):
        return "a companion path is relative to the package folder, not absolute"
    if "\\" in path or "\x00" in path:
        return "a companion path uses '/' between its parts and holds no NUL"
    if any(p in ("", ".", "..") for p in path.split("/")):
        return "a companion path is normalised: no empty, '.' or '..' part"
    return "a companion path has no hidden part (a name starting with '.')"


def collision(path: str, taken: Iterable[str]) -> str | None:
    """The first of ``taken`` (package paths) that ``path`` collides with: the same path,
    or one of them a folder of the other, compared case-folded (``LICENSE`` and
    ``license`` are one file on the case-insensitive file systems of macOS and
    Windows)."""
    folded = path.casefold()
    for other in taken:
        mine = other.casefold()
        if folded == mine or folded.startswith(mine + "/") or mine.startswith(folded + "/"):
            return other
    return None


def colliding(paths: Iterable[str], taken: Iterable[str] = ()) -> tuple[int, str] | None:
    """The index of the first of ``paths`` that collides (as :func:`collision` tells) with
    one of ``taken`` or an earlier one of ``paths``, and that one; None when none does.
    ``taken`` are not judged among themselves. In time linear in the paths' parts (a
    summary may list thousands, a folder source give them)."""
    files: dict[str, str] = {}  # case-folded path -> path
    folders: dict[str, str] = {}  # case-folded folder -> a path below it

    def add(path: str) -> None:
        folded = path.casefold()
        files[folded] = path
        parts = folded.split("/")
        for f in range(1, len(parts)):
            folders.setdefault("/".join(parts[:f]), path)

    for path in taken:
        add(path)
    for i, path in enumerate(paths):
        folded = path.casefold()
        parts = folded.split("/")
        above = ("/".join(parts[:n]) for n in range(1, len(parts)))
        other = files.get(folded) or folders.get(folded) or next(
            (files[f] for f in above if f in files), None)
        if other is not None:
            return i, other
        add(path)
    return None


def source_files(source: Path) -> list[tuple[str, Path]]:
    """``(path below the source, file)`` of each file a local source gives, sorted:
    ``[("", source)]`` for a file (followed if it is a link, as a model source is); for a
    folder, every regular file below it, hidden names (``.git``, ``.cache``) left out. A
    link or other special file inside a folder, an empty folder, or a source that cannot
    be read is a :class:`RecipeError` (``path`` in its context; the caller adds the
    recipe entry)."""
    try:
        st = os.stat(source)
    except OSError as exc:
        raise RecipeError(f"companion source cannot be read: {exc.strerror or exc}",
                          path=str(source)) from None
    if stat.S_ISREG(st.st_mode):
        return [("", source)]
    if not stat.S_ISDIR(st.st_mode):
        raise RecipeError("companion source is neither a file nor a folder",
                          path=str(source))
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
                                      "folders; this is a link or a special file", path=rel)
                found.append((rel, path))
    except OSError as exc:
        raise RecipeError(f"companion folder cannot be read: {exc.strerror or exc}",
                          path=str(exc.filename or source)) from None
    if not found:
        raise RecipeError("companion folder holds no file", path=str(source))
    return sorted(found)


def _raise(exc: OSError) -> None:
    raise exc
