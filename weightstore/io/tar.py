"""Reading tar streams someone else wrote: bounded headers, member kinds, new files.

Release archives (:mod:`weightstore.packaging.unpack`) and the tar layers of foreign registry
artifacts (:mod:`weightstore.registry.foreign`) are both read as one stream (``r|``) and
unpacked into a temp folder: regular files and folders only, each file created new.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

from .files import file_mode, name_path

HEADER_LIMIT = 1 << 20  # PAX and GNU long-name headers: tarfile reads them whole
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class BoundedTarInfo(tarfile.TarInfo):
    """Refuses extended headers larger than :data:`HEADER_LIMIT` before tarfile reads them
    into memory (a hostile archive could announce gigabytes)."""

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > HEADER_LIMIT:
            raise tarfile.HeaderError(f"extended header of {self.size} bytes")
        return super()._proc_member(tf)  # type: ignore[misc]


class CompleteTarInfo(BoundedTarInfo):
    """A tar read to its end-of-archive blocks: where tarfile takes a header cut short, a
    missing one or a damaged one (after the first) for the end of the archive, this is an
    error. A zero block still ends it; :func:`read_trailer` checks the second one."""

    @classmethod
    def fromtarfile(cls, tf: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tf)
        except tarfile.EOFHeaderError:
            raise  # a zero block: the end-of-archive marker
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError):
            raise tarfile.ReadError("the tar ends without its end-of-archive blocks") from None
        except tarfile.InvalidHeaderError as exc:
            raise tarfile.ReadError(f"damaged tar header: {exc}") from None


def read_trailer(tf: tarfile.TarFile) -> None:
    """After the last member of a stream read with :class:`CompleteTarInfo` (whose first
    end-of-archive block tarfile has read): the second block, then only the zero padding
    tar writes up to the end. Raises ``tarfile.ReadError`` on a missing block or on data
    after them."""
    stream = tf.fileobj
    zeros = 0
    while data := stream.read(1 << 20):  # type: ignore[union-attr]
        if data.count(0) != len(data):
            raise tarfile.ReadError("data after the end of the tar")
        zeros += len(data)
    if zeros < tarfile.BLOCKSIZE:
        raise tarfile.ReadError("the tar ends without its second end-of-archive block")


def member_kind(member: tarfile.TarInfo) -> str:
    """What a member that is neither a regular file nor a folder is, in words."""
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hard link"
    if member.isfifo():
        return "fifo"
    if member.isdev():
        return "device"
    if member.issparse():
        return "sparse file"
    return repr(member.type.decode(errors="replace"))


def write_new(path: Path, chunks: Iterable[bytes]) -> None:
    """Create ``path`` (it must not exist: ``O_EXCL``) with an ordinary mode, write
    ``chunks`` and fsync it; a failed write names the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                 file_mode())
    try:
        with os.fdopen(fd, "wb") as f:
            for data in chunks:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # a write names no file: name the one written
        raise name_path(exc, path) from None
