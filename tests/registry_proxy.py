"""Forwarding for the test proxies put in front of the real registry."""

from __future__ import annotations

import collections
import contextlib
import http.client
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def forward(handler: BaseHTTPRequestHandler, upstream: str,
            body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Send the handler's request with ``body`` to ``upstream``, keeping the client's Host
    (so upload locations point back at the proxy); the answer's status, headers and
    body."""
    conn = http.client.HTTPConnection(upstream, timeout=30)
    try:
        conn.putrequest(handler.command, handler.path, skip_host=True,
                        skip_accept_encoding=True)
        for k, v in handler.headers.items():
            conn.putheader(k, v)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


def send_head(handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]],
              length: int) -> None:
    """Send an answer's status and headers, with a Content-Length of ``length``."""
    handler.send_response(status)
    for k, v in headers:
        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
            handler.send_header(k, v)
    handler.send_header("Content-Length", str(length))
    handler.end_headers()


def answer(handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]],
           data: bytes) -> None:
    """Send an answer (to a HEAD, the Content-Length the upstream gave, no body)."""
    given = next((v for k, v in headers if k.lower() == "content-length"), None)
    send_head(handler, status, headers,
              int(given) if handler.command == "HEAD" and given else len(data))
    if handler.command != "HEAD":
        handler.wfile.write(data)


def relay(handler: BaseHTTPRequestHandler, upstream: str, body: bytes,
          change: Callable[[bytes], bytes] | None = None) -> int:
    """Forward the handler's request and send its answer (through ``change``) back; its
    status."""
    status, headers, data = forward(handler, upstream, body)
    answer(handler, status, headers, change(data) if change is not None else data)
    return status


class QuietServer(ThreadingHTTPServer):
    """A test server that says nothing when a client hangs up before the answer ends (as
    the client under test should, on an answer it refuses)."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


Intercept = Callable[[BaseHTTPRequestHandler, bytes], bool]


@contextlib.contextmanager
def misbehaving(upstream: str | None, intercept: Intercept) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of ``upstream``: every request (with its body) goes
    first to ``intercept``, which answers it itself and returns True, or returns False to
    have it forwarded (with no ``upstream``, a server answering every request itself).
    Yields its host. A client hanging up mid-answer is no error."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if not intercept(self, body) and upstream is not None:
                    relay(self, upstream, body)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    server = QuietServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class Counter:
    """An intercept for :func:`misbehaving` that forwards every request and records its
    method and path."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, handler, body: bytes) -> bool:
        with self.lock:
            self.seen.append((handler.command, handler.path))
        return False  # forwarded

    def blob_gets(self) -> collections.Counter:
        return collections.Counter(p.rsplit("/", 1)[1] for m, p in self.seen
                                   if m == "GET" and "/blobs/sha256:" in p)
