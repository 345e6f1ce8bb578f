"""Carrying out a read plan: parallel chunk reads, checksums verified as runs complete.

Each run is read into one buffer; entries are memoryview slices of it (no copy). When the
last chunk of a run lands, the checksums of its entries are verified. An entry that fails
its checksum is replaced by its dormant fallback when the manifest has one (read and
verified in turn); otherwise the load fails naming the initializer and location.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from ..catalogue import typed_fields
from ..errors import IntegrityError
from ..hashing import ALGORITHMS, digest_bytes
from ..resolve.manifest import ManifestEntry
from .plan import BUFFER, ReadPlan
from .reader import Reader


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


def execute(plan: ReadPlan, entries: Mapping[str, ManifestEntry], reader: Reader, *,
            buffers: Mapping[str, memoryview] | None = None, jobs: int = 4,
            fallback: Callable[[ManifestEntry], memoryview | None] | None = None,
            scenario: str | None = None, tolerate: Collection[str] = (),
            run_buffers: Sequence[memoryview] | None = None) -> ReadResult:
    """Read every planned chunk once, verify each entry, and return their bytes.

    An entry in ``tolerate`` that fails its checksum is left out of the result (its
    caller has a fallback of its own) instead of raising. ``run_buffers`` are where the
    runs go (e.g. slices of a mapped file); by default fresh, uninitialized memory.
    """
    result = ReadResult()
    result.runs = list(run_buffers) if run_buffers is not None else [
        memoryview(np.empty(run.length, dtype=np.uint8)) for run in plan.runs]
    left = [0] * len(plan.runs)
    for c in plan.chunks:
        left[c.run] += 1
    lock = threading.Lock()
    bad: list[ManifestEntry] = []

    def settle(entry: ManifestEntry, data: memoryview) -> None:
        data = _decode(entry, data)
        if verify(entry, data):
            result.data[entry.id] = data
        else:
            with lock:
                bad.append(entry)

    def finish_run(i: int) -> None:
        view = result.runs[i]
        for entry_id, offset, length in plan.runs[i].entries:
            settle(entries[entry_id], view[offset:offset + length])

    def read_chunk(c) -> None:
        run = plan.runs[c.run]
        start = c.offset - run.offset
        reader.read_into(run.path, c.offset, result.runs[c.run][start:start + c.length])
        with lock:
            left[c.run] -= 1
            done = left[c.run] == 0
        if done:
            finish_run(c.run)

    for i, run in enumerate(plan.runs):
        if run.length == 0:
            finish_run(i)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: list[Future] = [pool.submit(read_chunk, c) for c in plan.chunks]
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
            raise IntegrityError("a live weight's bytes do not match their checksum",
                                 scenario=scenario or "(default)", initializer=entry.values[0],
                                 location=entry.source.file or "(model file)",
                                 offset=entry.source.offset, checksum=entry.source.checksum)
        result.data[entry.id] = replacement
        result.fell_back[entry.id] = entry.values[0]
    return result
