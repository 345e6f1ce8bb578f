"""Assembling package files from the store: which payload sits at which offset of a file.

A package's weight files are nothing but store payloads at known offsets with zero bytes
between them, so a package can be rebuilt byte for byte from the store and a description
of its files: a registry pull does it from the artifact's assembly record, a warm build
from its action record (:mod:`weightstore.caches.build_actions`). A file that is one
object from offset 0 to its end (a model file, ``summary.json``, a ``weight_<hex>`` file)
is the special case of one piece.

Assembly goes through the package writer (:func:`weightstore.layout.writer.write_plan`):
kernel copies out of the store, then one read-back per file that re-hashes every piece
against its key, each file published by temp + fsync + rename. A byte that does not match
its key never reaches a package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PackageError
from ..io.digests import split_key
from ..io.files import align_up

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ..layout.writer import PayloadLocator
    from ..store import StoredObject, WeightStore

_SEPARATE = re.compile(r"(?:.*/)?weight_[0-9a-f]{64}")


@dataclass(frozen=True)
class Piece:
    """One payload at one offset of a file."""

    key: str
    offset: int
    size: int


@dataclass(frozen=True)
class WeightFile:
    name: str  # relative to the package folder, '/'-separated
    size: int
    pieces: tuple[Piece, ...]  # by offset; bytes outside them are zero

    @property
    def is_separate(self) -> bool:
        """Exactly one payload: a per-weight file, pushed as its own layer."""
        return (len(self.pieces) == 1 and self.pieces[0].offset == 0
                and self.pieces[0].size == self.size and bool(_SEPARATE.fullmatch(self.name)))

    def gaps(self) -> list[tuple[int, int]]:
        """(offset, length) of every range no piece covers: padding, zero bytes."""
        out, pos = [], 0
        for p in self.pieces:
            if p.offset > pos:
                out.append((pos, p.offset - pos))
            pos = max(pos, p.offset + p.size)
        if self.size > pos:
            out.append((pos, self.size - pos))
        return out


def weight_file(name: str, size: int, found: Iterable[tuple[int, int, str]]) -> WeightFile:
    """A file of ``size`` bytes holding ``(offset, length, key)`` pieces; ranges that overlap
    or leave the file, and malformed keys, are a :class:`PackageError`."""
    ordered = sorted(set(found))
    end = 0
    for offset, length, key in ordered:
        split_key(key)
        if offset < end or offset + length > size or length < 0:
            raise PackageError("weight ranges overlap or leave their file", file=name,
                               offset=offset, size=length, key=key)
        end = offset + length
    return WeightFile(name, size, tuple(Piece(k, o, n) for o, n, k in ordered))


def plan_live(ranges: Iterable[tuple[str, int, int]], alignment: int,
              ) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    """Lay the live ranges ``(file, offset, length)`` of weight files into files of their
    own that hold only them (a device folder's): in each file, under the same name, the
    ranges in offset order (overlapping or touching ones as one span), each span at the
    next multiple of ``alignment`` after the previous one, the file ending where its last
    span does. Returns each file's size and each range's new offset by ``(file, old
    offset)``. The same ranges always give the same files, whatever their order."""
    if alignment < 1:
        raise ValueError(f"alignment {alignment} is not positive")
    by_file: dict[str, set[tuple[int, int]]] = {}
    for name, offset, length in ranges:
        by_file.setdefault(name, set()).add((offset, length))
    sizes: dict[str, int] = {}
    moved: dict[tuple[str, int], int] = {}
    for name in sorted(by_file):
        end = 0  # of the new file
        span_old = span_new = span_end = -1  # the span being laid: old start, new start, old end
        for offset, length in sorted(by_file[name]):
            if offset > span_end:  # a new span: at the next aligned offset
                span_old, span_new = offset, align_up(end, alignment)
            span_end = max(span_end, offset + length)
            moved[(name, offset)] = span_new + offset - span_old
            end = max(end, span_new + span_end - span_old)
        sizes[name] = end
    return sizes, moved


def summary_weight_files(summary: Mapping[str, Any]) -> list[WeightFile]:
    """The weight files ``summary.json`` lists, each with the payloads its models place
    in it (sorted by name). A malformed summary raises KeyError, TypeError or ValueError."""
    sizes = {str(f["name"]): int(f["size"]) for f in summary["files"]}
    pieces: dict[str, set[tuple[int, int, str]]] = {name: set() for name in sizes}
    for model in summary["models"]:
        for w in model["external_weights"]:
            location = str(w["location"])
            if location in pieces:
                pieces[location].add((int(w["offset"]), int(w["size"]), str(w["id"])))
    return [weight_file(name, sizes[name], pieces[name]) for name in sorted(sizes)]


def contents_problem(summary: Mapping[str, Any], weights: Mapping[str, WeightFile],
                     others: Mapping[str, tuple[int, str]],
                     also_listed: Mapping[str, tuple[int, str]] | None = None) -> str | None:
    """Why a folder assembled from ``weights`` (weight files, by name) and ``others``
    (every other file but the summary: name -> size and ``"<algo>:<hex>"`` digest, taken
    from the bytes written) is not what ``summary["contents"]`` lists, with
    ``also_listed`` (files listed elsewhere: prepared companions, by their records); None
    when it is.

    A weight file is checked by construction, not by a second read: its payloads were
    each re-hashed against their keys, the bytes between are zeros, so it is what the
    summary lists when its size is and its pieces are those the summary's models place
    in it. A malformed summary raises KeyError, TypeError or ValueError."""
    listed = {str(c["path"]): (int(c["size"]), str(c["digest"])) for c in summary["contents"]}
    listed.update(also_listed or {})
    present = weights.keys() | others.keys()
    for name in sorted(listed.keys() ^ present):
        return f"{'missing' if name in listed else 'unexpected'}: {name}"
    placed = {f.name: f for f in summary_weight_files(summary)}
    for name, (size, digest) in sorted(listed.items()):
        found = weights[name].size if name in weights else others[name][0]
        if found != size:
            return f"size: {name}: {found} bytes, listed as {size}"
        if name in weights and placed.get(name) != weights[name]:
            return f"pieces: {name}: the summary's models place other payloads in it"
        if name in others and others[name][1] != digest:
            return f"digest: {name}: {others[name][1]}, listed as {digest}"
    return None


class MissingPayloadError(PackageError):
    """A piece's payload is not in the store (never stored, or collected since)."""


def assemble(store: WeightStore, folder: Path, files: Iterable[WeightFile], *,
             jobs: int = 4, file_digest: str | None = None,
             arriving: Mapping[str, Future[StoredObject]] | None = None) -> dict[str, str]:
    """Write ``files`` into ``folder`` from the store: every piece copied from its object
    and re-hashed against its key, zeros (holes) elsewhere, each file fsynced. ``folder``
    is a temp folder the caller publishes with :func:`~weightstore.io.files.publish_dir`,
    which fsyncs it once for all the files.

    Returns ``{file name: "<algo>:<hex>"}`` of each whole file with ``file_digest`` (an
    algorithm), taken in the same read-back. Under :meth:`WeightStore.leased` the
    payloads are held until the lease ends, so gc cannot take them meanwhile. A payload
    the store lacks is a :class:`MissingPayloadError`; a damaged one an
    :class:`~weightstore.errors.IntegrityError` naming the store file and the repair; a
    file already in the folder (or listed twice) a :class:`PackageError`.

    ``arriving``: payloads still on their way into the store (a pull's downloads), each
    a future of its object. Assembly starts at once; a piece whose payload is not yet in
    the store waits for its future (and raises what it raises), so copies overlap the
    downloads while every piece is still re-hashed against its key.
    """
    files = list(files)
    if not files:  # a pull whose downloads wrote every file: nothing to locate or load
        return {}
    from ..layout.writer import FileRange

    objects = store.locate({p.key for f in files for p in f.pieces})

    def locate(key: str) -> FileRange:
        obj = objects.get(key)
        if obj is None and arriving is not None and key in arriving:
            obj = arriving[key].result()
        if obj is None:
            raise MissingPayloadError("a payload is missing from the store", key=key,
                                      store=str(store.root))
        return FileRange(store.path_of(obj), obj.offset, stored=True)

    return write_files(folder, files, locate, jobs=jobs, file_digest=file_digest)


def write_files(folder: Path, files: Iterable[WeightFile], locate: PayloadLocator, *,
                jobs: int = 4, file_digest: str | None = None) -> dict[str, str]:
    """Write ``files`` into the temp folder ``folder``, ``locate(key)`` finding each
    payload's bytes (a store object, or a payload's own file in a folder a generic client
    pulled): copied, zeros elsewhere, every piece re-hashed against its key in one
    read-back per file, each file fsynced. See :func:`assemble`."""
    from ..layout.plan import LayoutPlan, PlannedFile, PlannedPayload
    from ..layout.writer import write_plan

    files = list(files)
    seen: set[str] = set()
    for f in files:  # never written over: another file of the folder, or one listed twice
        if f.name in seen or os.path.lexists(folder / f.name):
            raise PackageError("a file to assemble is already in the folder", file=f.name,
                               folder=str(folder))
        seen.add(f.name)
    plan = LayoutPlan("combined", 1, tuple(
        PlannedFile(f.name, f.size, tuple(PlannedPayload(p.key, p.size, f.name, p.offset)
                                          for p in f.pieces))
        for f in files))
    return write_plan(plan, folder, locate, jobs=jobs, file_digest=file_digest,
                      sync_dir=False)
