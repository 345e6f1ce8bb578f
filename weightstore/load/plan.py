"""The execution plan: which bytes to read from where, as coalesced chunks (pure).

Each active manifest entry gets one place to come from, by priority: a buffer the caller
supplied under the entry's file name (GE's user memory by file name), the file in the
package folder, or the weight store by the entry's digest. Entries of one file whose
ranges touch are coalesced into one run (never bridging a gap: only live bytes are read),
and each run is cut into chunks of at most :data:`CHUNK` bytes, read in parallel; a chunk
ends at an entry boundary where one falls past :data:`MIN_CHUNK`, so the executor can
verify groups of whole entries independently.

A store row whose size is not the entry's length is damage (the row or the object is not
what the build recorded): the plan refuses it, naming the store file, offset, key and the
repair, rather than reading a range nobody can vouch for. In a package folder, a file that
is not a regular file (a symbolic link) is no package file, as ``weightstore verify`` has
it: the entry's bytes come from the store by digest, as for a file the package lacks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import REPAIR_HINT, IntegrityError, LoadError
from ..resolve.files import folder_file
from ..resolve.locator import StoreLocator
from ..resolve.manifest import STORE_ONLY, ManifestEntry

CHUNK = 10 << 20  # bytes: GE copies weights in 10 MB chunks
MIN_CHUNK = 1 << 20  # a chunk ends at an entry boundary once it holds this much

BUFFER = "buffer"
FOLDER = "folder"
STORE = "store"


@dataclass(frozen=True)
class Placement:
    """Where one entry's bytes come from."""

    entry: str
    kind: str  # BUFFER | FOLDER | STORE
    path: Path | None  # FOLDER / STORE
    name: str | None  # BUFFER: the caller's file name
    offset: int
    length: int


@dataclass(frozen=True)
class Run:
    """Adjacent ranges of one file, read into one buffer."""

    path: Path
    offset: int
    length: int
    entries: tuple[tuple[str, int, int], ...]  # (entry id, offset in run, length)


@dataclass(frozen=True)
class Chunk:
    run: int
    offset: int  # in the file
    length: int


@dataclass(frozen=True)
class ReadPlan:
    placements: tuple[Placement, ...]
    runs: tuple[Run, ...]
    chunks: tuple[Chunk, ...]

    @property
    def read_bytes(self) -> int:
        return sum(c.length for c in self.chunks)


def place(entry: ManifestEntry, folder: Path | None, model_file: Path,
          buffers: Mapping[str, int], store: StoreLocator | None,
          located: Mapping[str, object],
          in_folder: Callable[[ManifestEntry], Path | None] | None = None) -> Placement:
    """The source of one entry's bytes, by priority (caller buffer > folder > store).
    ``in_folder``: the entry's file in the folder, or None when it has none there."""
    s = entry.source
    if entry.origin in STORE_ONLY:  # packed payloads live in the store only
        hit = located.get(s.store_key) if s.store_key else None
        if hit is None:
            raise LoadError("a prepared payload is missing from the store",
                            initializer=entry.values[0], store_key=s.store_key)
        return _stored(entry, hit)
    if s.file and s.file in buffers:
        size = buffers[s.file]
        if s.offset + s.length > size:
            raise LoadError("caller buffer is too small for a weight it supplies",
                            file=s.file, offset=s.offset, length=s.length, buffer=size,
                            initializer=entry.values[0])
        return Placement(entry.id, BUFFER, None, s.file, s.offset, s.length)
    path = model_file if not s.file else (in_folder or _folder_file(folder))(entry)
    if path is not None and path.is_file():
        return Placement(entry.id, FOLDER, path, None, s.offset, s.length)
    hit = located.get(s.store_key) if s.store_key else None
    if hit is not None:
        return _stored(entry, hit)
    raise LoadError("no source holds a live weight", initializer=entry.values[0],
                    location=s.file or model_file.name, store_key=s.store_key)


def _stored(entry: ManifestEntry, hit: object) -> Placement:
    """The placement of an entry in the store object ``hit`` (a located range), which
    must be exactly as long as the entry."""
    path, offset, length = hit.path, hit.offset, hit.length  # type: ignore[attr-defined]
    if length != entry.source.length:
        raise IntegrityError("the store's index entry of a live weight disagrees with its "
                             "size", initializer=entry.values[0], key=entry.source.store_key,
                             path=str(path), offset=offset, size=length,
                             expected=entry.source.length,
                             hint=REPAIR_HINT)
    return Placement(entry.id, STORE, path, None, offset, length)


def _folder_file(folder: Path | None, package: bool = False,
                 ) -> Callable[[ManifestEntry], Path | None]:
    """An entry's file in ``folder`` (None when absent, or when there is no folder: a
    build opened from the store), each file name resolved and checked once: a package's
    entries mostly share one or two files. ``package``: the folder is a package, whose
    files are regular files (one reached through a symbolic link counts as absent)."""
    found: dict[str, Path | None] = {}
    if folder is None:
        return lambda entry: None

    def in_folder(entry: ManifestEntry) -> Path | None:
        name = entry.source.file
        if name not in found:
            found[name] = folder_file(folder, name, where=entry.values[0], package=package)
        return found[name]

    return in_folder


def plan_reads(entries: Sequence[ManifestEntry], folder: Path | None, model_file: Path, *,
               buffers: Mapping[str, int] | None = None, store: StoreLocator | None = None,
               chunk: int = CHUNK, package: bool = False) -> ReadPlan:
    """Placements, coalesced runs and chunks for ``entries`` (pure but for ``stat`` and
    one store lookup for the entries the folder lacks). ``package``: ``folder`` is a
    package folder (its files must be regular files)."""
    buffers = buffers or {}
    in_folder = _folder_file(folder, package)
    missing = [e.source.store_key for e in entries
               if e.source.store_key and (e.origin in STORE_ONLY or (
                   e.source.file and e.source.file not in buffers
                   and in_folder(e) is None))]
    located = store.locate(missing) if store is not None and missing else {}
    placements = tuple(place(e, folder, model_file, buffers, store, located, in_folder)
                       for e in entries)
    ranges: dict[tuple[Path, int, int], list[str]] = {}
    for p in placements:
        if p.path is not None:
            ranges.setdefault((p.path, p.offset, p.length), []).append(p.entry)
    runs: list[Run] = []
    current: list[tuple[tuple[Path, int, int], list[str]]] = []

    def close() -> None:
        if current:
            path, start = current[0][0][0], current[0][0][1]
            end = max(o + n for (_, o, n), _ in current)
            runs.append(Run(path, start, end - start, tuple(
                (e, o - start, n) for (_, o, n), ids in current for e in ids)))
            current.clear()

    for key in sorted(ranges):
        path, offset, _ = key
        if current:
            cpath, _, _ = current[-1][0]
            end = max(o + n for (_, o, n), _ in current)
            if cpath != path or offset > end:
                close()
        current.append((key, ranges[key]))
    close()
    chunks = []
    for i, run in enumerate(runs):
        cuts = sorted({b for _, o, n in run.entries for b in (o, o + n)})
        pos = 0
        while pos < run.length:
            end = min(pos + chunk, run.length)
            # end at the first entry boundary past a minimum, when there is one in reach:
            # a chunk then holds whole entries, so it can be verified on its own
            k = bisect_left(cuts, pos + max(1, min(chunk, MIN_CHUNK)))
            if k < len(cuts) and cuts[k] < end:
                end = cuts[k]
            chunks.append(Chunk(i, run.offset + pos, end - pos))
            pos = end
    return ReadPlan(placements, tuple(runs), tuple(chunks))
