"""What a caller hands to :meth:`WeightStore.put`: a digest key plus a way to get the bytes.

Sources that sit in a file expose :meth:`PayloadSource.file_range` so the store can copy
them in the kernel (``copy_file_range``, reflinks where the filesystem shares extents)
instead of pulling gigabytes through Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from ..io.digests import digest_bytes, make_key


class PayloadSource(Protocol):
    """The bytes of one weight, named by their digest key ``"algo:hex"``."""

    @property
    def key(self) -> str: ...

    @property
    def size(self) -> int: ...

    def read(self) -> bytes | memoryview:
        """Exactly ``size`` bytes."""
        ...

    def file_range(self) -> tuple[str, int] | None:
        """``(path, offset)`` when the bytes sit in a file, else None."""
        ...

    def describe(self) -> str:
        """Where the bytes come from, in words, for messages."""
        ...


@dataclass(frozen=True)
class BytesPayload:
    """A payload held in memory."""

    key: str
    data: bytes
    origin: str = ""  # where the bytes came from, for messages

    @classmethod
    def of(cls, data: bytes, algo: str = "blake3") -> BytesPayload:
        return cls(key=make_key(algo, digest_bytes(algo, data)), data=bytes(data))

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self) -> bytes:
        return self.data

    def file_range(self) -> None:
        return None

    def describe(self) -> str:
        return self.origin or f"{self.size} bytes in memory"


@dataclass(frozen=True)
class FilePayload:
    """A payload stored as ``size`` bytes of ``path`` at ``offset`` (e.g. ONNX external data)."""

    key: str
    size: int
    path: str
    offset: int = 0

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read(self.size)

    def file_range(self) -> tuple[str, int]:
        return os.fspath(self.path), self.offset

    def describe(self) -> str:
        return f"{os.fspath(self.path)} at offset {self.offset}"
