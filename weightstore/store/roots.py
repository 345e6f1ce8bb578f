"""Roots: the packages that keep store objects alive.

Every package a build writes registers a root: package, version, layout, folder,
fingerprint and the keys its weight files were copied from. A root is live while its
folder still holds the package with that fingerprint (its ``summary.json`` says so), or
while it is pinned; gc keeps every object a live root names and drops dead roots. One
root per folder: building a folder again replaces its root.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..io.files import parse_json, read_regular
from .index import well_formed

SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class RootRecord:
    """What a build registers for one package folder."""

    package: str
    version: str
    layout: str
    folder: str  # absolute
    fingerprint: str


@dataclass(frozen=True)
class Root:
    """A registered root, with what it holds in the store."""

    id: int
    package: str
    version: str
    layout: str
    folder: str
    fingerprint: str
    created: int
    pinned: bool
    objects: int
    size: int  # bytes of the objects it names
    exclusive_bytes: int  # bytes no other root names: what removing it frees
    live: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def register(conn: sqlite3.Connection, record: RootRecord, keys: Iterable[str]) -> int:
    """Insert or replace the root of ``record.folder`` (a pin survives a rebuild)."""
    row = conn.execute("SELECT id FROM roots WHERE folder = ?", (record.folder,)).fetchone()
    now = int(time.time())
    if row is None:
        cur = conn.execute(
            "INSERT INTO roots (package, version, layout, folder, fingerprint, created) "
            "VALUES (?, ?, ?, ?, ?, ?)", (record.package, record.version, record.layout,
                                          record.folder, record.fingerprint, now))
        root = int(cur.lastrowid or 0)
    else:
        root = row[0]
        conn.execute("UPDATE roots SET package = ?, version = ?, layout = ?, fingerprint = ?, "
                     "created = ? WHERE id = ?", (record.package, record.version,
                                                  record.layout, record.fingerprint, now, root))
        conn.execute("DELETE FROM root_keys WHERE root = ?", (root,))
    conn.executemany("INSERT OR IGNORE INTO root_keys (root, key) VALUES (?, ?)",
                     ((root, key) for key in keys))
    return root


def add_keys(conn: sqlite3.Connection, folder: str, keys: Iterable[str]) -> bool:
    """Add ``keys`` to the root of ``folder`` (what its prepared weights use); False when
    the folder has no root. Building the folder again replaces them with its new keys."""
    row = conn.execute("SELECT id FROM roots WHERE folder = ?", (folder,)).fetchone()
    if row is None:
        return False
    conn.executemany("INSERT OR IGNORE INTO root_keys (root, key) VALUES (?, ?)",
                     ((row[0], key) for key in keys))
    return True


def is_registered(conn: sqlite3.Connection, folder: str, fingerprint: str) -> bool:
    row = conn.execute("SELECT fingerprint FROM roots WHERE folder = ?", (folder,)).fetchone()
    return row is not None and row[0] == fingerprint


def holds_package(folder: str, fingerprint: str) -> bool:
    """True while ``folder`` holds the package of that fingerprint."""
    try:
        summary = parse_json(read_regular(Path(folder) / SUMMARY_NAME))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("fingerprint") == fingerprint


def list_roots(conn: sqlite3.Connection, *, sizes: bool = True) -> list[Root]:
    """Every root and whether it is live; ``sizes=False`` skips the per-root byte counts
    (one pass over every root's keys), which gc does not need."""
    if not sizes:
        return [Root(id=r[0], package=r[1], version=r[2], layout=r[3], folder=r[4],
                     fingerprint=r[5], created=r[6], pinned=bool(r[7]), objects=0, size=0,
                     exclusive_bytes=0, live=bool(r[7]) or holds_package(r[4], r[5]))
                for r in conn.execute(
                    "SELECT id, package, version, layout, folder, fingerprint, created, "
                    "pinned FROM roots ORDER BY package, version, layout, folder")]
    rows = conn.execute(f"""
        SELECT r.id, r.package, r.version, r.layout, r.folder, r.fingerprint, r.created,
               r.pinned, count(o.key), coalesce(sum(o.size), 0),
               coalesce(sum(CASE WHEN (SELECT count(*) FROM root_keys other
                                        WHERE other.key = rk.key) = 1
                             THEN o.size ELSE 0 END), 0)
        FROM roots r LEFT JOIN root_keys rk ON rk.root = r.id
                     LEFT JOIN objects o ON o.key = rk.key AND {well_formed("o")}
        GROUP BY r.id ORDER BY r.package, r.version, r.layout, r.folder""").fetchall()
    return [Root(id=r[0], package=r[1], version=r[2], layout=r[3], folder=r[4],
                 fingerprint=r[5], created=r[6], pinned=bool(r[7]), objects=r[8], size=r[9],
                 exclusive_bytes=r[10], live=bool(r[7]) or holds_package(r[4], r[5]))
            for r in rows]


def find(conn: sqlite3.Connection, selector: str) -> list[int]:
    """Roots named by id, by folder, or by ``package``, ``package/version`` or
    ``package/version/layout``."""
    if selector.isdigit():
        return [r[0] for r in conn.execute("SELECT id FROM roots WHERE id = ?",
                                           (int(selector),))]
    folder = str(Path(selector).expanduser().absolute())
    ids = [r[0] for r in conn.execute("SELECT id FROM roots WHERE folder = ?", (folder,))]
    if ids:
        return ids
    parts = selector.split("/")
    if 1 <= len(parts) <= 3:
        return [r[0] for r in named(conn, parts)]
    return []


def named(conn: sqlite3.Connection, parts: Sequence[str | None],
          ) -> list[tuple[int, str, str, str, str]]:
    """``(id, package, version, layout, fingerprint)`` of the roots a name names:
    ``parts`` is ``package[, version[, layout]]``, a None part matching any."""
    names = ("package", "version", "layout")[:len(parts)]
    cols = [(c, v) for c, v in zip(names, parts, strict=True) if v is not None]
    where = " AND ".join(f"{c} = ?" for c, _ in cols) or "1"
    return conn.execute(f"SELECT id, package, version, layout, fingerprint FROM roots "
                        f"WHERE {where} ORDER BY id", [v for _, v in cols]).fetchall()


def holds_key(conn: sqlite3.Connection, root: int, key: str) -> bool:
    return conn.execute("SELECT 1 FROM root_keys WHERE root = ? AND key = ?",
                        (root, key)).fetchone() is not None


def set_pinned(conn: sqlite3.Connection, ids: Iterable[int], pinned: bool) -> None:
    conn.executemany("UPDATE roots SET pinned = ? WHERE id = ?",
                     ((int(pinned), root) for root in ids))


def remove(conn: sqlite3.Connection, ids: Iterable[int]) -> None:
    for root in ids:
        conn.execute("DELETE FROM root_keys WHERE root = ?", (root,))
        conn.execute("DELETE FROM roots WHERE id = ?", (root,))
