"""A forward HTTP proxy for tests, as corporate networks run one: ``CONNECT`` tunnels for
HTTPS, absolute-URL requests for plain HTTP, on 127.0.0.1. It records what it was asked
(method, target, ``Proxy-Authorization``) and connects every name it is given to
127.0.0.1 (``registry.test`` is a registry on this machine under a name that is not
loopback, so a client uses its proxy for it)."""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class ProxyLog:
    host: str
    asked: list[tuple[str, str, str | None]] = field(default_factory=list)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    while True:
        ready, _, _ = select.select([a, b], [], [], 30)
        if not ready:
            return
        for sock in ready:
            data = sock.recv(1 << 16)
            if not data:
                return
            (b if sock is a else a).sendall(data)


@contextlib.contextmanager
def forward_proxy() -> Iterator[ProxyLog]:
    log = ProxyLog("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_CONNECT(self) -> None:
            log.asked.append(("CONNECT", self.path, self.headers.get("Proxy-Authorization")))
            _, port = self.path.rsplit(":", 1)
            with socket.create_connection(("127.0.0.1", int(port)), 10) as upstream:
                self.send_response(200, "Connection established")
                self.end_headers()
                _pipe(self.connection, upstream)
            self.close_connection = True

        def _forward(self) -> None:
            log.asked.append((self.command, self.path, self.headers.get("Proxy-Authorization")))
            target = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection("127.0.0.1", target.port or 80, timeout=30)
            try:
                conn.putrequest(self.command, target.path + (f"?{target.query}"
                                                             if target.query else ""),
                                skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in ("proxy-authorization", "proxy-connection"):
                        conn.putheader(k, v)
                conn.endheaders(body)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    log.host = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield log
    finally:
        server.shutdown()
        server.server_close()
