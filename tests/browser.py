"""Headless Chromium (Debian's ``chromium``) driven through its own command line: a page
loaded, its DOM after the scripts ran, a screenshot, and what it wrote to its console.

Tests take the session fixture ``chromium`` (tests/conftest.py), which skips them with a
reason where the browser is absent; CI installs it (.ci/run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
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


# dup the two ends passed by number onto fds 3 and 4 (copies first: an end may be 3 or 4),
# then become the browser
_PIPE_SHIM = """import os, sys
ends = [os.dup(int(fd)) for fd in sys.argv[1:3]]
os.dup2(ends[0], 3)
os.dup2(ends[1], 4)
for fd in (3, 4):  # dup2 onto itself (an end already 3 or 4) leaves it closed on exec
    os.set_inheritable(fd, True)
os.execv(sys.argv[3], sys.argv[3:])
"""


class DevTools:
    """One headless Chromium driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``: JSON messages, each ending in a NUL byte, written to the
    browser's fd 3 and read from its fd 4), for pages that need more than one load: typing
    into a page, waiting for what its scripts (and workers) do, many pages in one start.
    Use as a context manager; ``console`` gathers the errors every page reported."""

    def __init__(self, binary: str, *, width: int = 1400, height: int = 1000) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # the browser's fds 3 and 4 are the pipe's ends, set by a shim that then execs it
        self._process = subprocess.Popen(
            [sys.executable, "-c", _PIPE_SHIM, str(to_browser), str(from_browser), binary,
             "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={self._tmp.name}/profile", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(to_browser, from_browser))
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []
        self.console: list[str] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget",
                                   {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def __enter__(self) -> DevTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._write)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._read)
        self._tmp.cleanup()

    def _message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise ConnectionError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        self._note(message)
        return message

    def _note(self, message: dict) -> None:
        """Keep what a page reports as an error: an uncaught exception, a console.error, a
        failed load the browser logs."""
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.console.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.console.append("console.error: " + " ".join(map(str, args)))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.console.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())

    def _call(self, method: str, params: dict | None = None, *, session: str | None = None,
              timeout: float = 30) -> dict:
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message(timeout)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def call(self, method: str, params: dict | None = None, *, timeout: float = 30) -> dict:
        """A DevTools command on the page."""
        return self._call(method, params, session=self._session, timeout=timeout)

    def navigate(self, url: str, *, timeout: float = 30) -> None:
        """Load ``url`` and wait for its load event."""
        self._events.clear()
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._events.append(self._message(deadline - time.monotonic()))

    def evaluate(self, expression: str, *, timeout: float = 30) -> object:
        """The value of a JavaScript expression in the page (a promise awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "awaitPromise": True, "returnByValue": True},
                           timeout=timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 15) -> object:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)
