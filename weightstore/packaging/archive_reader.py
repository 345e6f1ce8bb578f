"""Reading release archives as streams: one pass, bounded memory, no temp copy."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import PackageError
from ..io.files import NotRegularFileError, open_regular
from ..io.tar import CompleteTarInfo
from ..io.zstd import CorruptStream, FrameReader

JSON_LIMIT = 64 << 20  # summary.json and bundle.json members are read whole, up to this
READ_BUFFER = 1 << 20  # decompressed bytes buffered between libzstd and tarfile


@contextlib.contextmanager
def open_archive(path: str | Path) -> Iterator[tarfile.TarFile]:
    """A streaming tar reader (``r|``) over the archive's zstd frame(s).

    zstd verifies each frame's checksum as it reaches the frame's end, and input that ends
    inside a frame, a tar header cut short or damaged, or a tar without its end-of-archive
    blocks is refused (:func:`~weightstore.io.tar.read_trailer`, called after the last
    member, checks what follows it): corrupt or truncated input becomes a
    :class:`PackageError` naming the archive.
    """
    try:
        fd = open_regular(path)  # a FIFO would block the open, and the reads, forever
    except FileNotFoundError:
        raise PackageError("no such archive", archive=str(path)) from None
    except NotRegularFileError as exc:
        raise PackageError(f"archive is {exc}", archive=str(path)) from None
    except OSError as exc:
        raise PackageError(f"cannot open the archive: {exc.strerror or exc}",
                           archive=str(path)) from None
    try:
        with (os.fdopen(fd, "rb") as f,
              # tarfile reads 10 KiB at a time: buffered, libzstd is called per MiB
              tarfile.open(fileobj=io.BufferedReader(FrameReader(f), READ_BUFFER), mode="r|",
                           encoding="utf-8", errors="strict", tarinfo=CompleteTarInfo) as tf):
            yield tf
    except (tarfile.TarError, CorruptStream, EOFError, UnicodeError) as exc:
        raise PackageError(f"corrupt archive: {exc}", archive=str(path)) from None


def read_small(tf: tarfile.TarFile, member: tarfile.TarInfo, archive: str | Path) -> bytes:
    """The whole data of a small member (JSON), refusing large ones before reading."""
    if member.size > JSON_LIMIT:
        raise PackageError("archive member is too large to be metadata", archive=str(archive),
                           member=member.name, size=member.size)
    f = tf.extractfile(member)
    if f is None:
        raise PackageError("archive member is not a file", archive=str(archive),
                           member=member.name)
    return f.read()
