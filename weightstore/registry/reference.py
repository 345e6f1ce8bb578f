"""Image references (``host[:port]/repo/path[:tag][@sha256:<hex>]``) and the URLs they name.

Pure: no network. The registry host is always explicit (no Docker Hub default): a
reference without a host part is refused rather than silently sent somewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from ..errors import RegistryError
from ..io.net import loopback_name

# the distribution spec's grammar
_REPO = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)"
                   r"[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # an OCI sha256 digest, lowercase hex
_HOST = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?")


@dataclass(frozen=True)
class Reference:
    """One artifact in one repository of one registry, by tag and/or digest."""

    host: str  # with its port, as written
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = f"{self.host}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def target(self) -> str:
        """What a manifest request names: the digest when known, else the tag."""
        return self.digest or self.tag or "latest"

    def with_repository(self, repository: str) -> Reference:
        return Reference(self.host, repository)


def parse_reference(text: str) -> Reference:
    """Parse ``host[:port]/repo[:tag][@digest]``; a reference without a tag gets
    ``latest`` (as docker and oras do)."""
    if not isinstance(text, str) or "/" not in text:
        raise RegistryError("a reference needs a registry host and a repository "
                            "(host[:port]/repo[:tag])", reference=text)
    host, rest = text.split("/", 1)
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST.fullmatch(digest):
            raise RegistryError("a reference digest must be sha256:<64 hex>", reference=text)
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise RegistryError("invalid tag", reference=text, tag=tag)
    if not _HOST.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise RegistryError("the first part of a reference must be a registry host "
                            "(with a dot or a port, or localhost)", reference=text)
    if not _REPO.fullmatch(rest) or len(rest) > 255:
        raise RegistryError("invalid repository name (lowercase letters, digits and "
                            "separators)", reference=text, repository=rest)
    if tag is None and digest is None:
        tag = "latest"
    return Reference(host=host, repository=rest, tag=tag, digest=digest)


def hostname(host: str) -> str:
    """The host without its port (and without IPv6 brackets)."""
    if host.startswith("["):
        return host[1:host.index("]")]
    return host.rsplit(":", 1)[0] if ":" in host else host


def is_loopback(host: str) -> bool:
    return loopback_name(hostname(host))


def scheme_for(host: str, insecure: bool) -> str:
    """TLS always (loopback registries too: the client falls back to plain HTTP for one
    that speaks it), except when the user says ``--insecure``: then plain HTTP."""
    return "http" if insecure else "https"


def base_url(host: str, insecure: bool = False) -> str:
    return f"{scheme_for(host, insecure)}://{host}/v2/"


def blob_url(ref: Reference, digest: str, insecure: bool = False) -> str:
    return f"{base_url(ref.host, insecure)}{ref.repository}/blobs/{digest}"


def manifest_url(ref: Reference, target: str, insecure: bool = False) -> str:
    return f"{base_url(ref.host, insecure)}{ref.repository}/manifests/{quote(target)}"


def upload_url(ref: Reference, insecure: bool = False, *, mount: str | None = None,
               source: str | None = None) -> str:
    url = f"{base_url(ref.host, insecure)}{ref.repository}/blobs/uploads/"
    if mount is not None:
        url += "?" + urlencode({"mount": mount, "from": source})
    return url


def with_query(url: str, **params: str) -> str:
    """Add query parameters to an upload location (which may already carry some)."""
    return url + ("&" if "?" in url else "?") + urlencode(params)
