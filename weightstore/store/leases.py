"""Leases: what a running build relies on, so that gc never takes it away.

A build opens a lease (its pid, host and process start time) and records every key in the
same transaction that tells it where the key lives; gc and compaction read the leases in
the transaction that deletes or moves rows and spare every key a live lease holds. So a
build that has decided to reuse a key never finds its bytes gone. A lease is live while
its process runs (same host: the pid exists with the same start time) or, for a lease of
another host, for :data:`FOREIGN_LEASE_SECONDS`; a killed build's lease dies with it.

A lease row that cannot be what :func:`open_lease` writes (see :func:`lease_damage`) is
damage: neither live nor dead, it is never believed (no pid of it is signalled); gc keeps
the keys it holds, and repair drops it with its keys.
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import time
from collections.abc import Iterable

from .index import malformed_key_rows, shown

FOREIGN_LEASE_SECONDS = 24 * 3600
MAX_PID = 2**31 - 1  # pid_t
COLUMNS = "id, pid, host, started, created"


@functools.cache
def host_name() -> str:
    return socket.gethostname()


def process_start(pid: int) -> str:
    """A token that differs between two processes that had the same pid: the start time in
    clock ticks since boot on Linux, "" where the system does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else ""


def is_running(pid: int, started: str) -> bool:
    """True while ``pid`` runs on this host and is the process that took the lease."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    return not started or process_start(pid) in ("", started)


def open_lease(conn: sqlite3.Connection) -> int:
    pid = os.getpid()
    cur = conn.execute("INSERT INTO leases (pid, host, started, created) VALUES (?, ?, ?, ?)",
                       (pid, host_name(), process_start(pid), int(time.time())))
    return int(cur.lastrowid or 0)


def hold(conn: sqlite3.Connection, lease: int, keys: Iterable[str]) -> None:
    conn.executemany("INSERT OR IGNORE INTO lease_keys (lease, key) VALUES (?, ?)",
                     ((lease, key) for key in keys))


def close_lease(conn: sqlite3.Connection, lease: int) -> None:
    conn.execute("DELETE FROM lease_keys WHERE lease = ?", (lease,))
    conn.execute("DELETE FROM leases WHERE id = ?", (lease,))


def lease_damage(row: tuple, now: float) -> str | None:
    """What makes a ``leases`` row (:data:`COLUMNS`) damage, None for a sound one: a pid
    that is no process id (an integer in [1, 2**31)), a host that is not text (not empty,
    no NUL), a start token that is not text, a created that is not an integer or lies
    more than :data:`FOREIGN_LEASE_SECONDS` ahead of ``now`` (a lease of another host
    would otherwise live for ever)."""
    lease, pid, host, started, created = row
    if type(lease) is not int:
        return f"id is not an integer ({shown(lease)})"
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        return f"pid is not a process id ({shown(pid)})"
    if type(host) is not str or host == "" or "\x00" in host:
        return f"host is not text ({shown(host)})"
    if type(started) is not str or "\x00" in started:
        return f"started is not text ({shown(started)})"
    if type(created) is not int:
        return f"created is not an integer ({shown(created)})"
    if created > now + FOREIGN_LEASE_SECONDS:
        return f"created lies in the future ({created})"
    return None


def malformed_leases(conn: sqlite3.Connection, now: float | None = None,
                     ) -> list[tuple[int, str]]:
    """``(id, what is wrong)`` of every damaged lease."""
    now = time.time() if now is None else now
    return [(row[0], damage) for row in conn.execute(f"SELECT {COLUMNS} FROM leases")
            if (damage := lease_damage(row, now)) is not None]


def malformed_lease_keys(conn: sqlite3.Connection) -> list[tuple[object, object, str]]:
    """``(lease, key, what is wrong)`` of every damaged ``lease_keys`` row: a lease that is
    no integer or names no lease, a key that is no digest key."""
    return malformed_key_rows(conn, "lease_keys", "lease", "leases")


def live_leases(conn: sqlite3.Connection, now: float | None = None) -> tuple[list[int], list[int]]:
    """``(live, dead)`` ids of the sound leases (a damaged one is neither)."""
    now = time.time() if now is None else now
    live: list[int] = []
    dead: list[int] = []
    for row in conn.execute(f"SELECT {COLUMNS} FROM leases"):
        if lease_damage(row, now) is not None:
            continue
        lease, pid, host, started, created = row
        if host == host_name():
            alive = is_running(pid, started)
        else:
            alive = now - created < FOREIGN_LEASE_SECONDS
        (live if alive else dead).append(lease)
    return live, dead


def drop_dead(conn: sqlite3.Connection, dead: Iterable[int]) -> None:
    for lease in dead:
        close_lease(conn, lease)
