"""Leases: what a running build relies on, so that gc never takes it away.

A build opens a lease (its pid, host and process start time) and records every key in the
same transaction that tells it where the key lives; gc and compaction read the leases in
the transaction that deletes or moves rows and spare every key a live lease holds. So a
build that has decided to reuse a key never finds its bytes gone. A lease is live while
its process runs (same host: the pid exists with the same start time) or, for a lease of
another host, for :data:`FOREIGN_LEASE_SECONDS`; a killed build's lease dies with it.
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import time
from collections.abc import Iterable

FOREIGN_LEASE_SECONDS = 24 * 3600


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


def live_leases(conn: sqlite3.Connection, now: float | None = None) -> tuple[list[int], list[int]]:
    """``(live, dead)`` lease ids."""
    now = time.time() if now is None else now
    live: list[int] = []
    dead: list[int] = []
    for lease, pid, host, started, created in conn.execute(
            "SELECT id, pid, host, started, created FROM leases"):
        if host == host_name():
            alive = is_running(pid, started)
        else:
            alive = now - created < FOREIGN_LEASE_SECONDS
        (live if alive else dead).append(lease)
    return live, dead


def drop_dead(conn: sqlite3.Connection, dead: Iterable[int]) -> None:
    for lease in dead:
        close_lease(conn, lease)
