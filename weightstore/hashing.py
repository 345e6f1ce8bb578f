"""Streaming digests. Keys are written ``"<algo>:<full lowercase hex>"`` everywhere.

Both algorithms release the GIL on large inputs (blake3 always, hashlib above 2 KiB), so
hashing on a thread pool runs in parallel.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from typing import Literal, Protocol

import blake3

from .errors import IntegrityError

Algorithm = Literal["blake3", "sha256"]
ALGORITHMS: tuple[str, ...] = ("blake3", "sha256")
HEX_LENGTH = {"blake3": 64, "sha256": 64}
WINDOW = 16 << 20  # per hashing thread: bounds resident memory at jobs x WINDOW


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(algo: str, threads: bool = True) -> Hasher:
    """``threads=False`` where other threads already keep the CPUs busy (compression)."""
    if algo == "blake3":
        return blake3.blake3(max_threads=blake3.blake3.AUTO if threads else 1)
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
    """Hex digest of ``length`` bytes of ``path`` starting at ``offset`` (to EOF if None)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        if length is None:
            length = os.fstat(fd).st_size - offset
        return digest_fd(algo, fd, offset, length, name=os.fspath(path))
    finally:
        os.close(fd)


def digest_fd(algo: str, fd: int, offset: int, length: int, *, name: str = "") -> str:
    """Hex digest of a byte range of an open file.

    The range is mapped one window at a time and each window unmapped before the next:
    hashing reads straight from the page cache (no copy into Python), and the process's
    resident memory stays at one window whatever the range's size.
    """
    if offset < 0 or length < 0 or offset + length > os.fstat(fd).st_size:
        raise IntegrityError("file is shorter than the range being hashed", path=name,
                             offset=offset, length=length)
    h = new_hasher(algo)
    pos, end = offset, offset + length
    while pos < end:
        start = pos - pos % mmap.ALLOCATIONGRANULARITY
        size = min(WINDOW, end - start)
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ, offset=start) as window:
            view = memoryview(window)
            try:
                h.update(view[pos - start:])
            finally:
                view.release()
        pos = start + size
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
