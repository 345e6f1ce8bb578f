"""Forwarding for the test proxies put in front of the real registry."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler


def relay(handler: BaseHTTPRequestHandler, upstream: str, body: bytes,
          change: Callable[[bytes], bytes] | None = None) -> int:
    """Send the handler's request with ``body`` to ``upstream``, keeping the client's Host
    (so upload locations point back at the proxy), and its answer (through ``change``)
    back; its status."""
    conn = http.client.HTTPConnection(upstream, timeout=30)
    try:
        conn.putrequest(handler.command, handler.path, skip_host=True,
                        skip_accept_encoding=True)
        for k, v in handler.headers.items():
            conn.putheader(k, v)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        data = resp.read()
        if change is not None:
            data = change(data)
        handler.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)
        return resp.status
    finally:
        conn.close()
