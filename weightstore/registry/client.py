"""A small client over the OCI distribution spec, on :mod:`weightstore.io.http`.

Why not oras-py: it uploads a blob by reading it whole into memory for a monolithic PUT
(or by fixed chunks without resuming from the registry's offset), downloads one blob at a
time into a file it names itself, and hashes nothing while streaming; we need bodies
streamed from byte ranges of existing files, sha256 (and the store's own hash) computed
on the bytes as they arrive, uploads that resume from the offset the registry reports, and
many blobs in flight. See ``docs/explanation/registry-client.md``.

Every request goes through :meth:`RegistryClient.request`: auth challenges answered
(Basic, or Bearer tokens cached per scope), 429/5xx and dropped connections retried with
exponential backoff (``Retry-After`` honoured, capped), every failure turned into a typed
error by :func:`.responses.error_for`. Answers are read as streams and every body that is
not a blob is bounded: a manifest or token answer past :data:`MAX_DOCUMENT` is an error,
an error answer is read up to :data:`MAX_ERROR_BODY` (what it says past that is not
needed), so a server that never stops sending cannot fill the memory. One
:class:`~weightstore.io.http.Session` per thread keeps connections alive; loopback
registries ignore proxy settings. Every hop of a redirect is checked before it is
followed (TLS, plain HTTP only to a loopback host or with ``--insecure``), and a client
may be given a deadline for all its requests together (:attr:`Transport.deadline`).

TLS (:mod:`weightstore.io.tls`: the trust, a registry's ``certs.d`` CAs and client
certificate) is spoken to every registry, loopback ones included; a loopback registry
that turns out to speak plain HTTP is spoken to in plain HTTP from then on, decided once
per host and process (:func:`.scheme.decided_url`, which finds it before any trust store
is loaded). A certificate that does not verify is a
:class:`RegistryTLSError`, never retried and never a reason to fall back.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from ..errors import (
    RegistryAuthError,
    RegistryDigestError,
    RegistryError,
    RegistryTLSError,
    RegistryUnreachableError,
)
from ..io import http, tls
from ..io.files import parse_json
from ..io.net import allowed_url, hop_guard
from .auth import Challenge, Credentials, find_credentials, parse_challenge
from .kinds import ACCEPT
from .reference import (
    Reference,
    base_url,
    blob_url,
    is_loopback,
    manifest_url,
    upload_url,
    with_query,
)
from .responses import RETRYABLE, error_for
from .scheme import decided_url, plain_fallback, tls_error, tls_failure

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CHUNK = 1 << 20  # bytes per write to the socket
CHUNKED_ABOVE = 64 << 20  # blobs larger than this are sent as PATCH chunks of this size
MAX_DOCUMENT = 64 << 20  # the largest manifest, metadata blob or token answer accepted
MAX_ERROR_BODY = 64 << 10  # how much of an error answer is read
MIN_RATE = 1024  # bytes per second an answer's body must average over each --timeout window
# what breaks a transfer off mid-way (retried): the connection, a timeout, a torn body
BROKEN = http.Broken


@dataclass(frozen=True)
class Transport:
    """Network settings shared by every request of one command."""

    insecure: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    attempts: int = 5
    backoff: float = 0.25  # seconds before the first retry; doubles, capped at max_backoff
    max_backoff: float = 8.0
    chunk_size: int = CHUNKED_ABOVE
    min_rate: int = MIN_RATE  # bytes/s over each read_timeout window (see body_pieces)
    deadline: float | None = None  # seconds for every request of one client together


def past_deadline(ends: float | None, **context: Any) -> RegistryUnreachableError | None:
    """The error of a transfer whose deadline (``ends``, a :func:`time.monotonic` time)
    has passed, or None."""
    if ends is None or time.monotonic() < ends:
        return None
    return RegistryUnreachableError("registry transfer did not finish within its deadline",
                                    **context)


def timeouts(transport: Transport, ends: float | None) -> tuple[float, float]:
    """(connect, read) timeouts of a request: the transport's, never past ``ends``."""
    t = transport
    if ends is None:
        return t.connect_timeout, t.read_timeout
    left = max(0.01, ends - time.monotonic())
    return min(t.connect_timeout, left), min(t.read_timeout, left)


@dataclass(frozen=True)
class Reply:
    """An answer whose body was read (bounded): what every request but a blob's GET
    returns."""

    status_code: int
    headers: Mapping[str, str]
    url: str
    content: bytes


def body_pieces(resp: http.Response, transport: Transport, ends: float | None = None,
                **context: Any) -> Iterator[bytes]:
    """An answer's body in pieces as they arrive (one receive each, at most
    :data:`CHUNK`). A server that trickles (a byte
    now and then, never long enough apart for the read timeout) is given up on: over each
    window of ``read_timeout`` seconds the body must average ``min_rate`` bytes a second,
    else a :class:`RegistryError` (not retried) names the URL and ``context``. Past
    ``ends`` (a deadline, see :func:`past_deadline`) it stops too. Broken transfers raise
    :data:`BROKEN`."""
    window, start, got = transport.read_timeout, time.monotonic(), 0
    while True:
        data = resp.read1(CHUNK)
        if not data:
            return
        yield data
        got += len(data)
        elapsed = time.monotonic() - start
        if elapsed >= window:
            if got < transport.min_rate * elapsed:
                raise RegistryError(
                    f"registry transfer too slow: {got} bytes in {elapsed:.1f} s, fewer "
                    f"than {transport.min_rate} a second", url=resp.url, **context)
            start, got = time.monotonic(), 0
        late = past_deadline(ends, url=resp.url, **context)
        if late is not None:
            raise late


def read_body(resp: http.Response, limit: int, transport: Transport, *,
              strict: bool = True, ends: float | None = None, **context: Any) -> bytes:
    """At most ``limit`` bytes of the body (read by :func:`body_pieces`), the response
    closed after. A longer body is a :class:`RegistryError` naming ``context``
    (``strict``) or cut at ``limit``."""
    parts: list[bytes] = []
    size = 0
    with resp:
        for data in body_pieces(resp, transport, ends, **context):
            size += len(data)
            if size > limit:
                if strict:
                    raise RegistryError("registry answer too large", limit=limit,
                                        **context)
                parts.append(data[:limit - size + len(data)])
                break
            parts.append(data)
    return b"".join(parts)


class Body:
    """A request body streamed from ``opener(start)``; its length is known, so it is sent
    with ``Content-Length``, each piece as it comes (no whole-blob buffer)."""

    def __init__(self, length: int, pieces: Callable[[], Iterable[bytes]]) -> None:
        self.length = length
        self._pieces = pieces

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._pieces())


class RegistryClient:
    """Talks to one registry host; safe to share between threads."""

    def __init__(self, host: str, transport: Transport | None = None,
                 credentials: Credentials | None = None, *, push: bool = False,
                 environment: bool = True) -> None:
        """``environment``: the credentials of ``$WEIGHTSTORE_REGISTRY_USERNAME``/
        ``_PASSWORD`` may be sent to this host (the registry a command names; never a
        mirror of it, whose credentials come from the Docker config by its own host)."""
        self.host = host
        self._environment = environment
        # one scope for every request of a command: one token serves them all
        self.actions = "pull,push" if push else "pull"
        self.transport = transport or Transport()
        self._credentials = credentials
        self._credentials_looked = credentials is not None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._token_lock = threading.Lock()  # one token request at a time
        self._tokens: dict[str, str] = {}  # scope -> "Bearer <token>"
        self._basic = False  # the registry asked for Basic auth
        self.sent_bytes = 0
        self.received_bytes = 0
        self.on_blob_bytes: Callable[[int], None] | None = None  # a progress bar's advance
        deadline = self.transport.deadline
        self.ends = None if deadline is None else time.monotonic() + deadline
        # every hop of a redirect checked before it is followed, its body never read
        self._guard = hop_guard(self._refused_hop, self.transport.insecure)

    def _refused_hop(self, target: str) -> RegistryError:
        return RegistryError("registry redirects to plain http outside loopback (or to "
                             "another scheme); refused", host=self.host, location=target)

    def pieces(self, resp: http.Response, **context: Any) -> Iterator[bytes]:
        """A blob answer's body in pieces (:func:`body_pieces`), within the deadline."""
        return body_pieces(resp, self.transport, self.ends, **context)

    # -- plumbing ----------------------------------------------------------------------

    def _session(self) -> http.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = http.Session(lambda: tls.context(self.host, RegistryTLSError),
                                   RegistryError, guard=self._guard,
                                   proxies=not is_loopback(self.host))  # none for loopback
            self._local.session = session
        return session

    def credentials(self) -> Credentials | None:
        with self._lock:
            if not self._credentials_looked:
                self._credentials = find_credentials(self.host,
                                                     environment=self._environment)
                self._credentials_looked = True
            return self._credentials

    def _auth_header(self, scope: str) -> str | None:
        with self._lock:
            token = self._tokens.get(scope)
        if token is not None:
            return token
        if self._basic:
            creds = self.credentials()
            return creds.basic() if creds else None
        return None

    def request(self, method: str, url: str, *, scope: str, ok: Iterable[int],
                headers: dict[str, str] | None = None,
                body: Callable[[], Any] | None = None,
                reference: Any = None, digest: str | None = None,
                action: str | None = None, limit: int = MAX_ERROR_BODY) -> Reply:
        """One logical request: auth, retries and typed errors. ``body`` makes a fresh
        body for every attempt; the answer's body is read up to ``limit`` bytes (more is
        a :class:`RegistryError`)."""
        return self._send(method, url, scope=scope, ok=ok, headers=headers, body=body,
                          reference=reference, digest=digest, action=action, limit=limit)

    def _send(self, method: str, url: str, *, scope: str, ok: Iterable[int],
              headers: dict[str, str] | None, body: Callable[[], Any] | None,
              reference: Any, digest: str | None, action: str | None,
              limit: int | None) -> Any:
        """:meth:`request`; with ``limit`` None, the open streaming response."""
        ok = set(ok)
        t = self.transport
        auth_tries = 0
        attempt = 0
        where = {"reference": str(reference) if reference else None, "digest": digest,
                 "action": action}
        while True:
            late = past_deadline(self.ends, host=self.host, **where)
            if late is not None:
                raise late
            url = decided_url(url, self._session(), timeouts(t, self.ends))
            send = dict(headers or {})
            auth = self._auth_header(scope)
            if auth:
                send["Authorization"] = auth
            try:
                resp = self._session().request(
                    method, url, headers=send, body=body,
                    timeout=timeouts(self.transport, self.ends))
                if resp.status_code in ok and limit is None:
                    return resp
                good = resp.status_code in ok
                content = read_body(resp, limit if good and limit else MAX_ERROR_BODY, t,
                                    strict=good, ends=self.ends, host=self.host, **where)
            except http.TooManyRedirects:
                raise RegistryError("registry redirects without end", host=self.host,
                                    **where) from None
            except BROKEN as exc:
                failure = tls_failure(exc)
                if failure is not None:
                    plain = plain_fallback(url, failure, self._session(),
                                           timeouts(t, self.ends))
                    if plain is None:
                        raise tls_error(failure, host=self.host, **where) from None
                    url = plain
                    continue
                attempt += 1
                if attempt >= t.attempts:
                    raise RegistryUnreachableError(
                        "registry unreachable", host=self.host, **where,
                        detail=exc.kind) from None
                self._sleep(attempt, None)
                continue
            if good:
                return Reply(resp.status_code, resp.headers, resp.url, content)
            if resp.status_code == 401 and auth_tries < 2:
                auth_tries += 1
                if self._answer(parse_challenge(resp.headers.get("WWW-Authenticate")),
                                scope, reference, auth):
                    continue
            if resp.status_code in RETRYABLE and attempt + 1 < t.attempts:
                attempt += 1
                self._sleep(attempt, resp.headers.get("Retry-After"))
                continue
            raise error_for(resp.status_code, content, reference=reference, digest=digest,
                            action=action)

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        t = self.transport
        delay = min(t.max_backoff, t.backoff * 2 ** (attempt - 1))
        if retry_after and retry_after.isdigit():
            delay = min(t.max_backoff, max(delay, float(retry_after)))
        if self.ends is not None:  # the next attempt finds the deadline passed
            delay = max(0.0, min(delay, self.ends - time.monotonic()))
        time.sleep(delay)

    def _answer(self, challenge: Challenge | None, scope: str, reference: Any,
                sent: str | None) -> bool:
        """Prepare credentials for a 401; False when there is nothing more to try."""
        if challenge is None:
            return False
        creds = self.credentials()
        if challenge.scheme == "basic":
            if creds is None or (self._basic and sent is not None):
                return False  # no credentials, or the ones we sent were refused
            if creds.identity_token is not None:
                raise RegistryAuthError("an identity token is traded only at a token "
                                        "service; this registry asks for Basic auth",
                                        host=self.host)
            self._basic = True
            return True
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            return False
        with self._token_lock:
            with self._lock:
                if self._tokens.get(scope) not in (None, sent):
                    return True  # another thread fetched a token meanwhile
            return self._fetch_token(challenge, scope, reference, creds)

    def _fetch_token(self, challenge: Challenge, scope: str, reference: Any,
                     creds: Credentials | None) -> bool:
        """A token for ``scope`` from the challenge's realm: a GET with Basic credentials
        (or none), or, for an identity token, the OAuth2 POST
        (``grant_type=refresh_token``) as docker sends it."""
        params = {"service": challenge.params.get("service", "")}
        params["scope"] = challenge.params.get("scope", scope)
        realm = challenge.params["realm"]
        if not allowed_url(realm, self.transport.insecure):  # credentials go there
            raise RegistryAuthError("token service on plain http outside loopback (or "
                                    "another scheme); refused", realm=realm[:200])
        if creds is not None and creds.identity_token is not None:
            form = urlencode({**params, "grant_type": "refresh_token",
                              "client_id": "weightstore",
                              "refresh_token": creds.identity_token}).encode()
            # no redirect followed: a 307/308 would send the form (the token) on to its
            # target, wherever it is
            request: dict[str, Any] = {
                "method": "POST", "url": realm, "body": lambda: form, "redirects": False,
                "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
        else:
            request = {"method": "GET", "url": with_query(realm, **params),
                       "headers": {"Authorization": creds.basic()} if creds else {}}
        try:
            resp = self._session().request(**request,
                                           timeout=timeouts(self.transport, self.ends))
            status = resp.status_code
            content = read_body(resp, MAX_DOCUMENT if status == 200 else MAX_ERROR_BODY,
                                self.transport, strict=status == 200, ends=self.ends,
                                realm=realm)
        except http.TooManyRedirects:
            raise RegistryAuthError("token service redirects without end",
                                    realm=realm) from None
        except BROKEN as exc:
            failure = tls_failure(exc)
            if failure is not None:
                raise tls_error(failure, realm=realm[:200]) from None
            raise RegistryUnreachableError("token service unreachable", realm=realm) from None
        if status != 200:
            raise RegistryAuthError("authentication refused by the token service",
                                    reference=str(reference) if reference else None,
                                    status=status)
        try:
            doc = parse_json(content)
            token = doc.get("token") or doc["access_token"]
            if not isinstance(token, str):
                raise TypeError(token)
        except (ValueError, KeyError, AttributeError, TypeError):
            raise RegistryAuthError("token service answered without a token",
                                    realm=realm) from None
        with self._lock:
            self._tokens[scope] = f"Bearer {token}"
        return True

    # -- the spec's operations -----------------------------------------------------------

    def _scope(self, ref: Reference) -> str:
        return f"repository:{ref.repository}:{self.actions}"

    def ping(self) -> None:
        """``GET /v2/``: reachable, and our credentials (if asked for) accepted."""
        self.request("GET", base_url(self.host, self.transport.insecure), scope="",
                     ok={200}, action="ping")

    def has_blob(self, ref: Reference, digest: str) -> bool:
        resp = self.request("HEAD", blob_url(ref, digest, self.transport.insecure),
                            scope=self._scope(ref), ok={200, 404}, reference=ref,
                            digest=digest, action="HEAD blob")
        return resp.status_code == 200

    def start_upload(self, ref: Reference, digest: str, mount_from: str | None = None,
                     ) -> str | None:
        """Open an upload session; None when the registry mounted the blob instead."""
        url = upload_url(ref, self.transport.insecure,
                         mount=digest if mount_from else None, source=mount_from)
        resp = self.request("POST", url, scope=self._scope(ref), ok={201, 202},
                            reference=ref, digest=digest, action="start upload",
                            headers={"Content-Length": "0"})
        if resp.status_code == 201:
            return None
        return self._location(resp, ref, digest)

    def _location(self, resp: Reply, ref: Reference, digest: str) -> str:
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError("registry gave no upload location", reference=str(ref),
                                digest=digest, status=resp.status_code)
        found = urljoin(resp.url, location)
        if urlsplit(found).netloc != urlsplit(resp.url).netloc:
            # a body and our credentials go only to the registry asked
            raise RegistryError("registry gave an upload location on another host",
                                reference=str(ref), digest=digest, location=found[:200])
        return found

    def _check_stored(self, resp: Reply, ref: Reference, digest: str) -> None:
        """A registry that answers another digest than the one sent stored other bytes (or
        says so): never taken for a success."""
        answered = resp.headers.get("Docker-Content-Digest")
        if answered and answered != digest:
            raise RegistryDigestError("registry stored other bytes than the ones sent",
                                      reference=str(ref), digest=digest,
                                      answered=answered[:100])

    def upload_status(self, ref: Reference, location: str, digest: str) -> int:
        """How many bytes of an upload session the registry holds."""
        resp = self.request("GET", location, scope=self._scope(ref), ok={204},
                            reference=ref, digest=digest, action="upload status")
        return _range_end(resp.headers.get("Range"))

    def put_monolithic(self, ref: Reference, location: str, digest: str, size: int,
                       pieces: Callable[[int, int], Iterable[bytes]]) -> None:
        def body() -> Body:
            return Body(size, lambda: self._count_sent(pieces(0, size)))

        resp = self.request("PUT", with_query(location, digest=digest),
                            scope=self._scope(ref), ok={201}, body=body,
                            headers={"Content-Type": "application/octet-stream"},
                            reference=ref, digest=digest, action="upload blob")
        self._check_stored(resp, ref, digest)

    def patch_chunk(self, ref: Reference, location: str, digest: str, start: int, end: int,
                    pieces: Callable[[int, int], Iterable[bytes]]) -> str:
        """Send bytes [start, end) of a blob; returns the session's next location."""
        def body() -> Body:
            return Body(end - start, lambda: self._count_sent(pieces(start, end)))

        resp = self.request("PATCH", location, scope=self._scope(ref), ok={202},
                            body=body, reference=ref, digest=digest, action="upload chunk",
                            headers={"Content-Type": "application/octet-stream",
                                     "Content-Range": f"{start}-{end - 1}"})
        return self._location(resp, ref, digest)

    def finish_upload(self, ref: Reference, location: str, digest: str) -> None:
        resp = self.request("PUT", with_query(location, digest=digest),
                            scope=self._scope(ref), ok={201}, reference=ref, digest=digest,
                            action="finish upload", headers={"Content-Length": "0"})
        self._check_stored(resp, ref, digest)

    def _count_sent(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        for piece in pieces:
            with self._lock:
                self.sent_bytes += len(piece)
            if self.on_blob_bytes is not None:
                self.on_blob_bytes(len(piece))
            yield piece

    def open_blob(self, ref: Reference, digest: str, start: int = 0) -> http.Response:
        """A streaming GET of a blob from byte ``start`` (206) or from 0 (200)."""
        headers = {"Range": f"bytes={start}-"} if start else {}
        return self._send("GET", blob_url(ref, digest, self.transport.insecure),
                          scope=self._scope(ref), ok={200, 206}, body=None, limit=None,
                          headers=headers, reference=ref, digest=digest, action="GET blob")

    def blob_refused(self, digest: str) -> bool:
        """The bytes :meth:`open_blob` last gave this thread for ``digest`` did not
        match it: True when another source of the blob is left to try (a mirror's
        client, :mod:`.mirrors`); the registry itself has none."""
        return False

    def count_received(self, n: int) -> None:
        with self._lock:
            self.received_bytes += n
        if self.on_blob_bytes is not None:
            self.on_blob_bytes(n)

    def put_manifest(self, ref: Reference, target: str, data: bytes,
                     media_type: str = MANIFEST_TYPE) -> str:
        """PUT the manifest. ``DIGEST_INVALID`` is tried again (up to the transport's
        attempts): the digest we send is the one of our bytes, and the CNCF registry
        answers it while another push of a blob the manifest names rewrites that blob's
        link file in the repository (truncated, then written: the manifest's check reads
        it empty and finds no digest in it)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        attempt = 0
        while True:
            try:
                resp = self.request("PUT", manifest_url(ref, target, self.transport.insecure),
                                    scope=self._scope(ref), ok={201},
                                    body=lambda: data, headers={"Content-Type": media_type},
                                    reference=ref, action="PUT manifest")
                break
            except RegistryDigestError as exc:
                attempt += 1
                if (exc.context.get("code") != "DIGEST_INVALID"
                        or attempt >= self.transport.attempts):
                    raise
                self._sleep(attempt, None)
        self._check_stored(resp, ref, digest)
        with self._lock:
            self.sent_bytes += len(data)
        return resp.headers.get("Docker-Content-Digest", "")

    def get_manifest(self, ref: Reference, limit: int | None = None) -> tuple[bytes, str]:
        """The manifest's bytes and media type; one longer than ``limit`` (default
        :data:`MAX_DOCUMENT`) is a :class:`RegistryError`."""
        resp = self.request("GET", manifest_url(ref, ref.target, self.transport.insecure),
                            scope=self._scope(ref), ok={200},
                            headers={"Accept": ACCEPT}, reference=ref,
                            action="GET manifest", limit=limit or MAX_DOCUMENT)
        with self._lock:
            self.received_bytes += len(resp.content)
        return resp.content, resp.headers.get("Content-Type", "")


def _range_end(header: str | None) -> int:
    """``Range: 0-<last>`` of an upload session: the count of bytes it holds."""
    if not header or "-" not in header:
        return 0
    last = header.rsplit("-", 1)[1]
    return int(last) + 1 if last.isdigit() else 0
