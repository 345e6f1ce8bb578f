"""Random access to a file's bytes by positional reads, through one small cached window.

The catalogue walks only the protobuf framing of a model and skips payloads by their
length. Reading that framing with ``pread`` keeps the process's memory at one window:
a memory map would fault whole page-cache blocks (several MB each on recent kernels) into
the process for every byte of framing it touches.
"""

from __future__ import annotations

import os

from ..io.files import read_exact

WINDOW = 64 << 10


class FileBytes:
    """``buf[i]`` and ``buf[a:b]`` over an open file; not for concurrent use."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._start = 0
        self._window = b""

    def __len__(self) -> int:
        return self._size

    def _load(self, pos: int) -> None:
        self._start = pos
        self._window = os.pread(self._fd, min(WINDOW, self._size - pos), pos)

    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self._size)
            if stop <= start:
                return b""
            end = self._start + len(self._window)
            if not (self._start <= start and stop <= end):
                if stop - start > WINDOW:
                    return read_exact(self._fd, start, stop - start)
                self._load(start)
            return self._window[start - self._start:stop - self._start]
        if not 0 <= key < self._size:
            raise IndexError(key)
        if not self._start <= key < self._start + len(self._window):
            self._load(key)
        return self._window[key - self._start]
