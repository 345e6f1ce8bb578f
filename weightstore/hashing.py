"""Streaming digests. Keys are written ``"<algo>:<full lowercase hex>"`` everywhere.

Both algorithms release the GIL on large inputs (blake3 always, hashlib above 2 KiB), so
hashing on a thread pool runs in parallel.
"""

from __future__ import annotations

import hashlib
import os
from typing import Literal, Protocol

import blake3

from .errors import IntegrityError

Algorithm = Literal["blake3", "sha256"]
ALGORITHMS: tuple[str, ...] = ("blake3", "sha256")
HEX_LENGTH = {"blake3": 64, "sha256": 64}
CHUNK = 16 << 20


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(algo: str) -> Hasher:
    if algo == "blake3":
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}")


def digest_bytes(algo: str, data: bytes | bytearray | memoryview) -> str:
    """Full lowercase hex digest of ``data``."""
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def digest_file(algo: str, path: str | os.PathLike[str], offset: int = 0,
                length: int | None = None) -> str:
    """Hex digest of ``length`` bytes of ``path`` starting at ``offset`` (to EOF if None).

    Reads into one reusable buffer: memory stays at one chunk whatever the range's size,
    and the page cache (not this process) holds the file.
    """
    h = new_hasher(algo)
    with open(path, "rb", buffering=0) as f:
        if length is None:
            length = os.fstat(f.fileno()).st_size - offset
        f.seek(offset)
        buf = bytearray(min(CHUNK, max(length, 1)))
        view = memoryview(buf)
        remaining = length
        while remaining > 0:
            n = f.readinto(view[:min(len(buf), remaining)])
            if not n:
                raise IntegrityError("file is shorter than the range being hashed",
                                     path=os.fspath(path), offset=offset, length=length)
            h.update(view[:n])
            remaining -= n
    return h.hexdigest()


def make_key(algo: str, hex_digest: str) -> str:
    return f"{algo}:{hex_digest}"


def split_key(key: str) -> tuple[str, str]:
    """``"blake3:ab.."`` -> ``("blake3", "ab..")``, validating algorithm and hex form."""
    algo, sep, hex_digest = key.partition(":")
    if (not sep or algo not in ALGORITHMS or len(hex_digest) != HEX_LENGTH[algo]
            or any(c not in "0123456789abcdef" for c in hex_digest)):
        raise IntegrityError("malformed digest key", key=key)
    return algo, hex_digest
