"""Upload sessions a push keeps on disk, so a push killed mid-blob resumes it.

A chunked upload is a session on the registry (``POST`` opens it, each ``PATCH`` appends,
``PUT ?digest=`` closes it); the registry keeps it for days (the CNCF registry purges
sessions after a week). While a blob is being sent in chunks, its session is recorded in
the user's cache folder, rewritten (temp + fsync + rename) after every chunk the registry
acknowledged::

    <user cache folder>/upload-sessions/          0700
        <32 hex>.json       one blob's session; name: blake3 of "host\\0repository\\0digest"
        <32 hex>.lock       held while a push sends that blob (a second push of the same
                            blob at the same time uploads on its own session instead)

A rerun asks the registry how far the recorded session got (``GET <location>``:
``204`` with ``Range: 0-<last>``) and sends only the rest. The record is a hint, never an
authority: the registry checks the whole blob's digest when the session closes, and a
session it no longer knows, one holding more bytes than the record can explain, or one
whose bytes turn out wrong, is abandoned for a fresh upload. Records live in the user's
cache rather than in the store: a location carries the registry's session token, the
store may be shared or read-only, and sessions belong to whoever holds the credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..io.files import atomic_write_bytes, parse_json, read_record_bytes
from ..store.location import user_cache_dir

FORMAT_VERSION = 1
FOLDER = "upload-sessions"
MAX_AGE = 7 * 24 * 3600  # seconds: the CNCF registry purges sessions older than this


@dataclass(frozen=True)
class UploadSession:
    """One chunked upload in progress: the registry holds ``sent`` bytes of it (or up to
    ``chunk`` more, when the process died while the next chunk was in flight)."""

    registry: str
    repository: str
    digest: str
    size: int
    location: str
    sent: int
    chunk: int
    updated: int = 0  # unix seconds
    format_version: int = FORMAT_VERSION


def folder() -> Path:
    return user_cache_dir() / FOLDER


def _name(registry: str, repository: str, digest: str) -> str:
    from ..io.digests import digest_bytes

    text = f"{registry}\0{repository}\0{digest}".encode()
    return digest_bytes("blake3", text)[:32]


def record_path(registry: str, repository: str, digest: str) -> Path:
    return folder() / f"{_name(registry, repository, digest)}.json"


def load(registry: str, repository: str, digest: str, size: int) -> UploadSession | None:
    """The recorded session of this blob, or None (none, unreadable, another format, for
    other bytes, too old: such a record is removed)."""
    path = record_path(registry, repository, digest)
    try:
        doc = parse_json(read_record_bytes(path))
        session = UploadSession(**doc)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        forget(registry, repository, digest)
        return None
    fits = (session.format_version == FORMAT_VERSION and session.registry == registry
            and session.repository == repository and session.digest == digest
            and session.size == size and 0 <= session.sent <= size and session.chunk > 0
            and urlsplit(session.location).scheme in ("http", "https")
            and time.time() - session.updated < MAX_AGE)
    if not fits:
        forget(registry, repository, digest)
        return None
    return session


def save(session: UploadSession) -> None:
    """Record the session durably. A cache folder this user cannot write only costs the
    resume."""
    target = record_path(session.registry, session.repository, session.digest)
    doc = asdict(session) | {"updated": int(time.time())}
    with contextlib.suppress(OSError):
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_bytes(target, json.dumps(doc, sort_keys=True).encode())


def forget(registry: str, repository: str, digest: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(record_path(registry, repository, digest))


@contextlib.contextmanager
def claimed(registry: str, repository: str, digest: str) -> Iterator[bool]:
    """Hold the blob's session lock if no other push holds it: True when held. A push
    that finds it busy sends the blob on a session of its own, unrecorded (two pushes
    appending to one session would break it for both)."""
    from ..errors import RegistryError
    from ..io.locks import file_lock

    path = folder() / f"{_name(registry, repository, digest)}.lock"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = file_lock(path, 0, RegistryError, "upload session", removable=True)
        lock.__enter__()
    except (OSError, RegistryError):
        yield False
        return
    try:
        yield True
    finally:
        lock.__exit__(None, None, None)


def prune() -> None:
    """Drop records older than the registry keeps sessions (a blob never pushed again)."""
    with contextlib.suppress(OSError), os.scandir(folder()) as entries:
        now = time.time()
        for entry in entries:
            if entry.name.endswith(".json"):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > MAX_AGE:
                        os.unlink(entry.path)
