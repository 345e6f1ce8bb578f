"""The files behind a manifest's active entries: one rule for every command that asks.

Resolution's last phase, ``weightstore check``, device bundles and pulled variants all ask
the same question once liveness is decided: does every live payload's file exist and hold
its byte range (and, when asked, its bytes match their checksum)? Only active entries
count, and only after liveness: a missing file that nothing live uses is irrelevant.

What differs between callers is what they do with a problem, not the rule: a load stops
at the first one (``strict``), ``check`` collects them all to report.

In a package folder, a file is a package file only as a regular file reached through no
symbolic link (``weightstore verify``'s rule): anything else counts as absent, and the
bytes come from the store by digest as for a file the package lacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import ExternalDataError, IntegrityError
from ..io.digests import ALGORITHMS, digest_file
from .manifest import ACTIVE, STORE_ONLY, ManifestEntry


def folder_file(folder: Path, name: str, *, where: str, package: bool = False,
                ) -> Path | None:
    """External-data location ``name`` in ``folder``, resolved (never leaving it); None
    when it is not a regular file. ``package``: the folder is a package, whose files are
    regular files of their own: one reached through a symbolic link counts as absent."""
    path = resolve_location(folder, name, where=where)
    if package and path != folder.resolve() / name:
        return None  # a link somewhere on the way: no package file
    return path if path.is_file() else None


def refused_package_file(folder: Path, name: str) -> bool:
    """Is there something at ``name`` (a location :func:`folder_file` accepted) in
    package ``folder`` that is no package file (a symbolic link, a FIFO, a folder), as
    opposed to nothing at all?"""
    try:
        os.lstat(folder / name)
    except (OSError, ValueError):
        return False
    return folder_file(folder, name, where=name, package=True) is None


def file_problems(folder: Path | None, entries: Sequence[ManifestEntry], scenario: str | None, *,
                  strict: bool, verify: bool = False, model_file: Path | None = None,
                  model: str | None = None, store: Any = None,
                  progress: Callable[[int], None] | None = None,
                  package: bool = False) -> list[str]:
    """Problems with the files holding the active ``entries``' payloads (empty when all
    is well); with ``strict`` the first one raises instead. ``folder`` None: there is no
    folder (a build opened from the store), every external weight is the store's.

    Sizes and ranges are checked (no byte read); with ``verify`` the bytes are re-hashed
    against their checksums too (``progress`` is told each entry's length). A payload
    inline in the model (no file) is checked against ``model_file`` when given. A file
    missing from ``folder`` whose bytes ``store`` (a locator) holds by key is fine: a load
    reads them from there; when it does not, the error names the store searched. Errors
    name the scenario, the initializer and the location (and ``model`` when given).
    ``package``: ``folder`` is a package folder, whose files must be regular files.
    """
    problems: list[str] = []
    files: dict[str, tuple[Path, int | None]] = {}  # each file located and sized once
    located: dict[str, Any] | None = None  # the store's answer for the keys of such files
    for e in entries:
        s = e.source
        if e.status != ACTIVE or e.origin in STORE_ONLY:
            continue  # prepared objects were located in the store when they were bound
        if not s.file and model_file is None:
            continue  # inline in the model file, which was just read
        context = {"scenario": scenario or "(default)", "initializer": e.values[0],
                   "location": s.file or (model_file.name if model_file else "")}
        if model is not None:
            context = {"model": model, **context}
        try:
            if s.file not in files:
                path = (model_file if not s.file else None if folder is None
                        else folder_file(folder, s.file, where=e.values[0], package=package))
                files[s.file] = (path or Path(s.file),
                                 path.stat().st_size if path and path.is_file() else None)
            path, size = files[s.file]
            if size is None and store is not None and s.store_key:
                if located is None:  # one batched lookup for every entry that may need it
                    located = store.locate({x.source.store_key for x in entries
                                            if x.source.file and x.source.store_key})
                if s.store_key in located:
                    continue
            if size is None:
                problem = "live weight's file is missing or unreadable"
                if package and folder is not None and s.file and refused_package_file(
                        folder, s.file):
                    problem = ("live weight's file is not a regular file (a package holds "
                               "only regular files and folders, never a symbolic link)")
                if store is not None and s.store_key:
                    raise ExternalDataError(
                        f"{problem}, and the store does not hold its bytes", **context,
                        store=str(getattr(store, "root", store)),
                        hint="give the store that built the package (--store)")
                raise ExternalDataError(problem, **context)
            if s.offset > size:
                raise ExternalDataError("live weight's offset lies past the end of its file",
                                        offset=s.offset, file_size=size, **context)
            if s.offset + s.length > size:
                raise ExternalDataError("live weight's byte range lies outside its file",
                                        offset=s.offset, length=s.length, file_size=size,
                                        **context)
            if verify and s.file:  # inline bytes were read with the model itself
                algo, _, expected = (s.checksum or "").partition(":")
                if algo not in ALGORITHMS:
                    raise IntegrityError("live weight has no checksum this tool can verify",
                                         checksum=s.checksum, **context)
                if digest_file(algo, path, s.offset, s.length) != expected:
                    raise IntegrityError("live weight's bytes do not match their checksum",
                                         checksum=s.checksum, **context)
                if progress is not None:
                    progress(s.length)
        except (ExternalDataError, IntegrityError) as exc:
            if strict:
                raise
            problems.append(str(exc))
    return problems
