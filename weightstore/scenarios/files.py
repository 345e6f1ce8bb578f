"""Scenarios of a model *file*, rewritten without loading its payloads.

Rewriting streams the file's top-level fields
to a temp file beside the destination, in the kernel where possible, leaving out the old
field-20000 entries and appending the new ones, then renames it into place: a model of
any size (over 2 GiB too) gets new scenarios in one sequential copy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .._proto import weightstore_pb2 as pb
from ..catalogue.filebytes import FileBytes
from ..catalogue.wire import iter_fields
from ..errors import ModelError
from ..io.files import atomic_writer, copy_range, write_all
from .storage import FIELD


def rewrite_scenarios_file(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                           scenarios: Sequence[pb.ModelModificationScenarioProto]) -> None:
    """Write ``src`` to ``dst`` (may be the same path) with ``scenarios`` as its scenarios."""
    src, dst = Path(src), Path(dst)
    added = pb.ModelScenarios(modification_scenarios=list(scenarios)).SerializeToString(
        deterministic=True)
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        size = os.fstat(fd).st_size
        ranges = []
        try:
            for f in iter_fields(FileBytes(fd, size), 0, size):
                if f.number != FIELD:
                    if ranges and ranges[-1][1] == f.start:
                        ranges[-1] = (ranges[-1][0], f.end)
                    else:
                        ranges.append((f.start, f.end))
        except ModelError as exc:
            exc.context.setdefault("file", str(src))
            raise
        with atomic_writer(dst, "w+b", sweep=True) as out:  # and what a killed run left
            pos = 0
            for start, end in ranges:
                try:
                    copy_range(fd, start, out.fileno(), pos, end - start)
                except EOFError as exc:  # cut short by someone else since it was read
                    raise ModelError("model file ended early while it was copied (changed "
                                     "by another process?)", file=str(src), offset=start,
                                     detail=str(exc)) from None
                pos += end - start
            write_all(out.fileno(), added, pos)
    finally:
        os.close(fd)
