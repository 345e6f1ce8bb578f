"""File identities: what proves a file unchanged since its bytes were hashed.

A file's identity is its device, inode, size, mtime and ctime (nanoseconds). A write
through ``write(2)`` changes the ctime, which users cannot set back, and a replacement
changes the inode. Two things keep an identity while the bytes change: timestamps are
coarse (the kernel's clock tick), so two writes of the same size within one tick can leave
the same identity; and a write through a page already dirty in a shared mapping updates
no timestamp at all. As git does for its index, a file whose mtime or ctime is less than
:data:`RACY_SECONDS` old is not *settled*: facts about its bytes are not recorded against
its identity, and it is hashed again next time. Nothing guards against the second.

So identity says that a file changed, never that its bytes did not, where it matters:
the build's source-digest cache trusts it (as git and make do, to spare hashing a source
that did not change), and a resolution record's key includes it; no load trusts it for
the bytes it hands a runtime (:mod:`weightstore.load.pinned`), and the resolution record's
key digests the model files and records themselves.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

RACY_SECONDS = 2

# (device, inode, size, mtime_ns, ctime_ns)
Identity = tuple[int, int, int, int, int]


def identity_of(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_stamp(st: os.stat_result) -> tuple[int, ...]:
    """A file open for reading, as it was when parsed: a rewrite or a replacement
    changes it."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def settled(st: os.stat_result, now_ns: int | None = None) -> bool:
    """Is the file old enough for its identity to stand for its bytes?"""
    now = time.time_ns() if now_ns is None else now_ns
    return now - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_SECONDS * 10**9


def tree_identities(folder: Path) -> tuple[list[tuple[str, int, Identity]], bool]:
    """Every entry under ``folder`` (recursively, links not followed) as (path relative
    to it, file type bits, identity), sorted, and whether every one of them is settled.
    Any change below the folder (a file added, removed, rewritten or replaced) changes
    the list."""
    out: list[tuple[str, int, Identity]] = []
    all_settled = True
    now = time.time_ns()
    pending = [(folder, "")]
    while pending:
        path, prefix = pending.pop()
        with os.scandir(path) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                rel = prefix + entry.name
                out.append((rel, stat.S_IFMT(st.st_mode), identity_of(st)))
                all_settled = all_settled and settled(st, now)
                if entry.is_dir(follow_symlinks=False):
                    pending.append((Path(entry.path), rel + "/"))
    out.sort()
    return out, all_settled
