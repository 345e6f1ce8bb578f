"""The reader protocol the load executor reads through, and the file reader.

The executor never opens files itself: it asks a :class:`Reader` for byte ranges, so a
recording reader can prove that only manifest ranges are read, each once.

Ranges of store objects are read through a reader's ``read_stored`` when it has one
(:func:`read_range`): a store object is never a symbolic link, so :class:`FileReader`
opens it without following one, and a link, a FIFO, a missing file or one shorter than
its index entry is damage (an :class:`IntegrityError` with the repair hint). Package
and model files are opened as they are (a model may be a link into a download cache).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Protocol

from ..errors import REPAIR_HINT, IntegrityError, LoadError
from ..io.files import NotRegularFileError, open_regular


class Reader(Protocol):
    def read_into(self, path: Path, offset: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes of ``path`` at ``offset`` (all of them, or raise)."""
        ...


def read_pinned(reader: Reader | None, fd: int, path: Path, offset: int,
                out: memoryview) -> int:
    """Up to ``len(out)`` bytes of the file open at ``fd`` (``path``, which names it in
    records) at ``offset``, through the reader's ``read_pinned`` when it has one: a load
    verifies the very files it hands onnxruntime through descriptors it opened
    (:mod:`.pinned`), never by opening a path again. The count read (0: end of file)."""
    read = getattr(reader, "read_pinned", None)
    return read(fd, path, offset, out) if read is not None else os.preadv(fd, [out], offset)


def read_range(reader: Reader, path: Path, offset: int, out: memoryview, *,
               stored: bool = False) -> None:
    """``reader.read_into``, or, for a range of a store object (``stored``), the reader's
    ``read_stored`` when it has one (a reader of its own may lack it: it reads as it
    reads everything)."""
    read = getattr(reader, "read_stored", None) if stored else None
    (read or reader.read_into)(path, offset, out)


class FileReader:
    """Positional reads (``preadv``) from files kept open for the reader's lifetime."""

    def __init__(self) -> None:
        self._fds: dict[tuple[Path, bool], int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: Path, stored: bool = False) -> int:
        with self._lock:
            fd = self._fds.get((path, stored))
            if fd is None:
                try:  # a FIFO would block the open forever; a store object is no link
                    fd = open_regular(path, nofollow=stored)
                except NotRegularFileError as exc:
                    if stored:
                        raise IntegrityError(f"store object file is {exc}", path=str(path),
                                             hint=REPAIR_HINT) from None
                    raise _not_regular(path, exc) from None
                except OSError as exc:
                    if stored and exc.errno in (errno.ELOOP, errno.ENOENT):
                        problem = ("a symbolic link" if exc.errno == errno.ELOOP
                                   else "missing")
                        raise IntegrityError(f"store object file is {problem}",
                                             path=str(path), hint=REPAIR_HINT) from None
                    raise LoadError(f"cannot open weight file: {exc.strerror}",
                                    file=str(path)) from None
                self._fds[(path, stored)] = fd
            return fd

    def read_into(self, path: Path, offset: int, out: memoryview) -> None:
        self._read(path, offset, out, stored=False)

    def read_stored(self, path: Path, offset: int, out: memoryview) -> None:
        """``read_into`` for a range of a store object: the file is opened only as the
        regular file it must be, never through a symbolic link, and a file too short for
        the range is damage."""
        self._read(path, offset, out, stored=True)

    def _read(self, path: Path, offset: int, out: memoryview, *, stored: bool) -> None:
        fd = self._fd(path, stored)
        done = 0
        while done < len(out):
            n = os.preadv(fd, [out[done:]], offset + done)
            if n <= 0:
                if stored:
                    raise IntegrityError("store object file is shorter than its index "
                                         "entry", path=str(path), offset=offset + done,
                                         length=len(out) - done, hint=REPAIR_HINT)
                raise LoadError("short read: the weight file ends early", file=str(path),
                                offset=offset + done, length=len(out) - done)
            done += n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _not_regular(path: Path, exc: NotRegularFileError) -> IntegrityError:
    """A weight file that is a FIFO, device or folder is damage; in a store (an index
    beside it), repair drops its rows and the next build writes the objects again."""
    store = (Path(path).parent / "index.sqlite").is_file()
    return IntegrityError(f"weight file is {exc}", file=str(path),
                          hint=REPAIR_HINT if store else None)


class RecordingReader:
    """A reader that records every range it reads (then reads it through ``inner``)."""

    def __init__(self, inner: Reader | None = None) -> None:
        self.inner = inner or FileReader()
        self.reads: list[tuple[Path, int, int]] = []
        self._lock = threading.Lock()

    def read_into(self, path: Path, offset: int, out: memoryview) -> None:
        with self._lock:
            self.reads.append((Path(path), offset, len(out)))
        self.inner.read_into(path, offset, out)

    def read_stored(self, path: Path, offset: int, out: memoryview) -> None:
        with self._lock:
            self.reads.append((Path(path), offset, len(out)))
        read_range(self.inner, path, offset, out, stored=True)

    def read_pinned(self, fd: int, path: Path, offset: int, out: memoryview) -> int:
        with self._lock:
            self.reads.append((Path(path), offset, len(out)))
        return read_pinned(self.inner, fd, path, offset, out)

    @property
    def bytes_read(self) -> int:
        return sum(n for _, _, n in self.reads)
