"""Roots: the packages that keep store objects alive.

Every package a build writes registers a root: package, version, layout, folder,
fingerprint and the keys its weight files were copied from. A root is live while its
folder still holds the package with that fingerprint (its ``summary.json`` says so), or
while it is pinned; gc keeps every object a live root names and drops dead roots. One
root per folder: building a folder again replaces its root.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..io.files import parse_json, read_regular
from .index import malformed_key_rows, shown, well_formed
from .objects import MAX_INT

SUMMARY_NAME = "summary.json"
COLUMNS = "id, package, version, layout, folder, fingerprint, created, pinned"


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


def _text(value: object) -> bool:
    return type(value) is str and value != "" and "\x00" not in value


def root_damage(row: tuple) -> tuple[str, bool] | None:
    """What makes a ``roots`` row (:data:`COLUMNS`) damage, and whether repair can keep
    it; None for a sound row. SQLite keeps whatever type a value was written with, so no
    root is believed before it is checked here: its package, version, layout and
    fingerprint must be text (not empty, no NUL), its folder an absolute path; a root
    whose only fault is its ``created`` (not an integer) or ``pinned`` (neither 0 nor 1)
    is kept by repair, which resets them (to now, and to pinned: its objects stay)."""
    rid, package, version, layout, folder, fingerprint, created, pinned = row
    if type(rid) is not int:
        return f"id is not an integer ({shown(rid)})", False
    for name, value in (("package", package), ("version", version), ("layout", layout),
                        ("fingerprint", fingerprint)):
        if not _text(value):
            return f"{name} is not text ({shown(value)})", False
    if not _text(folder) or not os.path.isabs(folder):
        return f"folder is not an absolute path ({shown(folder)})", False
    if type(created) is not int:
        return f"created is not an integer ({shown(created)})", True
    if type(pinned) is not int or pinned not in (0, 1):
        return f"pinned is neither 0 nor 1 ({shown(pinned)})", True
    return None


def malformed_roots(conn: sqlite3.Connection) -> list[tuple[int, str, bool]]:
    """``(id, what is wrong, whether repair keeps it)`` of every damaged ``roots`` row.
    No reader lists such a root (``store ls``, a store reference, a name), and gc keeps
    every object it names, until repair drops it (or resets what it can)."""
    found = []
    for row in conn.execute(f"SELECT {COLUMNS} FROM roots ORDER BY id"):
        damage = root_damage(row)
        if damage is not None:
            found.append((row[0], *damage))
    return found


def malformed_root_keys(conn: sqlite3.Connection) -> list[tuple[object, object, str]]:
    """``(root, key, what is wrong)`` of every damaged ``root_keys`` row: a root that is
    no integer or names no root, a key that is no digest key. Repair drops them; gc
    keeps the objects of their keys until then."""
    return malformed_key_rows(conn, "root_keys", "root", "roots")


# SQL for a root's pin as repair and a rebuild of its folder leave it: a damaged pin
# counts as a pin (its objects stay; ``store unpin`` undoes it)
KEPT_PIN = "CASE WHEN typeof(pinned) = 'integer' AND pinned IN (0, 1) THEN pinned ELSE 1 END"


def register(conn: sqlite3.Connection, record: RootRecord, keys: Iterable[str]) -> int:
    """Insert or replace the root of ``record.folder`` (a pin survives a rebuild; so does
    a damaged one, as a pin: the rebuild leaves a sound root)."""
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
        conn.execute(f"UPDATE roots SET package = ?, version = ?, layout = ?, fingerprint = ?, "
                     f"created = ?, pinned = {KEPT_PIN} WHERE id = ?",
                     (record.package, record.version, record.layout, record.fingerprint, now,
                      root))
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
    """Every sound root and whether it is live (a damaged one is left out: see
    :func:`malformed_roots`); ``sizes=False`` skips the per-root byte counts (one pass
    over every root's keys), which gc does not need. Byte counts are ``total()``'s, which
    no sum of damaged sizes overflows (exact up to 2**53 bytes)."""
    if not sizes:
        rows = conn.execute(f"SELECT {COLUMNS}, 0, 0, 0 FROM roots "
                            f"ORDER BY package, version, layout, folder").fetchall()
    else:
        rows = conn.execute(f"""
            SELECT r.id, r.package, r.version, r.layout, r.folder, r.fingerprint, r.created,
                   r.pinned, count(o.key), total(o.size),
                   total(CASE WHEN (SELECT count(*) FROM root_keys other
                                     WHERE other.key = rk.key) = 1
                         THEN o.size ELSE 0 END)
            FROM roots r LEFT JOIN root_keys rk ON rk.root = r.id
                         LEFT JOIN objects o ON o.key = rk.key AND {well_formed("o")}
            GROUP BY r.id ORDER BY r.package, r.version, r.layout, r.folder""").fetchall()
    return [Root(id=r[0], package=r[1], version=r[2], layout=r[3], folder=r[4],
                 fingerprint=r[5], created=r[6], pinned=bool(r[7]), objects=r[8],
                 size=_count(r[9]), exclusive_bytes=_count(r[10]),
                 live=bool(r[7]) or holds_package(r[4], r[5]))
            for r in rows if root_damage(r[:8]) is None]


def _count(total: float) -> int:
    return min(int(total), MAX_INT)


def find(conn: sqlite3.Connection, selector: str) -> list[int]:
    """Roots named by id, by folder, or by ``package``, ``package/version`` or
    ``package/version/layout``."""
    if selector.isascii() and selector.isdigit():
        number = int(selector)
        return [r[0] for r in conn.execute("SELECT id FROM roots WHERE id = ?", (number,))
                ] if number <= MAX_INT else []
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
    """``(id, package, version, layout, fingerprint)`` of the sound roots a name names:
    ``parts`` is ``package[, version[, layout]]``, a None part matching any."""
    names = ("package", "version", "layout")[:len(parts)]
    cols = [(c, v) for c, v in zip(names, parts, strict=True) if v is not None]
    where = " AND ".join(f"{c} = ?" for c, _ in cols) or "1"
    return [(r[0], r[1], r[2], r[3], r[5]) for r in conn.execute(
        f"SELECT {COLUMNS} FROM roots WHERE {where} ORDER BY id", [v for _, v in cols])
        if root_damage(r) is None]


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
