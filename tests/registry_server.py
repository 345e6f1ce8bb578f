"""A real CNCF distribution registry (Debian's ``docker-registry``) for tests.

Started on 127.0.0.1 with a free port and a temp storage folder from a short YAML config,
ready once ``/v2/`` answers, stopped (or killed, then restarted on the same storage) by
the test; with ``proxy``, a pull-through cache of another registry (distribution's proxy
mode). Tests skip only when the binary is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

BINARY = shutil.which("docker-registry") or (
    "/usr/bin/docker-registry" if os.path.exists("/usr/bin/docker-registry") else None)
SKIP_REASON = ("docker-registry (the CNCF distribution registry, Debian package "
               "'docker-registry') is not installed")

needs_registry = pytest.mark.skipif(BINARY is None, reason=SKIP_REASON)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RegistryServer:
    """One registry process; ``host`` is ``127.0.0.1:<port>``."""

    def __init__(self, folder: Path, htpasswd: Path | None = None,
                 auth: str = "", proxy: str | None = None) -> None:
        self.folder = folder
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.config = folder / "config.yml"
        if htpasswd is not None:
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        self.config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + auth
            + (f"proxy:\n  remoteurl: {proxy}\n" if proxy else ""))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> RegistryServer:
        assert BINARY is not None
        log = open(self.folder / "registry.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen([BINARY, "serve", str(self.config)], stdout=log,
                                     stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("registry exited: "
                                   + (self.folder / "registry.log").read_text()[-2000:])
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1).close()
                return self
            except urllib.error.HTTPError:
                return self  # answering (401 with auth on)
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"registry did not answer on {self.host} within {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@contextlib.contextmanager
def running_registry(folder: Path, htpasswd: Path | None = None, auth: str = "",
                     proxy: str | None = None):
    """``auth``: an ``auth:`` section of the registry's config (e.g. a token service);
    ``proxy``: the URL of the registry this one is a pull-through cache of."""
    folder.mkdir(parents=True, exist_ok=True)
    server = RegistryServer(folder, htpasswd, auth, proxy).start()
    try:
        yield server
    finally:
        server.stop()
