"""The one place registry answers become typed errors (the distribution spec's codes)."""

from __future__ import annotations

from typing import Any

from ..errors import (
    RegistryAuthError,
    RegistryDigestError,
    RegistryError,
    RegistryNotFoundError,
    RegistryUnreachableError,
)
from ..io.files import parse_json

_BY_CODE: dict[str, tuple[type[RegistryError], str]] = {
    "UNAUTHORIZED": (RegistryAuthError, "authentication refused"),
    "DENIED": (RegistryAuthError, "access denied"),
    "BLOB_UNKNOWN": (RegistryNotFoundError, "blob not found"),
    "MANIFEST_UNKNOWN": (RegistryNotFoundError, "manifest not found"),
    "NAME_UNKNOWN": (RegistryNotFoundError, "repository not found"),
    "BLOB_UPLOAD_UNKNOWN": (RegistryNotFoundError, "upload session not found"),
    "DIGEST_INVALID": (RegistryDigestError, "digest mismatch"),
    "SIZE_INVALID": (RegistryDigestError, "size mismatch"),
    "MANIFEST_BLOB_UNKNOWN": (RegistryError, "manifest refers to a missing blob"),
    "MANIFEST_INVALID": (RegistryError, "manifest refused as invalid"),
    "NAME_INVALID": (RegistryError, "invalid repository name"),
    "TAG_INVALID": (RegistryError, "invalid tag"),
    "BLOB_UPLOAD_INVALID": (RegistryError, "upload refused"),
    "UNSUPPORTED": (RegistryError, "operation not supported by the registry"),
    "TOOMANYREQUESTS": (RegistryUnreachableError, "too many requests"),
}

RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


def error_codes(body: bytes) -> list[tuple[str, str]]:
    """``(code, message)`` pairs of an error body; empty when it is not the spec's JSON."""
    try:
        doc = parse_json(body or b"{}")
    except ValueError:  # not JSON, not UTF-8, or nested too deep
        return []
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(errors, list):
        return []
    return [(str(e.get("code", "")), str(e.get("message", ""))) for e in errors
            if isinstance(e, dict)]


def error_for(status: int, body: bytes, *, reference: Any = None, digest: str | None = None,
              action: str | None = None) -> RegistryError:
    """The typed error for a failed answer, carrying reference, digest and status."""
    codes = error_codes(body)
    for code, message in codes:
        if code in _BY_CODE:
            cls, text = _BY_CODE[code]
            return cls(text, reference=str(reference) if reference else None, digest=digest,
                       status=status, code=code, detail=message or None, action=action)
    if status == 401:
        cls, text = RegistryAuthError, "authentication refused"
    elif status == 403:
        cls, text = RegistryAuthError, "access denied"
    elif status == 404:
        cls, text = RegistryNotFoundError, "not found"
    elif status in RETRYABLE:
        cls, text = RegistryUnreachableError, "registry unavailable"
    else:
        cls, text = RegistryError, "registry refused the request"
    code = codes[0][0] if codes else None
    return cls(text, reference=str(reference) if reference else None, digest=digest,
               status=status, code=code, action=action)
