"""A private, memory-mapped data file that onnxruntime maps instead of copying.

onnxruntime copies weights handed to it as in-memory files, and those it keeps using
(not packed) when handed over as arrays, but maps external data it reads from a file.
So a load reads its payloads straight into one file of its own, in a fresh ``0700``
temporary folder (on ``/dev/shm`` where there is one, so the file is memory),
through a shared mapping: each slot starts 4096-aligned, checksums are verified from the
mapping, and the graph's tensors point at their slots. onnxruntime then maps the same
pages: the bytes exist once. Nothing but this process writes the file, and nothing is
written to it after verification, so the bytes onnxruntime maps are the verified ones.
The folder is removed as soon as the session exists (onnxruntime's mapping, and ours,
keep the pages alive); the views stay valid until the last of them is released.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import LoadError
from ..io.files import align_up

ALIGN = 4096
DATA = "weights.data"
SHM = Path("/dev/shm")


def _room(folder: Path) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _temp_dir(size: int = 0) -> Path:
    """A fresh private folder: on ``/dev/shm`` when it is writable and has room for
    ``size`` bytes (containers often give it 64 MB), else in the temporary folder."""
    parent = SHM if (SHM.is_dir() and os.access(SHM, os.W_OK)
                     and _room(SHM) > size) else None
    return Path(tempfile.mkdtemp(prefix="weightstore-load-", dir=parent))


def write_at(fd: int, path: Path, offset: int, data: memoryview) -> None:
    """All of ``data`` at ``offset``; a full folder is a load error naming the file."""
    done = 0
    try:
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
    except OSError as exc:
        raise LoadError(f"cannot write the load's data file: {exc.strerror}",
                        file=str(path), offset=offset + done) from None


def layout(lengths: Sequence[int]) -> tuple[list[int], int]:
    """4096-aligned slot offsets for blocks of ``lengths``, and the file's size."""
    slots, end = [], 0
    for n in lengths:
        slots.append(align_up(end, ALIGN))
        end = slots[-1] + n
    return slots, end


class MappedData:
    """One load's data file: ``size`` bytes, mapped read-write, in its own folder."""

    def __init__(self, size: int, folder: Path | None = None, name: str = DATA, *,
                 reserve: int | None = None) -> None:
        """``reserve``: the bytes the new folder must have room for (default ``size``)."""
        self._owns = folder is None  # a file in another's folder goes with that folder
        self.folder = folder if folder is not None else _temp_dir(
            size if reserve is None else reserve)
        self.path = self.folder / name
        self.size = max(size, 1)
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(self._fd, self.size)
        except BaseException:
            self.remove_folder()
            raise

    def write(self, offset: int, data: memoryview) -> None:
        """Write ``data`` at ``offset`` (pages are allocated by the write, not zeroed
        first and not mapped here)."""
        write_at(self._fd, self.path, offset, data)

    @property
    def view(self) -> memoryview:
        """The whole file, mapped shared on first use (pages fault in as they are read)."""
        if self._view is None:
            self._map = mmap.mmap(self._fd, self.size)
            self._view = memoryview(self._map)
        return self._view

    def slice(self, offset: int, length: int) -> memoryview:
        return self.view[offset:offset + length]

    def release(self) -> None:
        """Drop this process's page mappings (the bytes stay in the file; a view faults
        them back in): once onnxruntime maps the file, the pages count once."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def remove_folder(self) -> None:
        """Unlink the file (and its folder, if it made it); mapped pages live on while
        mapped."""
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._owns:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> MappedData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove_folder()


class SpillFile:
    """Bytes made in memory (decoded, derived or fallback payloads) appended to a file
    beside a load's mapped data, so onnxruntime maps them too: it takes weights from
    memory only when every external weight of the graph comes from memory."""

    def __init__(self, folder: Path, name: str = "spill.data") -> None:
        self.path = folder / name
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._end = 0

    def append(self, data: memoryview) -> tuple[str, int]:
        """Write ``data`` at the next aligned offset; its file name and offset."""
        offset = align_up(self._end, ALIGN)
        write_at(self._fd, self.path, offset, data)
        self._end = offset + len(data)
        return self.path.name, offset

    def close(self) -> None:
        os.close(self._fd)
