"""Byte-counting progress bars with rate and ETA on a terminal; silence in CI logs and
pipes.

tqdm draws them (a dependency that earns its place: rate, ETA, terminal width and
redraw throttling done right, where the hand-written bar had none of them); this module
only decides when a bar is shown and keeps concurrent workers from racing on it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TextIO


def interactive(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("CI")


def requested(args: object) -> bool | None:
    """The bar setting a command line asks for: never under ``-q``, otherwise only on an
    interactive terminal (None)."""
    return False if getattr(args, "quiet", False) else None


class Progress:
    """Thread-safe: hashing and copying workers call :meth:`advance` concurrently.

    A bar with nothing to count (``total`` 0: every key cached, say) is never drawn: it
    would stay on screen at 0 % of nothing."""

    def __init__(self, label: str, total: int, *, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = total > 0 and (interactive(self.stream) if enabled is None
                                      else enabled)
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self._lock = threading.Lock()
        self._bar = None
        if self.enabled:  # tqdm's import is paid only where a bar is drawn
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=label, unit="B", unit_scale=True,
                             file=self.stream, mininterval=0.1, dynamic_ncols=True,
                             leave=True)

    def advance(self, n: int) -> None:
        if self._bar is None:
            return
        with self._lock:
            self.done += n
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
