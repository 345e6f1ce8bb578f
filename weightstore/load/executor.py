"""Carrying out a read plan: parallel chunk reads, checksums verified as runs complete.

Each run is read into one buffer; entries are memoryview slices of it (no copy). Each
entry's checksum is computed from the chunks as they land, in order, while the bytes are
still in cache: one pass over memory rather than a read and then a hash. An entry that fails
its checksum is replaced by its dormant fallback when the manifest has one (read and
verified in turn); otherwise the load fails naming the initializer and location. Bytes read
from the weight store that fail, or a store object that cannot be read as the regular
file of its index entry, are store damage: the error names the store file, the object's
offset there and its key, and the repair command.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..catalogue import typed_fields
from ..errors import REPAIR_HINT, IntegrityError
from ..io.digests import ALGORITHMS, digest_bytes, new_hasher
from ..resolve.manifest import ManifestEntry
from .mapped import MappedData
from .plan import BUFFER, STORE, Placement, ReadPlan, Run
from .reader import Reader, read_range

BOUNCE = 1 << 20  # bytes: read, hashed and written to a sink through a buffer this big
MOVED_RETRIES = 5  # reads planned again after the store moved what they were reading

T = TypeVar("T")


@dataclass
class ReadResult:
    """Entry id -> its little-endian bytes, and what happened on the way."""

    data: dict[str, memoryview] = field(default_factory=dict)
    fell_back: dict[str, str] = field(default_factory=dict)  # failed entry -> fallback used
    runs: list[memoryview] = field(default_factory=list)  # keep the buffers alive


def verify(entry: ManifestEntry, data: memoryview) -> bool:
    """Does ``data`` match the entry's checksum? True when it records none."""
    checksum = entry.source.checksum
    if not checksum:
        return True
    algo, _, expected = checksum.partition(":")
    if algo not in ALGORITHMS:
        return True
    return digest_bytes(algo, data) == expected


def _decode(entry: ManifestEntry, raw: memoryview) -> memoryview:
    s = entry.source
    if s.encoding in ("raw", "raw_data"):
        return raw
    fragment = b"".join(bytes(raw[a - s.offset:b - s.offset]) for a, b in s.spans)
    return memoryview(typed_fields.decode(fragment, s.encoding, entry.dtype, entry.dims,
                                          where=entry.values[0]))


def store_context(entry: ManifestEntry, placement: Placement | None) -> dict[str, object]:
    """Where an entry read from the store lies there (the store file, the object's offset
    and size, its key) and the repair command; empty for bytes read from anywhere else."""
    if placement is None or placement.kind != STORE or placement.path is None:
        return {}
    return {"key": entry.source.store_key, "path": str(placement.path),
            "offset": placement.offset, "size": placement.length, "hint": REPAIR_HINT}


def _read_damage(exc: IntegrityError, run: Run, at: int,
                 members: Sequence[tuple[ManifestEntry, int, int]],
                 placements: Mapping[str, Placement], scenario: str | None,
                 ) -> IntegrityError:
    """A store read that failed (a link, a FIFO, a missing or short file) as the damage
    of the object read at file offset ``at``: its key, file, offset and the repair."""
    rel = at - run.offset
    hit = next((m for m in members if m[1] <= rel < m[1] + m[2]), None)
    hit = hit or min(members, key=lambda m: abs(m[1] - rel), default=None)
    if hit is None:
        return exc
    entry = hit[0]
    return IntegrityError(exc.message, scenario=scenario or "(default)",
                          initializer=entry.values[0],
                          **store_context(entry, placements.get(entry.id)))


def moved_in_store(exc: IntegrityError, store: Any) -> bool:
    """Did the store object a failed read names move since the read was planned: does
    the index now place its key at another file or offset? A compaction re-points a
    file's rows to the copy it made and then removes the file, so a reader that located
    the object just before can find the file gone; that is no damage (the index still
    places the key where the read looked when it is)."""
    key, path, offset = (exc.context.get(k) for k in ("key", "path", "offset"))
    if store is None or not key or path is None:
        return False
    hit = store.locate([key]).get(key)
    return hit is not None and (Path(hit.path), hit.offset) != (Path(str(path)), offset)


def reading_store(store: Any, read: Callable[[], T]) -> T:
    """``read()`` (a load that plans its reads, locating store objects, then reads them),
    planned and read again when it failed on a store object that moved meanwhile
    (:func:`moved_in_store`), at most :data:`MOVED_RETRIES` times: a reader racing a
    compaction gets the right bytes, never an error."""
    attempt = 0
    while True:
        try:
            return read()
        except IntegrityError as exc:
            if attempt >= MOVED_RETRIES or not moved_in_store(exc, store):
                raise
            attempt += 1


def lanes(plan: ReadPlan) -> list[list[int]]:
    """Chunk indices grouped into lanes: consecutive chunks of one run, cut wherever no
    entry spans the boundary. A lane is read in order and its entries hashed as its
    chunks land (the bytes still in cache); lanes run in parallel."""
    out: list[list[int]] = []
    spans: dict[int, list[tuple[int, int]]] = {}
    for i, run in enumerate(plan.runs):
        spans[i] = sorted((o, o + n) for _, o, n in run.entries)
    last_run = -1
    for k, c in enumerate(plan.chunks):
        start = c.offset - plan.runs[c.run].offset
        if c.run != last_run or not any(a < start < b for a, b in spans[c.run]):
            out.append([])
        out[-1].append(k)
        last_run = c.run
    return out


def execute(plan: ReadPlan, entries: Mapping[str, ManifestEntry], reader: Reader, *,
            buffers: Mapping[str, memoryview] | None = None, jobs: int = 4,
            fallback: Callable[[ManifestEntry], memoryview | None] | None = None,
            scenario: str | None = None, tolerate: Collection[str] = (),
            run_buffers: Sequence[memoryview] | None = None,
            sink: tuple[MappedData, Sequence[int]] | None = None) -> ReadResult:
    """Read every planned chunk once, verify each entry, and return their bytes.

    An entry in ``tolerate`` that fails its checksum is left out of the result (its
    caller has a fallback of its own) instead of raising. ``run_buffers`` are where the
    runs go; by default fresh, uninitialized memory. With ``sink`` (a mapped data file and
    each run's slot in it), runs are read through a small buffer, hashed there and
    written to the file, and the entries' bytes are views of its mapping: one pass, with
    no page of the file mapped here unless something reads it later.
    A raw entry is hashed chunk by chunk as its bytes land; an encoded one once whole.
    """
    result = ReadResult()
    placements = {p.entry: p for p in plan.placements}
    stored = {p.path for p in plan.placements if p.kind == STORE}
    if sink is not None:
        run_buffers = [sink[0].slice(s, r.length) for s, r in zip(sink[1], plan.runs,
                                                                   strict=False)]
    result.runs = list(run_buffers) if run_buffers is not None else [
        memoryview(np.empty(run.length, dtype=np.uint8)) for run in plan.runs]
    lock = threading.Lock()
    bad: list[ManifestEntry] = []

    def settle(entry: ManifestEntry, data: memoryview) -> None:
        data = _decode(entry, data)
        if verify(entry, data):
            result.data[entry.id] = data
        else:
            with lock:
                bad.append(entry)

    def read_lane(lane: list[int]) -> None:
        first = plan.chunks[lane[0]]
        run, view = plan.runs[first.run], result.runs[first.run]
        base = first.offset - run.offset
        last = plan.chunks[lane[-1]]
        top = last.offset - run.offset + last.length
        members = [(entries[e], o, n) for e, o, n in run.entries if base <= o < top
                   or (n == 0 and o == top == run.length)]
        streamed = {}  # entry id -> (hasher, expected digest)
        for entry, _, _ in members:
            algo, _, expected = (entry.source.checksum or "").partition(":")
            if entry.source.encoding in ("raw", "raw_data") and algo in ALGORITHMS:
                streamed[entry.id] = (new_hasher(algo, threads=False), expected)
        def feed(start: int, data: memoryview) -> None:
            stop = start + len(data)
            for entry, o, n in members:
                if entry.id in streamed and o < stop and o + n > start:
                    streamed[entry.id][0].update(data[max(o, start) - start:
                                                      min(o + n, stop) - start])

        # the bounce buffer is a mapping of its own: unmapped when the lane ends, where a
        # heap buffer would stay in the worker thread's malloc arena, resident
        bounce = mmap.mmap(-1, BOUNCE) if sink is not None else None
        from_store = run.path in stored
        at = first.offset

        def read(offset: int, out: memoryview) -> None:
            nonlocal at
            at = offset
            read_range(reader, run.path, offset, out, stored=from_store)

        try:
            for k in lane:
                c = plan.chunks[k]
                start = c.offset - run.offset
                if sink is None or bounce is None:
                    read(c.offset, view[start:start + c.length])
                    feed(start, view[start:start + c.length])
                    continue
                with memoryview(bounce) as whole:
                    for pos in range(0, c.length, BOUNCE):  # through a buffer in cache
                        # released even when a read fails: the bounce buffer is then
                        # closed and the read's own error is what the caller sees
                        with whole[:min(BOUNCE, c.length - pos)] as piece:
                            read(c.offset + pos, piece)
                            feed(start + pos, piece)
                            sink[0].write(sink[1][first.run] + start + pos, piece)
        except IntegrityError as exc:
            if not from_store:
                raise
            raise _read_damage(exc, run, at, members, placements, scenario) from None
        finally:
            if bounce is not None:
                bounce.close()
        for entry, o, n in members:
            data = view[o:o + n]
            if entry.id not in streamed:
                settle(entry, data)
            elif streamed[entry.id][0].hexdigest() == streamed[entry.id][1]:
                result.data[entry.id] = data
            else:
                with lock:
                    bad.append(entry)

    for i, run in enumerate(plan.runs):
        if run.length == 0:
            for entry_id, offset, length in run.entries:
                settle(entries[entry_id], result.runs[i][offset:offset + length])
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: list[Future] = [pool.submit(read_lane, lane) for lane in lanes(plan)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()
    for p in plan.placements:
        if p.kind == BUFFER:
            assert buffers is not None and p.name is not None
            settle(entries[p.entry], buffers[p.name][p.offset:p.offset + p.length])
    for entry in bad:
        if entry.id in tolerate:
            result.fell_back[entry.id] = "portable"
            continue
        replacement = fallback(entry) if fallback is not None else None
        if replacement is None:
            where = store_context(entry, placements.get(entry.id))
            if not where:
                where = {"location": entry.source.file or "(model file)",
                         "offset": entry.source.offset}
            hint = where.pop("hint", None)
            raise IntegrityError("a live weight's bytes do not match their checksum",
                                 scenario=scenario or "(default)", initializer=entry.values[0],
                                 **where, checksum=entry.source.checksum,
                                 **({"hint": hint} if hint else {}))
        result.data[entry.id] = replacement
        result.fell_back[entry.id] = entry.values[0]
    return result
