"""The report's data: one JSON-serializable dict, exactly what ``report --json`` prints.

``{"format_version": 1, "generator": "weightstore X.Y.Z", "target": {"kind", "name"},
"views": {NAME: view data}}`` (docs/reference/formats/report-data.md). A release archive
is read as ``unpack`` reads it (:func:`weightstore.packaging.unpack.unpack`: every member
checked and verified against the summary) into a temp folder that is removed afterwards;
the data names the target by its file name only, never by a path, so the same inputs give
the same bytes wherever they lie.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import PackageError, ReportError
from .request import ReportRequest
from .views import VIEWS

FORMAT_VERSION = 1


def collect_report(target: str | os.PathLike[str] | None, *,
                   against: str | os.PathLike[str] | None = None,
                   store: str | os.PathLike[str] | None = None,
                   named: tuple[str, str] | None = None) -> dict[str, Any]:
    """Every view that applies to the request, collected. ``named``: the target's
    ``(kind, name)`` in the data, where the caller knows it better (``release`` reports
    the archive it just made from the folder it made it of)."""
    from ..version import __version__

    given = {"against": against, "store": store}
    for option, value in given.items():
        if value is not None and not any(option in v.answers for v in VIEWS):
            raise ReportError(f"--{option} is not supported by this version's report "
                              "views", **{option: str(value)})
    request = ReportRequest(target=None if target is None else Path(target),
                            against=None if against is None else Path(against),
                            store=None if store is None else Path(store))
    with _package_folder(request.target, request.store) as (kind, folder):
        request = replace(request, folder=folder)
        views = {}
        for view in VIEWS:
            collected = view.collect(request)
            if collected is not None:
                views[view.name] = collected
    if not views:
        raise ReportError("nothing to report: no view applies to the target",
                          target=str(request.target or request.store))
    name = request.target.name if request.target is not None else (
        request.store.name if request.store is not None else "")
    if named is not None:
        kind, name = named
    return {"format_version": FORMAT_VERSION, "generator": f"weightstore {__version__}",
            "target": {"kind": kind, "name": name}, "views": views}


@contextlib.contextmanager
def _package_folder(target: Path | None,
                    store: Path | None) -> Iterator[tuple[str, Path | None]]:
    """``(kind, folder)``: the target as a package folder (an archive unpacked and
    verified, or a store reference's build assembled from the store, into a temp folder
    removed afterwards)."""
    if target is None:
        yield "store", None
        return
    if target.is_dir():
        yield "package", target
        return
    if not target.exists():
        if store is not None and not target.is_absolute():
            with _referenced_build(str(target), store) as folder:
                yield "store reference", folder
            return
        raise PackageError("no such package folder or archive", path=str(target))
    from ..packaging.unpack import unpack

    with tempfile.TemporaryDirectory(prefix="weightstore-report-") as tmp:
        folder = Path(tmp) / "package"
        unpack(target, folder)
        yield "archive", folder


@contextlib.contextmanager
def _referenced_build(text: str, store: Path) -> Iterator[Path]:
    """The build a store reference names (:func:`weightstore.resolve.reference.find_build`:
    one build, its action record's MAC and its summary checked), assembled from the store
    by that record into a temp folder: every piece re-hashed against its key, as a warm
    build materializes it, but registered nowhere."""
    from ..package.assembly import assemble
    from ..resolve.reference import StoreReference, find_build
    from ..store import WeightStore

    build = find_build(store, StoreReference.parse(text))
    weights = WeightStore(store)
    with tempfile.TemporaryDirectory(prefix="weightstore-report-") as tmp, weights.leased():
        folder = Path(tmp) / "package"
        folder.mkdir()
        assemble(weights, folder, build.files)
        yield folder


def render_json(data: dict[str, Any]) -> str:
    """The data as ``--json`` prints it: sorted keys, two-space indent, one final newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
