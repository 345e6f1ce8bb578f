"""Files a load hands onnxruntime, pinned: opened once, verified through those very
descriptors on every load, and bound to what onnxruntime opened.

File identity (device, inode, size, times) cannot prove content: a write through a page
already dirty in a shared mapping does not update mtime again, and a rename between a
check and an open swaps the inode. So a load trusts no identity for bytes. It opens each
file the model handed to onnxruntime points at (a regular file, no link), verifies every
range the session uses, read through that descriptor, against its digest on a second
thread while onnxruntime creates the session, and afterwards proves that onnxruntime
opened those very files: every path still names the inode the load opened, and no
descriptor's file changed its size, times or link count meanwhile (a rename away and back
changes the ctime, a link or unlink the link count). Only then is the session handed over.

onnxruntime maps external data in place, as it does when it opens a model itself: a
writer rewriting a package file in place *while a session uses it* changes what the
session computes (as with onnxruntime's own loading), and :func:`weightstore.load` with
``in_place=False`` copies the verified bytes into files of the load's own instead. Handing
onnxruntime buffers instead of paths (OrtValues or in-memory files) does not spare that
copy: it copies them into memory of its own (measured with onnxruntime 1.32 on a
75 MB model: 3 to 4x the session's creation from the files).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import WeightstoreError
from ..io.digests import FILE_CHECKSUM, new_hasher
from ..io.files import open_regular
from .reader import Reader, read_pinned

BLOCK = 4 << 20  # bytes: each range is read and hashed through a buffer this big
VERIFIED = ("blake3", "sha256", FILE_CHECKSUM)  # digests a range may be checked against


@dataclass(frozen=True)
class Range:
    """``length`` bytes of ``file`` (relative to the folder) at ``offset``, whose digest
    is ``checksum`` (``"algo:hex"``); ``length`` None: the whole file (onnx.proto's
    SHA-1 of a file)."""

    file: str
    offset: int
    length: int | None
    checksum: str

    def to_list(self) -> list[object]:
        return [self.file, self.offset, self.length, self.checksum]

    @classmethod
    def from_list(cls, item: Sequence[object]) -> Range:
        file, offset, length, checksum = item
        if not (isinstance(file, str) and type(offset) is int and offset >= 0
                and (length is None or (type(length) is int and length >= 0))
                and isinstance(checksum, str)):
            raise ValueError("malformed range")
        return cls(file, offset, length, checksum)


def _pin(st: os.stat_result) -> tuple[int, ...]:
    """What a file open for a load must keep: inode, size, times and link count."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            st.st_nlink)


class PinnedFiles:
    """The files of ``names`` in ``folder``, each opened once (regular files only, no
    link); a context manager that closes them."""

    def __init__(self, folder: str, names: Sequence[str]) -> None:
        self.folder = folder
        self.fds: dict[str, int] = {}
        self.pins: dict[str, tuple[int, ...]] = {}
        try:
            for name in sorted(set(names)):
                fd = open_regular(os.path.join(folder, name), nofollow=True)
                self.fds[name] = fd
                self.pins[name] = _pin(os.fstat(fd))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> PinnedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def unchanged(self) -> bool:
        """Does each path still name the file opened for it, unchanged since its open?"""
        for name, fd in self.fds.items():
            try:
                now = _pin(os.fstat(fd))
                there = os.stat(os.path.join(self.folder, name), follow_symlinks=False)
            except OSError:
                return False
            if now != self.pins[name] or (there.st_dev, there.st_ino) != now[:2]:
                return False
        return True


class Verifier(threading.Thread):
    """Verifies ``ranges`` of pinned files on its own thread. ``failed`` names the first
    range that did not match its digest or could not be read (None: all matched);
    ``read`` counts the bytes read."""

    def __init__(self, files: PinnedFiles, ranges: Sequence[Range],
                 reader: Reader | None = None) -> None:
        super().__init__(name="weightstore-verify", daemon=True)
        self.files, self.ranges, self.reader = files, ranges, reader
        # failed until every range is proven: whatever ends the thread early leaves the
        # load unverified, never passed
        self.failed: str | None = "the verification did not finish"
        self.read = 0

    def run(self) -> None:
        buffer = memoryview(bytearray(BLOCK))
        for r in self.ranges:
            try:
                if self._check(r, buffer):
                    continue
                self.failed = f"{r.file} at offset {r.offset} does not match {r.checksum}"
            except (OSError, ValueError, WeightstoreError) as exc:
                self.failed = f"{r.file} at offset {r.offset} cannot be read: {exc}"
            except Exception as exc:  # a reader's own error, no memory: not verified
                self.failed = f"{r.file} at offset {r.offset} was not verified: {exc!r}"
            return
        self.failed = None

    def _check(self, r: Range, buffer: memoryview) -> bool:
        algo, _, expected = r.checksum.partition(":")
        if algo not in VERIFIED:
            return False  # nothing unverifiable is handed over
        fd = self.files.fds[r.file]
        path = Path(self.files.folder, r.file)
        hasher = new_hasher(algo, threads=False)
        offset = r.offset
        left = os.fstat(fd).st_size - offset if r.length is None else r.length
        while left > 0:
            view = buffer[:min(left, BLOCK)]
            n = read_pinned(self.reader, fd, path, offset, view)
            if n <= 0:
                return False  # shorter than its range
            hasher.update(view[:n])
            offset += n
            left -= n
            self.read += n
        return left == 0 and hasher.hexdigest() == expected


def file_ranges(sha1: Mapping[str, str]) -> list[Range]:
    """The whole-file SHA-1 checks onnx.proto's ``checksum`` declares (file -> hex)."""
    return [Range(name, 0, None, f"{FILE_CHECKSUM}:{digest}")
            for name, digest in sorted(sha1.items())]

