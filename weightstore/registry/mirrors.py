"""Mirrors and pull-through caches, read from ``registries.conf`` as podman and skopeo
read them.

The file is the containers ``registries.conf`` v2 (TOML)::

    [[registry]]
    location = "registry.example.com"        # or prefix = "registry.example.com/models"
    [[registry.mirror]]
    location = "mirror.example.com:5000"     # may carry a path: "cache.example.com/proxy"
    insecure = false                         # true: plain HTTP to this mirror
    pull-from-mirror = "all"                 # or "digest-only", "tag-only"

found at ``$CONTAINERS_REGISTRIES_CONF``, else ``~/.config/containers/registries.conf``,
else ``/etc/containers/registries.conf`` (the first that exists; none is no mirror). The
``[[registry]]`` whose ``prefix`` (default: its ``location``) is the longest match of a
reference's ``host/repository`` names its mirrors; a mirror's reference is the mirror's
location with the rest of the name after the prefix. ``mirror-by-digest-only = true`` on
the registry means ``pull-from-mirror = "digest-only"`` for each of its mirrors.

Reads only (pulls and cache reads: :func:`reading_client`); a push never uses a mirror.
Trust stays with the origin: a manifest by digest is checked against that digest, wherever
it came from; a tag is resolved at the origin (a ``HEAD``) and the manifest a mirror gives
for it is taken only when its digest is the origin's; every blob is checked against the
digest its manifest names. Only when the origin does not answer does a tag mean what the
first mirror that knows it says (``docs/how-to/registry-auth-and-tls.md``, "Mirrors").
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import (
    RegistryAuthError,
    RegistryError,
    RegistryNotFoundError,
    RegistryTLSError,
    RegistryUnreachableError,
)
from ..io import http
from ..io.files import FileTooLargeError, read_regular
from .artifact import sha256_digest
from .auth import Credentials
from .client import MAX_DOCUMENT, RegistryClient, Transport
from .kinds import ACCEPT
from .reference import DIGEST, Reference, manifest_url, parse_reference

MAX_CONFIG = 1 << 20  # the largest registries.conf read
MIRROR_ATTEMPTS = 2  # tries of one request to a mirror before the next source is asked
_PULL_FROM = ("all", "digest-only", "tag-only")


@dataclass(frozen=True)
class Mirror:
    """One mirror of a registry prefix."""

    prefix: str  # the part of a reference's name it stands in for
    location: str  # host[:port][/path]
    insecure: bool = False
    pull_from: str = "all"  # "all", "digest-only" or "tag-only"

    @property
    def host(self) -> str:
        return self.location.split("/", 1)[0]

    def serves(self, ref: Reference) -> bool:
        """Is this mirror asked for a pull of ``ref`` (by digest or by tag)?"""
        return self.pull_from == "all" or (self.pull_from == "digest-only") == bool(
            ref.digest)

    def reference(self, ref: Reference) -> Reference:
        """``ref`` as this mirror names it."""
        name = f"{ref.host}/{ref.repository}"
        there = parse_reference(self.location + name[len(self.prefix):])
        return Reference(there.host, there.repository, ref.tag, ref.digest)


def config_path() -> Path | None:
    """The registries.conf a pull reads, or None."""
    given = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    if given:
        return Path(given) if Path(given).is_file() else None
    for path in (Path.home() / ".config/containers/registries.conf",
                 Path("/etc/containers/registries.conf")):
        if path.is_file():
            return path
    return None


def _toml(data: bytes, path: Path) -> dict[str, Any]:
    if _comments_only(data):  # as distributions ship the file: no parser to load
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the conditional dependency of Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"registries.conf does not parse: {exc}",
                            file=str(path)) from None


def _comments_only(data: bytes) -> bool:
    """Is ``data`` TOML's empty document: lines (LF or CRLF) that are blank (spaces and
    tabs) or a ``#`` comment of printable ASCII and tabs? Anything else, a lone CR or a
    form feed included, goes to the parser, which judges it."""
    for line in data.split(b"\n"):
        line = line.removesuffix(b"\r").lstrip(b" \t")
        if line and not (line.startswith(b"#")
                         and all(32 <= c < 127 or c == 9 for c in line)):
            return False
    return True


def read_mirrors(path: Path) -> list[Mirror]:
    """Every mirror ``path`` names, in the order written; a malformed file is a
    :class:`RegistryError` naming it."""
    def bad(why: str, **ctx: Any) -> RegistryError:
        return RegistryError(f"registries.conf: {why}", file=str(path), **ctx)

    try:
        doc = _toml(read_regular(path, limit=MAX_CONFIG), path)
    except FileTooLargeError:
        raise bad("larger than 1 MiB") from None
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    registries = doc.get("registry", [])
    if not isinstance(registries, list):
        raise bad("[[registry]] must be an array of tables")
    found = []
    for entry in registries:
        if not isinstance(entry, dict):
            raise bad("[[registry]] must be an array of tables")
        prefix = entry.get("prefix") or entry.get("location")
        if not isinstance(prefix, str) or not prefix:
            raise bad("a [[registry]] needs a location or a prefix")
        mirrors = entry.get("mirror", [])
        by_digest = entry.get("mirror-by-digest-only", False) is True
        if not isinstance(mirrors, list):
            raise bad("[[registry.mirror]] must be an array of tables", prefix=prefix)
        for m in mirrors:
            location = m.get("location") if isinstance(m, dict) else None
            if not isinstance(location, str) or not location:
                raise bad("a [[registry.mirror]] needs a location", prefix=prefix)
            try:
                parse_reference(location.rstrip("/") + "/x")
            except RegistryError:
                raise bad("a mirror's location must be host[:port][/path]",
                          mirror=location) from None
            pull_from = m.get("pull-from-mirror") or ("digest-only" if by_digest else "all")
            if pull_from not in _PULL_FROM:
                raise bad("pull-from-mirror must be all, digest-only or tag-only",
                          mirror=location, value=str(pull_from))
            found.append(Mirror(prefix.rstrip("/"), location.rstrip("/"),
                                m.get("insecure", False) is True, pull_from))
    return found


def mirrors_for(ref: Reference) -> list[Mirror]:
    """The mirrors a pull of ``ref`` tries, in order: those of the longest prefix that
    matches its name and serve its kind of pull (by digest or by tag)."""
    path = config_path()
    if path is None:
        return []
    name = f"{ref.host}/{ref.repository}"
    matching = [m for m in read_mirrors(path)
                if name == m.prefix or name.startswith(m.prefix + "/")]
    longest = max((len(m.prefix) for m in matching), default=0)
    return [m for m in matching if len(m.prefix) == longest and m.serves(ref)]


def reading_client(ref: Reference, transport: Transport | None = None,
                   credentials: Credentials | None = None) -> RegistryClient:
    """The client a read of ``ref`` (a pull, a cache read) uses: through the mirrors
    registries.conf names for it, else straight to its registry. ``credentials`` are the
    registry's; each mirror's are looked up by its own host."""
    mirrors = mirrors_for(ref)
    if not mirrors:
        return RegistryClient(ref.host, transport, credentials)
    return MirroredClient(ref.host, transport, mirrors, credentials)


class MirroredClient(RegistryClient):
    """A registry's client whose reads try its mirrors in order, then the registry (the
    origin). Blobs and manifests by digest come from the first mirror that serves them
    (checked by their digests, as every byte is); a tag is resolved at the origin. A
    mirror that does not answer is not asked again by this client; one that does not
    have a blob, or whose bytes do not match, is not asked for that blob again."""

    def __init__(self, host: str, transport: Transport | None, mirrors: list[Mirror],
                 credentials: Credentials | None = None) -> None:
        super().__init__(host, transport, credentials)
        t = self.transport
        self._mirrors = [
            (m, RegistryClient(m.host,
                               replace(t, insecure=t.insecure or m.insecure,
                                       attempts=min(t.attempts, MIRROR_ATTEMPTS)),
                               environment=False))
            for m in mirrors]
        self._skip: set[tuple[str, str | None]] = set()  # (mirror, digest or None: all)
        self._source: dict[tuple[int, str], str] = {}  # (thread, digest) -> mirror
        self._mirror_lock = threading.Lock()

    def _usable(self, digest: str | None) -> list[tuple[Mirror, RegistryClient]]:
        with self._mirror_lock:
            return [(m, c) for m, c in self._mirrors
                    if (m.location, None) not in self._skip
                    and (m.location, digest) not in self._skip]

    def _failed(self, mirror: Mirror, digest: str | None, exc: RegistryError) -> None:
        """Ask ``mirror`` no more for ``digest``, or for nothing when it did not answer."""
        whole = isinstance(exc, RegistryUnreachableError)
        with self._mirror_lock:
            self._skip.add((mirror.location, None if whole else digest))

    def open_blob(self, ref: Reference, digest: str, start: int = 0) -> http.Response:
        where = (threading.get_ident(), digest)
        for mirror, client in self._usable(digest):
            try:
                resp = client.open_blob(mirror.reference(ref), digest, start)
            except RegistryError as exc:
                self._failed(mirror, digest, exc)
                continue
            with self._mirror_lock:
                self._source[where] = mirror.location
            return resp
        with self._mirror_lock:
            self._source.pop(where, None)
        return super().open_blob(ref, digest, start)

    def blob_refused(self, digest: str) -> bool:
        with self._mirror_lock:
            location = self._source.pop((threading.get_ident(), digest), None)
            if location is not None:
                self._skip.add((location, digest))
        return location is not None

    def get_manifest(self, ref: Reference, limit: int | None = None) -> tuple[bytes, str]:
        """The manifest of ``ref``: by digest from the first mirror whose answer has that
        digest, else from the origin. A tag is resolved at the origin first; only when
        the origin does not answer is the first mirror's manifest for it taken as is."""
        digest, down = ref.digest, None
        if digest is None:  # resolved at the origin if it answers
            try:
                digest, found = self._resolve_at_origin(ref, limit)
            except RegistryTLSError:
                raise  # an origin whose certificate is refused is no origin that is down
            except RegistryUnreachableError as exc:
                down = exc
            else:
                if found is not None:
                    return found
        what = digest or f"tag {ref.target}"  # what a mirror that fails it is not asked
        for mirror, client in self._usable(what):
            try:
                data, media_type = client.get_manifest(mirror.reference(ref), limit)
            except RegistryError as exc:
                self._failed(mirror, what, exc)
                continue
            if digest is None or sha256_digest(data) == digest:
                with self._lock:
                    self.received_bytes += len(data)
                if digest is None:  # said, never silent: the tag is the mirror's word
                    print(f"weightstore: warning: the origin {self.host} did not answer "
                          f"({' '.join(str(down).split())}); tag {ref.target} is taken as "
                          f"the mirror {mirror.location} names it (its bytes checked "
                          f"against that manifest, the tag not against the origin)",
                          file=sys.stderr, flush=True)
                return data, media_type
            self._failed(mirror, what, RegistryError("manifest does not match its digest"))
        if down is not None:
            raise down
        if ref.digest is None:
            ref = Reference(ref.host, ref.repository, digest=digest)
        return super().get_manifest(ref, limit)

    def _resolve_at_origin(self, ref: Reference, limit: int | None,
                           ) -> tuple[str, tuple[bytes, str] | None]:
        """The digest the origin gives ``ref``'s tag (a ``HEAD``), and, when its answer
        names none (or it answers no ``HEAD``), the origin's manifest itself."""
        try:
            head = self.request("HEAD", manifest_url(ref, ref.target, self.transport.insecure),
                                scope=self._scope(ref), ok={200},
                                headers={"Accept": ACCEPT}, reference=ref,
                                action="HEAD manifest")
            named = head.headers.get("Docker-Content-Digest", "")
        except (RegistryUnreachableError, RegistryNotFoundError, RegistryAuthError):
            raise
        except RegistryError:  # a registry that refuses a HEAD: its GET says
            named = ""
        if DIGEST.fullmatch(named):
            return named, None
        found = super().get_manifest(ref, limit or MAX_DOCUMENT)
        return sha256_digest(found[0]), found
