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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import zstandard

DEFAULT_LEVEL = 3  # see docs/formats.md "Compression, measured": float weights barely compress
JOB_SIZE = 8 << 20  # bytes per zstd job: parallelism and memory (workers x ~3 jobs)
LDM_WINDOW_LOG = 27  # long-distance matching: 128 MiB window


@dataclass(frozen=True)
class Compression:
    level: int = DEFAULT_LEVEL
    long_distance: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.level <= 19:
            raise ValueError(f"zstd level must be 1 to 19, not {self.level}")

    def parameters(self, workers: int) -> zstandard.ZstdCompressionParameters:
        import zstandard

        extra: dict[str, Any] = {}
        if self.long_distance:
            extra = {"enable_ldm": True, "window_log": LDM_WINDOW_LOG}
        return zstandard.ZstdCompressionParameters.from_level(
            self.level, threads=max(1, workers), job_size=JOB_SIZE, write_checksum=True,
            write_content_size=True, write_dict_id=False, **extra)

    def to_dict(self) -> dict[str, Any]:
        """What release.json records: everything that shapes the archive's bytes."""
        return {"format": "zstd", "level": self.level, "long_distance": self.long_distance,
                "job_size": JOB_SIZE, "checksum": True, "content_size": True}
