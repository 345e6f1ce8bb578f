"""Which scheme a registry is spoken to in, and TLS failures as typed errors.

Every registry is spoken to in HTTPS (plain HTTP only with ``--insecure``), loopback ones
too: an SSH tunnel or port-forward to a company registry, or a local registry with TLS,
listens on loopback. As Docker does, a loopback registry that speaks plain HTTP is then
spoken to in it (:func:`plain_fallback`), found once per host and process. The TLS itself
(trust, a registry's ``certs.d`` CAs and client certificate) is
:mod:`weightstore.io.tls`'s.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from ..errors import RegistryTLSError
from ..io.net import loopback_name

# loopback hosts (host:port) found speaking plain HTTP: decided once per process
_PLAIN: set[str] = set()
_PLAIN_LOCK = threading.Lock()


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a ``requests`` failure to connect when it is one that trying
    again cannot mend (a certificate refused, an alert from the server, bytes that are no
    TLS); None for anything else, a connection dropped mid-handshake and a body broken
    off mid-transfer included (both retried)."""
    if not isinstance(exc, requests.exceptions.SSLError):
        return None
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ssl.SSLError):
            transient = (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError)
            return None if isinstance(err, transient) else err
        if isinstance(err, BaseException):
            todo += [err.__cause__, err.__context__, getattr(err, "reason", None),
                     *err.args]
    return None


def tls_error(failure: ssl.SSLError, **context: Any) -> RegistryTLSError:
    """The one-line error of a TLS failure (:func:`tls_failure`)."""
    if isinstance(failure, ssl.SSLCertVerificationError):
        return RegistryTLSError(
            f"registry certificate refused: {failure.verify_message}; trust its CA with "
            f"REQUESTS_CA_BUNDLE or SSL_CERT_FILE, or as ca.crt in its certs.d folder "
            f"(docs/registry.md, TLS)", **context)
    reason = failure.reason or str(failure)
    hint = ("; the registry wants a client certificate it trusts (client.cert and "
            "client.key in its certs.d folder)") if "CERTIFICATE" in reason else ""
    return RegistryTLSError(f"TLS with the registry failed: {reason}{hint}", **context)


def plain_fallback(url: str, failure: ssl.SSLError, session: Any,
                   timeout: tuple[float, float]) -> str | None:
    """The plain-HTTP form of ``url`` when its host is a loopback registry that speaks
    plain HTTP (as Docker falls back for loopback registries), else None. Asked only
    after a TLS failure that says the server's bytes were no TLS (:func:`tls_failure`;
    not a certificate refused, not an alert the server sent, which a TLS server does),
    and decided once per host and process: ``GET http://<host>/v2/`` must get an HTTP
    answer."""
    parts = urlsplit(url)
    if (isinstance(failure, ssl.SSLCertVerificationError) or parts.scheme != "https"
            or "ALERT" in str(failure.reason) or not loopback_name(parts.hostname or "")):
        return None
    plain = urlunsplit(("http", *parts[1:]))
    with _PLAIN_LOCK:
        if parts.netloc not in _PLAIN:
            try:
                session.get(f"http://{parts.netloc}/v2/", stream=True,
                            allow_redirects=False, timeout=timeout).close()
            except requests.RequestException:
                return None
            _PLAIN.add(parts.netloc)
    return plain


def decided_url(url: str) -> str:
    """``url`` in plain HTTP when its host was found speaking it (:func:`plain_fallback`)."""
    if _PLAIN and url.startswith("https://"):
        parts = urlsplit(url)
        if parts.netloc in _PLAIN:
            return urlunsplit(("http", *parts[1:]))
    return url
