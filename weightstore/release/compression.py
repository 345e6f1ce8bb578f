"""The zstd settings of release archives, pinned so that the bytes depend on nothing else.

zstd's multi-threaded mode cuts the input into jobs whose size comes from the parameters,
never from the number of workers, so any worker count >= 1 gives the same frame (zstd's
maintainers state it, facebook/zstd#2238, and a test checks 1, 2, 3 and 5 workers); the
single-threaded mode (0 workers) gives another one, so it is never used. What is pinned
is therefore the mode and the job size, not the count: ``--jobs`` changes only the speed.
The one known exception, a one-shot compression whose job count came from the output
buffer's size (zstd 1.4.5), does not arise here: archives are streamed. The job size
is set here rather than left to the library's default, which could change between zstd
versions. Each archive is one frame carrying its content size and a checksum.

The level's own parameters (window, hash and chain sizes, search depth, minimum match,
strategy) are libzstd's for that level and the archive's size, as ``zstd -<level> FILE``
picks them. One setting goes beyond the level: zstd 1.5.7's block pre-splitter
(``ZSTD_c_blockSplitterLevel``), which ends a 128 KiB block early where the byte
statistics change. At level 3 libzstd's default samples 8 KiB chunks of every block: on
large float tensors, which have no such changes inside, that cost a quarter of the
compression CPU and 0.12% of size. Setting 2 compares only the two ends of each block:
the CPU of no pre-splitting, the size of no pre-splitting on large tensors, and most of
the default's gain where small tensors of different scales follow each other
(docs/reference/formats/release.md, "Choosing the default compression", has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_LEVEL = 3  # see docs/reference/formats/release.md: float weights barely compress
JOB_SIZE = 8 << 20  # bytes per zstd job: parallelism and memory (workers x ~3 jobs)
LDM_WINDOW_LOG = 27  # long-distance matching: 128 MiB window
PRESPLIT = 2  # ZSTD_c_blockSplitterLevel: 0 libzstd's choice, 1 none, 2 block ends only


@dataclass(frozen=True)
class Compression:
    level: int = DEFAULT_LEVEL
    long_distance: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.level <= 19:
            raise ValueError(f"zstd level must be 1 to 19, not {self.level}")

    def parameters(self, workers: int) -> list[tuple[str, int]]:
        """libzstd's ``ZSTD_c_<name>`` settings, in the order they are applied (the level
        first: later settings override what it implies)."""
        out = [("compressionLevel", self.level), ("nbWorkers", max(1, workers)),
               ("jobSize", JOB_SIZE), ("checksumFlag", 1), ("contentSizeFlag", 1),
               ("dictIDFlag", 0), ("blockSplitterLevel", PRESPLIT)]
        if self.long_distance:
            out += [("enableLongDistanceMatching", 1), ("windowLog", LDM_WINDOW_LOG)]
        return out

    def to_dict(self) -> dict[str, Any]:
        """What release.json records: everything that shapes the archive's bytes."""
        return {"format": "zstd", "level": self.level, "long_distance": self.long_distance,
                "job_size": JOB_SIZE, "block_splitter_level": PRESPLIT, "checksum": True,
                "content_size": True}
