"""A per-user secret that authenticates cache entries kept in a shared store.

Some cached facts cannot be checked cheaply against the bytes they describe: a source
file's content digest, trusted while its ``stat`` stamp is unchanged, would take a full
read to confirm. Such entries carry a keyed blake3 MAC instead. The key is 32 random bytes
in the user's own cache folder, readable by its owner only::

    <user cache folder>/cache-key        0600, created when the first entry is signed

Entries written by another user, edited by hand, swapped, truncated or corrupted fail the
MAC and are recomputed. When the key cannot be read or created safely (wrong owner, open
permissions, read-only home), :func:`entry_mac` returns None: nothing is trusted and
nothing is written, which costs hashing time but never correctness.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

import blake3

from .location import user_cache_dir

KEY_NAME = "cache-key"
KEY_BYTES = 32


def key_path() -> Path:
    return user_cache_dir() / KEY_NAME


def entry_mac(entry: Any) -> str | None:
    """Hex MAC of a JSON-serializable value, None when no trustworthy key is available."""
    key = _key(key_path())
    if key is None:
        return None
    text = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    return blake3.blake3(text, key=key).hexdigest()


def verify_mac(entry: Any, mac: object) -> bool:
    """Does ``mac`` authenticate ``entry`` under this user's key? Checking never creates
    the key: without one, nothing was signed by this user (and a dry run writes nothing)."""
    if not os.path.lexists(key_path()):
        return False
    expected = entry_mac(entry)
    return (expected is not None and isinstance(mac, str)
            and _same(expected, mac))


def _same(expected: str, given: str) -> bool:
    """Compared through their blake3 digests, so that how long the comparison takes says
    nothing about the expected MAC (``hmac.compare_digest`` would load OpenSSL, a cost
    every cached load would pay)."""
    return blake3.blake3(expected.encode()).digest() == blake3.blake3(given.encode()).digest()


@functools.lru_cache(maxsize=4)
def _key(path: Path) -> bytes | None:
    """The key at ``path``, created if missing; None unless it is provably private."""
    key = _read_key(path)
    if key is not None:
        return key
    from ..io.files import locked_temp  # only the first use creates the key

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        # held until it is linked and removed: a sweep of the folder's dead temp files
        # (the user cache folder is the default store) never takes it meanwhile
        fd, tmp = locked_temp(path.parent, f".{KEY_NAME}.")
        try:
            os.write(fd, os.urandom(KEY_BYTES))  # mkstemp files are 0600
            os.fsync(fd)
            with contextlib.suppress(FileExistsError):  # a concurrent first use won
                os.link(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.close(fd)
    return _read_key(path)


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size != KEY_BYTES
                or st.st_mode & 0o077
                or (hasattr(os, "geteuid") and st.st_uid != os.geteuid())):
            return None
        data = os.pread(fd, KEY_BYTES + 1, 0)
        return data if len(data) == KEY_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)
