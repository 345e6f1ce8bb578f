"""Headless Chromium (Debian's ``chromium``) driven through its own command line: a page
loaded, its DOM after the scripts ran, a screenshot, and what it wrote to its console.

Tests take the session fixture ``chromium`` (tests/conftest.py), which skips them with a
reason where the browser is absent; CI installs it (.ci/run).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

CONSOLE = re.compile(r":CONSOLE[:(]")  # Chromium logs each console message so


@dataclass(frozen=True)
class Loaded:
    """One page as the browser showed it."""

    dom: str
    screenshot: bytes  # PNG
    console: list[str]  # console messages and uncaught errors, one line each


class Chromium:
    def __init__(self, binary: str) -> None:
        self.binary = binary

    def load(self, page: Path, fragment: str = "", *, width: int = 1400,
             height: int = 1000) -> Loaded:
        """Load ``page`` (``#fragment``) offline, run its scripts, take the DOM and a
        screenshot in one browser start."""
        with tempfile.TemporaryDirectory() as tmp:
            shot = Path(tmp) / "shot.png"
            url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
            done = subprocess.run(
                [self.binary, "--headless", "--no-sandbox", "--disable-gpu",
                 "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                 f"--user-data-dir={tmp}/profile", "--enable-logging=stderr", "--v=0",
                 f"--window-size={width},{height}", f"--screenshot={shot}", "--dump-dom",
                 url], capture_output=True, text=True, timeout=120, check=False)
            assert shot.exists(), done.stderr[-2000:]
            console = [line for line in done.stderr.splitlines() if CONSOLE.search(line)]
            return Loaded(done.stdout, shot.read_bytes(), console)


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def png_colours(png: bytes) -> int:
    """How many distinct byte values the image's filtered scanlines hold: a blank (one
    colour) screenshot has a handful, a drawn page hundreds."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        length = int.from_bytes(png[pos:pos + 4], "big")
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(data)))
