"""Which scheme a registry is spoken to in, and TLS failures as typed errors.

Every registry is spoken to in HTTPS (plain HTTP only with ``--insecure``), loopback ones
too: an SSH tunnel or port-forward to a company registry, or a local registry with TLS,
listens on loopback. As Docker does, a loopback registry that speaks plain HTTP is then
spoken to in it, found once per host and process (:func:`decided_url`), before any trust
store is loaded: loading the system's costs tens of milliseconds, more than a small pull
from a local registry takes. The TLS itself (trust, a registry's ``certs.d`` CAs and
client certificate) is :mod:`weightstore.io.tls`'s.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import RegistryTLSError
from ..io.http import Broken, ConnectError
from ..io.net import loopback_name

# loopback hosts (host:port) found speaking plain HTTP, and TLS: decided once per process
_PLAIN: set[str] = set()
_TLS: set[str] = set()
_PLAIN_LOCK = threading.Lock()


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a failure to connect (:class:`~weightstore.io.http.
    ConnectError`) when it is one that trying again cannot mend (a certificate refused,
    an alert from the server, bytes that are no TLS); None for anything else, a
    connection dropped mid-handshake and a body broken off mid-transfer included (both
    retried)."""
    if not isinstance(exc, ConnectError):
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
            f"(docs/how-to/registry-auth-and-tls.md, TLS)", **context)
    reason = failure.reason or str(failure)
    hint = ("; the registry wants a client certificate it trusts (client.cert and "
            "client.key in its certs.d folder)") if "CERTIFICATE" in reason else ""
    return RegistryTLSError(f"TLS with the registry failed: {reason}{hint}", **context)


def _no_tls(failure: ssl.SSLError) -> bool:
    """Does a handshake's failure say the server's bytes were no TLS (not a certificate
    refused, not an alert the server sent, which a TLS server does)?"""
    return not (isinstance(failure, ssl.SSLCertVerificationError)
                or "ALERT" in str(failure.reason))


def plain_fallback(url: str, failure: ssl.SSLError, session: Any,
                   timeout: tuple[float, float]) -> str | None:
    """The plain-HTTP form of ``url`` when its host is a loopback registry that speaks
    plain HTTP (as Docker falls back for loopback registries), else None. Asked only
    after a TLS failure that says the server's bytes were no TLS (:func:`tls_failure`),
    and decided once per host and process: ``GET http://<host>/v2/`` must get an HTTP
    answer."""
    parts = urlsplit(url)
    if (parts.scheme != "https" or not _no_tls(failure)
            or not loopback_name(parts.hostname or "")):
        return None
    with _PLAIN_LOCK:
        if parts.netloc not in _PLAIN and not _answers_plain(parts.netloc, session, timeout):
            return None
        _PLAIN.add(parts.netloc)
    return urlunsplit(("http", *parts[1:]))


def _answers_plain(netloc: str, session: Any, timeout: tuple[float, float]) -> bool:
    try:
        session.request("GET", f"http://{netloc}/v2/", timeout=timeout,
                        redirects=False).close()
    except Broken:
        return False
    return True


def _probe(netloc: str, session: Any, timeout: tuple[float, float]) -> None:
    """Find whether the loopback registry at ``netloc`` speaks TLS, with a handshake that
    verifies nothing (and so loads no trust store): it only tells TLS from plain HTTP,
    and the requests that follow verify the certificate as always. A server whose bytes
    are no TLS and that answers ``GET /v2/`` in plain HTTP is spoken to in it; a server
    that does not answer stays undecided (its requests say what is wrong)."""
    parts = urlsplit(f"//{netloc}")
    host = parts.hostname or ""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    try:
        with (socket.create_connection((host, parts.port or 443), timeout[0]) as sock,
              probe.wrap_socket(sock, server_hostname=host)):
            pass
    except (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError):
        return  # dropped mid-handshake: undecided
    except ssl.SSLError as failure:
        if not _no_tls(failure):
            _TLS.add(netloc)
        elif _answers_plain(netloc, session, timeout):
            _PLAIN.add(netloc)
        return
    except OSError:
        return
    _TLS.add(netloc)


def decided_url(url: str, session: Any = None,
                timeout: tuple[float, float] = (10.0, 10.0)) -> str:
    """``url`` in plain HTTP when its host is a loopback registry found speaking it. With
    ``session``, an HTTPS URL to a loopback registry not yet decided is decided first
    (:func:`_probe`, once per host and process)."""
    if not url.startswith("https://"):
        return url
    parts = urlsplit(url)
    if parts.netloc not in _PLAIN and parts.netloc not in _TLS and session is not None \
            and loopback_name(parts.hostname or ""):
        with _PLAIN_LOCK:
            if parts.netloc not in _PLAIN and parts.netloc not in _TLS:
                _probe(parts.netloc, session, timeout)
    if parts.netloc in _PLAIN:
        return urlunsplit(("http", *parts[1:]))
    return url


def forget(netloc: str) -> None:
    """Decide ``netloc``'s scheme again (a new server on a port an earlier one had)."""
    with _PLAIN_LOCK:
        _PLAIN.discard(netloc)
        _TLS.discard(netloc)
