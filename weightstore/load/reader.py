"""The reader protocol the load executor reads through, and the file reader.

The executor never opens files itself: it asks a :class:`Reader` for byte ranges, so a
recording reader can prove that only manifest ranges are read, each once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol

from ..errors import IntegrityError, LoadError
from ..io.files import NotRegularFileError, open_regular


class Reader(Protocol):
    def read_into(self, path: Path, offset: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes of ``path`` at ``offset`` (all of them, or raise)."""
        ...


class FileReader:
    """Positional reads (``preadv``) from files kept open for the reader's lifetime."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = open_regular(path)  # a FIFO would block the open forever
                except NotRegularFileError as exc:
                    raise _not_regular(path, exc) from None
                except OSError as exc:
                    raise LoadError(f"cannot open weight file: {exc.strerror}",
                                    file=str(path)) from None
                self._fds[path] = fd
            return fd

    def read_into(self, path: Path, offset: int, out: memoryview) -> None:
        fd = self._fd(path)
        done = 0
        while done < len(out):
            n = os.preadv(fd, [out[done:]], offset + done)
            if n <= 0:
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
                          hint="run 'weightstore store verify --repair'" if store else None)


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

    @property
    def bytes_read(self) -> int:
        return sum(n for _, _, n in self.reads)
