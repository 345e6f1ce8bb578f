"""A package rebuilt from the store by its action record, instead of converting.

The warm build: the store already holds every payload of a package, and the action
record (:mod:`weightstore.caches.build_actions`) of its fingerprint says which objects
make which file. Materializing copies them into a temp folder beside the package
(:func:`~weightstore.package.assembly.assemble`: every byte re-hashed against its store
key), checks that the assembled ``summary.json`` is of that fingerprint and lists exactly
the files assembled, and publishes the folder by the package writer's rules (its lock, an
atomic rename, its root registered). It needs neither onnx, numpy nor pydantic, and
reads no source byte.

Anything that does not hold (no record, a record failing its MAC, an object missing or
damaged in the store, a file disagreeing with the summary, a folder that appeared
meanwhile) gives None: the caller then builds for real.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..caches import build_actions
from ..errors import IntegrityError, PackageError, StoreError
from ..io.files import discard_temp_dir, make_temp_dir, parse_json, publish_dir, read_regular
from ..package.assembly import MissingPayloadError, assemble, contents_problem, summary_weight_files
from ..package.summary import SUMMARY_NAME

if TYPE_CHECKING:
    from ..store import WeightStore


@dataclass(frozen=True)
class Materialized:
    summary: dict[str, Any]
    reused_objects: int  # distinct weight payloads copied from the store
    reused_bytes: int


def materialize(store_root: Path, target: Path, fingerprint: str, *,
                jobs: int = 4) -> Materialized | None:
    """Publish the package of ``fingerprint`` at ``target`` (which must not exist) from
    the store; None when there is no sound record or the store cannot serve it."""
    record = build_actions.load(store_root, fingerprint)
    if record is None:
        return None
    from ..io.locks import target_lock
    from ..store import WeightStore
    from ..store.index import INDEX_NAME

    if not (store_root / INDEX_NAME).is_file():
        return None
    store = WeightStore(store_root)
    # No lease: every byte copied is checked against its key, so an object that gc
    # takes meanwhile costs a real build, never a wrong package.
    with target_lock(target, store.root):
        if target.exists():  # published meanwhile: the full check decides about it
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp: Path | None = make_temp_dir(target.parent, f".{target.name}.")
        try:
            try:
                assemble(store, tmp, record.files, jobs=jobs)
            except (MissingPayloadError, IntegrityError, StoreError, OSError):
                return None  # a real build writes the package (and heals the store)
            summary = _agreeing_summary(tmp, record)
            if summary is None:
                return None
            publish_dir(tmp, target)
            tmp = None
        finally:
            discard_temp_dir(tmp)
        if not _registered(store, target, record.fingerprint):
            register_root(store, target, summary)
    weights = {p.key: p.size for f in summary_weight_files(summary) for p in f.pieces}
    return Materialized(summary, len(weights), sum(weights.values()))



def can_materialize(store_root: Path, target: Path, fingerprint: str) -> bool:
    """Would :func:`materialize` publish ``target`` (``build --dry-run``)? A sound record
    and every payload it names indexed in the store; nothing is read or written, so an
    object damaged on disk still turns the real build into a conversion."""
    from ..store import WeightStore
    from ..store.index import INDEX_NAME

    if target.exists() or not (store_root / INDEX_NAME).is_file():
        return False
    record = build_actions.load(store_root, fingerprint)
    if record is None:
        return False
    keys = {p.key for f in record.files for p in f.pieces}
    return keys <= WeightStore(store_root).locate(keys).keys()

def _agreeing_summary(folder: Path, record: build_actions.ActionRecord,
                      ) -> dict[str, Any] | None:
    """The materialized summary when it is of the record's fingerprint and lists exactly
    the files assembled, with their sizes, and the other files' digests as the keys they
    were assembled from (weight files: their payloads were checked piece by piece, and
    the bytes between are zeros by construction)."""
    try:
        summary = parse_json(read_regular(folder / SUMMARY_NAME))
        if summary["fingerprint"] != record.fingerprint:
            return None
        placed = {f.name for f in summary_weight_files(summary)}
        files = [f for f in record.files if f.name != SUMMARY_NAME]
        problem = contents_problem(
            summary, {f.name: f for f in files if f.name in placed},
            {f.name: (f.size, f.pieces[0].key) for f in files if f.name not in placed})
    except (OSError, ValueError, TypeError, KeyError, PackageError):
        return None
    return summary if problem is None else None


def _registered(store: WeightStore, target: Path, fingerprint: str) -> bool:
    """Does the store already have this folder's root at this fingerprint (the folder was
    removed and is materialized back)? Then it names these very keys: no write needed."""
    from ..store.roots import is_registered

    with store.index.reading() as conn:
        return is_registered(conn, str(target.absolute()), fingerprint)


def register_root(store: WeightStore, target: Path, summary: Mapping[str, Any],
                  extra: Iterable[str] = ()) -> None:
    """Record in the store that ``target`` holds this package and which keys it uses: its
    weights, and the objects of its other files (model files, ``summary.json``), which
    its action record names, and its companion files; ``extra``: more keys it keeps
    alive (prepared weights)."""
    companions = {str(c["digest"]) for c in summary.get("companions", [])}
    if summary["layout"]["external_weight"] == "embedded" and not extra and not companions:
        return  # nothing of the store is in it
    from ..store import RootRecord

    keys = {w["id"] for m in summary["models"] for w in m["external_weights"]}
    keys |= set(extra) | companions
    try:
        data = read_regular(target / SUMMARY_NAME)
        keys |= {f.pieces[0].key for f in build_actions.whole_files(summary, data)}
    except (OSError, ValueError, TypeError, KeyError):
        pass  # the weights alone, as for a package without an action record
    store.register_root(RootRecord(package=summary["package"], version=summary["version"],
                                   layout=summary["layout"]["name"],
                                   folder=str(target.absolute()),
                                   fingerprint=summary["fingerprint"]),
                        sorted(keys))
