"""What the store remembers for registries, in two tables of its index.

``sha256_signed(key, sha256, mac)``: a blake3-keyed store computes each payload's sha256
(the registry's digest) once, while reading the bytes, and never again. A push that
believes a wrong mapping would skip the upload (the registry already holds the blob it
names) or mount it, and publish an artifact whose layer holds other bytes. So a pair is
remembered only when this process computed both digests over the same bytes (a push
reading a payload, a pull downloading one), never from what a manifest claims; and as the
index sits in a store a group may share, each row carries a MAC under the user's own key
(:mod:`weightstore.store.mac`) over the pair and that proof, so a row that fails it
(written by another user, edited, swapped, or by a version that also remembered the
digests a manifest named) is computed again from the bytes. ``blob_repos(host, digest,
repository)``: the repositories a blob was pushed to or pulled from, so a push to another
repository of the same registry mounts it instead of uploading it; a stale row only costs
a failed mount, since a mount names the digest the push computed. Tables are created on
first use; readers of stores without them see nothing remembered.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable

from ..errors import StoreError
from ..store import WeightStore
from ..store.index import batched, marks
from ..store.mac import entry_mac, verify_mac

HASHED = "hashed-together"
_TABLES = (
    "CREATE TABLE IF NOT EXISTS sha256_signed ("
    "key TEXT PRIMARY KEY, sha256 TEXT NOT NULL, mac TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS blob_repos ("
    "host TEXT NOT NULL, digest TEXT NOT NULL, repository TEXT NOT NULL, "
    "PRIMARY KEY (host, digest, repository)) WITHOUT ROWID",
)


def known_sha256(store: WeightStore, keys: Iterable[str]) -> dict[str, str]:
    """The remembered sha256 digest (``sha256:<hex>``) of each key that has one whose MAC
    holds; every other key is left out (its caller hashes the bytes)."""
    out: dict[str, str] = {}
    keys = list(keys)
    if not keys or not store.index.exists():
        return out
    with store.index.reading() as conn:
        if not _has_table(conn, "sha256_signed"):
            return out
        for chunk in batched(keys):
            for key, sha256, mac in conn.execute(
                    f"SELECT key, sha256, mac FROM sha256_signed WHERE key IN ({marks(chunk)})",
                    chunk):
                # a value of another type (sqlite keeps whatever was written) is no digest
                if isinstance(sha256, str) and verify_mac(_signed(key, sha256), mac):
                    out[key] = sha256
    return out


def _signed(key: str, sha256: str) -> dict[str, str]:
    """What a row's MAC covers: moving a digest to another key breaks it. ``proof`` says
    both digests were computed over the same bytes; rows signed without it (versions that
    also remembered what a pull's manifest claimed for payloads it never downloaded) no
    longer verify, so they are computed again."""
    return {"key": key, "sha256": sha256, "proof": HASHED}


def repositories(store: WeightStore, host: str, digests: Iterable[str]) -> dict[str, list[str]]:
    """For each digest, the repositories of ``host`` known to hold it (sorted)."""
    out: dict[str, list[str]] = {}
    digests = list(digests)
    if not digests or not store.index.exists():
        return out
    with store.index.reading() as conn:
        if not _has_table(conn, "blob_repos"):
            return out
        for chunk in batched(digests):
            for digest, repo in conn.execute(
                    f"SELECT digest, repository FROM blob_repos WHERE host = ? AND digest IN "
                    f"({marks(chunk)}) ORDER BY repository", [host, *chunk]):
                if isinstance(repo, str):
                    out.setdefault(digest, []).append(repo)
    return out


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    """Stores written before a first push or pull lack the tables (and the in-memory
    snapshot of a format 1 store never has them)."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


def remember(store: WeightStore, *, sha256: dict[str, str] | None = None,
             host: str | None = None, repository: str | None = None,
             digests: Iterable[str] = ()) -> None:
    """Record sha256 digests of keys and/or that ``repository`` holds ``digests``. Every
    pair in ``sha256`` must have been computed by this process over the same bytes as its
    key. A store this user cannot write just does not remember."""
    rows = [(key, digest, mac) for key, digest in sorted((sha256 or {}).items())
            if (mac := entry_mac(_signed(key, digest))) is not None]
    repo_rows = sorted({(host, d, repository) for d in digests}) if host and repository else []
    if not rows and not repo_rows:
        return
    store._make_root()
    if not store.writable():
        return
    # a cache: a pair a power cut loses is computed again by the next pull that needs it
    with contextlib.suppress(StoreError), store.index.writing(durable=False) as conn:
        for statement in _TABLES:
            conn.execute(statement)
        conn.executemany("INSERT OR REPLACE INTO sha256_signed (key, sha256, mac) "
                         "VALUES (?, ?, ?)", rows)
        conn.executemany("INSERT OR IGNORE INTO blob_repos (host, digest, repository) "
                         "VALUES (?, ?, ?)", repo_rows)
