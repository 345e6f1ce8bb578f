"""A byte-counting progress bar on a terminal; silence in CI logs and pipes."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO


def interactive(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("CI")


class Progress:
    """Thread-safe: hashing and copying workers call :meth:`advance` concurrently."""

    def __init__(self, label: str, total: int, *, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = interactive(self.stream) if enabled is None else enabled
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self._lock = threading.Lock()
        self._last = 0.0

    def advance(self, n: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last >= 0.1 or self.done >= self.total:
                self._last = now
                self._draw()

    def _draw(self) -> None:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label:<28} [{bar:<30}] {frac * 100:5.1f}% "
                          f"{self.done / 1e6:9.1f} MB")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            with self._lock:
                self._draw()
                self.stream.write("\n")
                self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
