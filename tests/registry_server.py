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
import ssl
import subprocess
import sys
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
    """One registry process; ``host`` is ``127.0.0.1:<port>``. With ``tls`` (a server
    certificate and its key, then the CA it answers to), it serves HTTPS only; with
    ``client_ca`` too, only to clients with a certificate that CA signed (mTLS)."""

    def __init__(self, folder: Path, htpasswd: Path | None = None,
                 auth: str = "", proxy: str | None = None, *,
                 tls: tuple[Path, Path, Path] | None = None,
                 client_ca: Path | None = None) -> None:
        self.folder = folder
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.config = folder / "config.yml"
        self.tls = tls
        if htpasswd is not None:
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        served = ""  # the http section's tls part
        if tls is not None:
            served = (f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
                      + (f"    clientcas:\n      - {client_ca}\n" if client_ca else ""))
        self.config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + served + auth
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
            if self._answers():
                self._forget_plain()
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"registry did not answer on {self.host} within {timeout} s")

    def _forget_plain(self) -> None:
        """A new server on a port an earlier one of this process had: whether it speaks
        plain HTTP is found out again (the client decides it once per host)."""
        scheme = sys.modules.get("weightstore.registry.scheme")
        if scheme is not None:
            scheme.forget(self.host)
            scheme.forget(f"localhost:{self.port}")

    def _answers(self) -> bool:
        """Does ``/v2/`` answer (any HTTP answer: 401 with auth on)? Over TLS, a
        completed handshake is enough (an mTLS registry wants a client certificate)."""
        if self.tls is None:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1).close()
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
            return True
        context = ssl.create_default_context(cafile=str(self.tls[2]))
        context.check_hostname = False  # a certificate for another name serves too
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock, \
                    context.wrap_socket(sock, server_hostname="127.0.0.1"):
                return True
        except OSError:
            return False

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
                     proxy: str | None = None, *,
                     tls: tuple[Path, Path, Path] | None = None,
                     client_ca: Path | None = None):
    """``auth``: an ``auth:`` section of the registry's config (e.g. a token service);
    ``proxy``: the URL of the registry this one is a pull-through cache of; ``tls``,
    ``client_ca``: see :class:`RegistryServer`."""
    folder.mkdir(parents=True, exist_ok=True)
    server = RegistryServer(folder, htpasswd, auth, proxy, tls=tls,
                            client_ca=client_ca).start()
    try:
        yield server
    finally:
        server.stop()
