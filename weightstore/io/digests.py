"""Streaming digests. Keys are written ``"<algo>:<full lowercase hex>"`` everywhere.

Both algorithms release the GIL on large inputs (blake3 always, hashlib above 2 KiB), so
hashing on a thread pool runs in parallel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, Protocol

import blake3

from ..errors import IntegrityError
from .files import NotRegularFileError, open_regular

Algorithm = Literal["blake3", "sha256"]
ALGORITHMS: tuple[str, ...] = ("blake3", "sha256")
HEX_LENGTH = {"blake3": 64, "sha256": 64}
FILE_CHECKSUM = "sha1"  # onnx.proto's external-data checksum: never a store key
CHUNK = 4 << 20  # per hashing thread: bounds resident memory at jobs x CHUNK


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(algo: str, threads: bool = True) -> Hasher:
    """``threads=False`` where other threads already keep the CPUs busy (compression,
    parallel load lanes)."""
    if algo == "blake3":
        return blake3.blake3(max_threads=blake3.blake3.AUTO if threads else 1)
    if algo == "sha256":
        import hashlib  # loads OpenSSL: only when asked for

        return hashlib.sha256()
    if algo == FILE_CHECKSUM:
        import hashlib

        return hashlib.sha1(usedforsecurity=False)
    raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}")


def digest_bytes(algo: str, data: bytes | bytearray | memoryview) -> str:
    """Full lowercase hex digest of ``data``."""
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def digest_file(algo: str, path: str | os.PathLike[str], offset: int = 0,
                length: int | None = None) -> str:
    """Hex digest of ``length`` bytes of ``path`` starting at ``offset`` (to EOF if None)."""
    return digest_file_many((algo,), path, offset, length)[0]


def digest_file_many(algos: Sequence[str], path: str | os.PathLike[str], offset: int = 0,
                     length: int | None = None) -> list[str]:
    """Hex digests, one per algorithm, of a byte range of ``path`` in one read.

    Refuses anything but a regular file before reading (a FIFO would block)."""
    try:
        fd = open_regular(path)
    except NotRegularFileError as exc:
        raise IntegrityError(str(exc), path=os.fspath(path)) from None
    try:
        if length is None:
            length = os.fstat(fd).st_size - offset
        return digest_fd_many(algos, fd, offset, length, name=os.fspath(path))
    finally:
        os.close(fd)


def digest_fd(algo: str, fd: int, offset: int, length: int, *, name: str = "") -> str:
    """Hex digest of a byte range of an open file."""
    return digest_fd_many((algo,), fd, offset, length, name=name)[0]


def digest_fd_many(algos: Sequence[str], fd: int, offset: int, length: int, *,
                   name: str = "") -> list[str]:
    """Hex digests of a byte range of an open file, every algorithm fed by the same read.

    Positional reads into one reused buffer, not a memory map: a file that another
    process truncates while it is hashed gives a short read, reported as an
    :class:`IntegrityError` naming the file, where a mapping would kill the process with
    SIGBUS. Resident memory stays at one buffer whatever the range's size.
    """
    if offset < 0 or length < 0 or offset + length > os.fstat(fd).st_size:
        raise IntegrityError("file is shorter than the range being hashed", path=name,
                             offset=offset, length=length)
    hashers = [new_hasher(a) for a in algos]
    buf = bytearray(min(CHUNK, length))
    view = memoryview(buf)
    pos, end = offset, offset + length
    try:
        while pos < end:
            chunk = view[:min(CHUNK, end - pos)]
            n = os.preadv(fd, [chunk], pos)
            if n <= 0:
                raise IntegrityError("file became shorter while it was hashed", path=name,
                                     offset=pos, length=length)
            for h in hashers:
                h.update(chunk[:n])
            pos += n
    finally:
        view.release()
    return [h.hexdigest() for h in hashers]


_LOWER_HEX = frozenset("0123456789abcdef")


def make_key(algo: str, hex_digest: str) -> str:
    return f"{algo}:{hex_digest}"


def split_key(key: str) -> tuple[str, str]:
    """``"blake3:ab.."`` -> ``("blake3", "ab..")``, validating algorithm and hex form."""
    algo, sep, hex_digest = key.partition(":")
    if (not sep or algo not in ALGORITHMS or len(hex_digest) != HEX_LENGTH[algo]
            or not _LOWER_HEX.issuperset(hex_digest)):
        raise IntegrityError("malformed digest key", key=key)
    return algo, hex_digest
