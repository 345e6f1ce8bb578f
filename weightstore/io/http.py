"""HTTP/1.1 requests on the standard library's ``http.client``: kept-alive connections,
redirects checked hop by hop, proxies from the environment, and the TLS of
:mod:`weightstore.io.tls`.

Why not ``requests``: a registry pull of a small package is mostly start-up, and
``requests`` with ``urllib3`` took about 60 ms of imports that ``http.client`` (which
``urllib3`` itself sits on) does not. What they did for us is here, in one place:

- one connection per scheme, host and proxy, kept alive between requests while each
  answer is read to its end (an answer closed early closes its connection), a kept
  connection that the server closed meanwhile noticed before it is reused;
- ``(connect, read)`` timeouts: the first for the connection (TCP, proxy tunnel, TLS
  handshake), the second for every read of the socket after it;
- redirects (301, 302, 303, 307, 308; at most :data:`MAX_REDIRECTS`): every hop passes
  ``guard(target)`` before anything connects to it, a redirect's body is never read, and
  ``Authorization`` is dropped when a hop leaves the host (or goes from HTTPS to HTTP);
- proxies from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``,
  ``NO_PROXY``, as ``urllib.request`` reads them), ``user:password@`` in the proxy's URL
  sent as ``Proxy-Authorization``; HTTPS goes through a ``CONNECT`` tunnel, and the proxy
  itself is spoken to in plain HTTP (an ``https://`` proxy URL is refused);
- TLS: the context ``tls_context()`` gives, made on the first HTTPS connection only (a
  session that speaks plain HTTP never loads a trust store).

Every failure of the transfer is a :class:`Broken` (a :class:`ConnectError` when it came
before the answer began: the connection, the tunnel, the TLS handshake, or a TLS alert
the server sends once the handshake is done, as TLS 1.3 servers refuse a client
certificate), with the error behind it as ``reason``; what an answer says is the
caller's to judge.
"""

from __future__ import annotations

import base64
import http.client
import select
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from ..errors import WeightstoreError

MAX_REDIRECTS = 30
REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "weightstore"


class Broken(Exception):
    """A transfer broken off: no connection, a timeout, a connection closed or reset, an
    answer cut short or that is no HTTP. ``reason``: the error behind it."""

    def __init__(self, message: str, reason: BaseException | None = None) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def kind(self) -> str:
        """What broke, in a word an error message may show: ``SSLError`` for any TLS
        failure, else the name of the error behind it."""
        if isinstance(self.reason, ssl.SSLError):
            return "SSLError"
        return type(self.reason or self).__name__


class ConnectError(Broken):
    """No connection to send the request on: refused, timed out, the proxy's tunnel or
    the TLS handshake failed (or TLS refused the request before its answer began)."""


class TooManyRedirects(Exception):
    """More than :data:`MAX_REDIRECTS` redirects."""


class Response:
    """An answer whose body has not been read: :meth:`read1` gives it piece by piece.
    Closing it (or leaving its ``with`` block) gives its connection back when the body
    was read to its end, and closes the connection otherwise."""

    def __init__(self, raw: http.client.HTTPResponse, url: str,
                 release: Callable[[bool], None]) -> None:
        self.raw = raw
        self.url = url
        self.status_code = raw.status
        self.headers = raw.headers
        self._release: Callable[[bool], None] | None = release
        self._done = raw.length == 0 or raw.isclosed()

    @property
    def is_redirect(self) -> bool:
        return self.status_code in REDIRECTS and "location" in self.headers

    def read1(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body, one receive at most; ``b""`` at its end."""
        if self._done:
            return b""
        try:
            data = self.raw.read1(n)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._release_now(False)
            raise Broken(f"the answer broke off: {type(exc).__name__}", exc) from None
        if not data:
            if self.raw.length:  # the connection ended before Content-Length did
                self._release_now(False)
                raise Broken("the answer was cut short")
            self._done = True
        return data

    def read(self, limit: int) -> bytes:
        """The body up to ``limit`` bytes (more is left unread, the connection closed)."""
        parts, size = [], 0
        while size < limit:
            data = self.read1(limit - size)
            if not data:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts)

    def _release_now(self, reusable: bool) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(reusable)

    def close(self) -> None:
        if self._release is None:
            return
        self._done = self._done or self.raw.length == 0
        reusable = self._done and not self.raw.will_close
        self.raw.close()
        self._release_now(reusable)

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Connection(http.client.HTTPConnection):
    """Connects within ``timeout`` (the connect timeout), then reads within
    ``read_timeout``."""

    read_timeout: float | None = None

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


class _TLSConnection(http.client.HTTPSConnection):
    read_timeout: float | None = None

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


def _port(parts: Any) -> int:
    try:
        port = parts.port
    except ValueError:
        port = None
    return port or (443 if parts.scheme == "https" else 80)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), _port(parts)


def _strips_auth(old: str, new: str) -> bool:
    """Is ``Authorization`` dropped on a redirect from ``old`` to ``new``: another host or
    port, or HTTPS to HTTP (``requests``' rule, an upgrade of the default port kept)."""
    (s1, h1, p1), (s2, h2, p2) = _origin(old), _origin(new)
    if h1 != h2:
        return True
    if s1 == "http" and s2 == "https" and p1 == 80 and p2 == 443:
        return False
    return (s1, p1) != (s2, p2)


def redirect_target(resp: Response) -> str:
    """Where a redirect answer sends the client: its ``Location`` (latin-1 on the wire,
    UTF-8 meant), against the answer's URL."""
    location = resp.headers["location"].encode("latin1").decode("utf8", "replace")
    return urljoin(resp.url, location)


def _dropped(sock: socket.socket | None) -> bool:
    """Has the server closed (or written on) a kept connection while it waited?"""
    if sock is None:
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class Session:
    """Requests of one thread, connections kept alive between them (not thread-safe: one
    session per thread).

    ``tls_context``: the TLS context of HTTPS connections, called on the first one.
    ``error``: the error of a proxy setting that cannot be used.
    ``proxies``: read proxies from the environment (False: no proxy).
    ``guard(url)``: called with every redirect's target before it is followed; raises to
    refuse it."""

    def __init__(self, tls_context: Callable[[], ssl.SSLContext],
                 error: type[WeightstoreError], *, proxies: bool = True,
                 guard: Callable[[str], None] | None = None) -> None:
        self._tls_context = tls_context
        self._error = error
        self._tls: ssl.SSLContext | None = None
        self._proxies = proxies
        self._guard = guard
        self._pool: dict[tuple[str, str, int, str | None], http.client.HTTPConnection] = {}

    def close(self) -> None:
        for conn in self._pool.values():
            conn.close()
        self._pool.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tls(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = self._tls_context()
        return self._tls

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                body: Callable[[], Any] | None = None, timeout: tuple[float, float],
                redirects: bool = True) -> Response:
        """Send a request and read the answer's status and headers. ``body``: makes the
        body (bytes, or an iterable of bytes with a ``len``) for each hop that sends one.
        Redirects are followed (each hop guarded) unless ``redirects`` is False."""
        sent = dict(headers or {})
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._send(method, url, sent, body() if body is not None else None,
                              timeout)
            if not (redirects and resp.is_redirect):
                return resp
            resp.close()  # its body unread: the connection goes
            target = redirect_target(resp)
            if self._guard is not None:
                self._guard(target)
            if (resp.status_code == 303 and method != "HEAD") or (
                    resp.status_code in (301, 302) and method == "POST"):
                method, body = "GET", None
                sent = {k: v for k, v in sent.items()
                        if k.lower() not in ("content-length", "content-type")}
            if _strips_auth(url, target):
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            url = target
        raise TooManyRedirects(url)

    def _proxy(self, url: str) -> str | None:
        """The environment's proxy for ``url``, or None."""
        if not self._proxies:
            return None
        import urllib.request  # only where a proxy may apply

        env = urllib.request.getproxies_environment()
        parts = urlsplit(url)
        host = parts.hostname or ""
        if not env or urllib.request.proxy_bypass_environment(host, env):
            return None
        proxy = env.get(parts.scheme) or env.get("all")
        if proxy and "://" not in proxy:
            proxy = "http://" + proxy
        return proxy or None

    def _connection(self, url: str, timeout: tuple[float, float],
                    ) -> tuple[http.client.HTTPConnection, str | None]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectError(f"not an http(s) URL: {url[:200]}")
        proxy = self._proxy(url)
        key = (parts.scheme, parts.hostname, _port(parts), proxy)
        conn = self._pool.get(key)
        if conn is not None and conn.sock is not None and _dropped(conn.sock):
            conn.close()
        if conn is None:
            conn = self._new_connection(parts, proxy)
            self._pool[key] = conn
        conn.timeout = timeout[0]
        conn.read_timeout = timeout[1]  # type: ignore[attr-defined]
        if conn.sock is not None:
            conn.sock.settimeout(timeout[1])
        return conn, proxy

    def _new_connection(self, parts: Any, proxy: str | None) -> http.client.HTTPConnection:
        host, port = parts.hostname, _port(parts)
        if proxy is None:
            if parts.scheme == "https":
                return _TLSConnection(host, port, context=self.tls())
            return _Connection(host, port)
        p = urlsplit(proxy)
        if p.scheme != "http" or not p.hostname:
            raise self._error("only an http:// proxy is supported (HTTPS_PROXY, HTTP_PROXY, "
                              "ALL_PROXY)", proxy=_shown(proxy))
        if parts.scheme == "http":
            return _Connection(p.hostname, _port(p))
        conn = _TLSConnection(p.hostname, _port(p), context=self.tls())
        conn.set_tunnel(host, port, headers=_proxy_auth(p))
        return conn

    def _send(self, method: str, url: str, headers: dict[str, str], data: Any,
              timeout: tuple[float, float]) -> Response:
        for fresh in (False, True):
            conn, proxy = self._connection(url, timeout)
            reused = conn.sock is not None
            if not reused:
                try:
                    conn.connect()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    raise ConnectError(f"no connection: {type(exc).__name__}",
                                       exc) from None
            send = {"User-Agent": USER_AGENT, **headers}
            target = urlsplit(url)
            path = (target.path or "/") + (f"?{target.query}" if target.query else "")
            if proxy is not None and target.scheme == "http":  # an absolute URL to the proxy
                path = f"http://{target.netloc}{path}"
                send = {"Host": target.netloc, **_proxy_auth(urlsplit(proxy)), **send}
            if data is not None and not isinstance(data, (bytes, bytearray)) \
                    and not any(k.lower() == "content-length" for k in send):
                send["Content-Length"] = str(len(data))
            try:
                conn.request(method, path, body=data, headers=send)
                raw = conn.getresponse()
            except BaseException as exc:  # the body's own error too: half sent, closed
                conn.close()
                if not isinstance(exc, (OSError, http.client.HTTPException)):
                    raise
                stale = isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                         ConnectionResetError))
                if reused and stale and not fresh and not _iterated(data):
                    continue  # a kept connection the server had closed: once more, new
                if isinstance(exc, ssl.SSLError):  # TLS 1.3: the server's alert comes
                    raise ConnectError("TLS refused", exc) from None  # after our Finished
                raise Broken(f"the request broke off: {type(exc).__name__}", exc) from None

            def release(reusable: bool, conn: http.client.HTTPConnection = conn) -> None:
                if not reusable:
                    conn.close()

            return Response(raw, url, release)
        raise AssertionError("unreachable")


def _iterated(data: Any) -> bool:
    """Was ``data`` a one-shot iterable (it cannot be sent again)?"""
    return data is not None and not isinstance(data, (bytes, bytearray)) \
        and iter(data) is data


def _proxy_auth(proxy: Any) -> dict[str, str]:
    """``Proxy-Authorization`` for a proxy URL with ``user:password@``."""
    if proxy.username is None:
        return {}
    raw = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return {"Proxy-Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}


def _shown(proxy: str) -> str:
    """A proxy URL without its password."""
    p = urlsplit(proxy)
    return f"{p.scheme}://{p.hostname}:{_port(p)}"

