"""Deterministic ``<package>-<version>-<layout>.tar.zst`` archives of package folders.

Archive layout, format 2 (one top folder, entries in this fixed order)::

    <package>-<version>-<layout>/                 folder, 0755
    <package>-<version>-<layout>/summary.json     first file: readers learn every size and
                                                  digest before any payload byte
    <package>-<version>-<layout>/<path>           the companion files (configs, tokenizers,
                                                  docs) and their folders, sorted by path
                                                  components, each folder before its files
    <package>-<version>-<layout>/<path>           every other file and folder of the
                                                  summary's ``contents``, sorted so

The archive is one zstd frame, so reaching a member means decompressing every byte before
it: the companions come before the weights so that a reader of the companions alone
(``release --verify``) stops after a few MB. Format 1 sorted every path in one order;
its archives are read as format 2's are (readers go by the summary, not by the order),
and written only to check a release published so (``release --check``). A package
without companion files has the same archive in both formats.

Every header is ustar (PAX extended headers only for paths over 100 bytes or non-ASCII):
mtime from ``SOURCE_DATE_EPOCH``, uid/gid 0, empty user and group names, mode 0644 for
files and 0755 for folders, no atime/ctime records, no xattrs. The tar stream ends with two
zero blocks and is padded to a 10240-byte record, as GNU tar does. Its size is known from
the plan, so the single zstd frame carries it.

The planner is pure (summary in, plan out); the executor streams each file from the package
through a digest check into the compressor, one chunk at a time, so memory stays bounded
and no second copy of the package is written.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import IntegrityError, PackageError
from ..io.digests import make_key, new_hasher
from ..io.files import open_regular
from ..package.summary import SUMMARY_NAME
from ..packaging.companion_files import companion_files
from ..packaging.unpack import SUFFIX, archive_root
from .compression import Compression
from .zstd_frame import Frame, Sink

ARCHIVE_FORMAT = 2  # companion files first (1: every path in one sorted order)
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip can hold
BLOCK = 512
RECORD = 20 * BLOCK
CHUNK = 4 << 20
FILE_MODE, DIR_MODE = 0o644, 0o755


def source_date_epoch(env: Mapping[str, str] = os.environ) -> int:
    """``SOURCE_DATE_EPOCH`` (reproducible-builds.org), or a fixed epoch when unset."""
    value = env.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return DEFAULT_EPOCH
    if not value.isdigit() or int(value) >= 8**11:
        raise PackageError("SOURCE_DATE_EPOCH must be a whole number of seconds since 1970 "
                           "that fits a tar header", value=value)
    return int(value)


@dataclass(frozen=True)
class ArchiveEntry:
    name: str  # path in the archive, under the top folder
    source: str | None  # path in the package; None for folders
    size: int = 0
    digest: str | None = None  # "<algo>:<hex>" from the summary (None: summary.json)

    @property
    def is_dir(self) -> bool:
        return self.source is None


@dataclass(frozen=True)
class ArchivePlan:
    file_name: str  # <package>-<version>-<layout>.tar.zst
    root: str  # top folder
    mtime: int
    entries: tuple[ArchiveEntry, ...]

    def headers(self) -> list[bytes]:
        return [tar_header(e, self.mtime) for e in self.entries]

    @property
    def tar_size(self) -> int:
        """Bytes of the uncompressed tar stream, trailer and record padding included."""
        size = sum(len(h) + _padded(e.size) for h, e in zip(self.headers(), self.entries,
                                                          strict=True))
        return _padded_to(size + 2 * BLOCK, RECORD)


def plan_archive(summary: Mapping[str, Any], summary_size: int, mtime: int,
                 archive_format: int = ARCHIVE_FORMAT) -> ArchivePlan:
    """The archive of a package, from its summary alone (no I/O)."""
    root = archive_root(summary)
    contents: Sequence[Mapping[str, Any]] = summary["contents"]
    folders: set[PurePosixPath] = set()
    for c in contents:
        folders.update(PurePosixPath(c["path"]).parents)
    folders.discard(PurePosixPath("."))
    first: set[PurePosixPath] = set()  # the companions and their folders (format 2)
    if archive_format >= 2:
        for c in companion_files(summary):
            first.add(PurePosixPath(c.file))
            first.update(PurePosixPath(c.file).parents)
    items: list[tuple[tuple[str, ...], ArchiveEntry]] = [
        (PurePosixPath(c["path"]).parts,
         ArchiveEntry(f"{root}/{c['path']}", c["path"], c["size"], c["digest"]))
        for c in contents]
    items += [(f.parts, ArchiveEntry(f"{root}/{f}", None)) for f in folders]
    names = [parts for parts, _ in items]
    if len(set(names)) != len(names) or (SUMMARY_NAME,) in names:
        raise PackageError("package contents list a path twice", package=root)
    # a folder holding a companion comes with them, so every folder precedes its files
    items.sort(key=lambda item: (PurePosixPath(*item[0]) not in first, item[0]))
    entries = (ArchiveEntry(root, None),
               ArchiveEntry(f"{root}/{SUMMARY_NAME}", SUMMARY_NAME, summary_size),
               *(e for _, e in items))
    return ArchivePlan(f"{root}{SUFFIX}", root, mtime, entries)


def tar_header(entry: ArchiveEntry, mtime: int) -> bytes:
    """The entry's header block(s), every field pinned."""
    info = tarfile.TarInfo(entry.name)
    info.type = tarfile.DIRTYPE if entry.is_dir else tarfile.REGTYPE
    info.mode = DIR_MODE if entry.is_dir else FILE_MODE
    info.size = 0 if entry.is_dir else entry.size
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _padded(size: int) -> int:
    return _padded_to(size, BLOCK)


def _padded_to(size: int, unit: int) -> int:
    return (size + unit - 1) // unit * unit


def write_archive(plan: ArchivePlan, folder: Path, summary_bytes: bytes, out: Sink,
                  compression: Compression, workers: int,
                  progress: Callable[[int], None] | None = None,
                  sha256_of: Collection[str] = ()) -> dict[str, str]:
    """Stream the package at ``folder`` into ``out`` as the plan says.

    Every file is read once, into one reused buffer, hashed on the way and checked against
    the summary's size and digest: a package changed since its summary was written fails
    here, naming the file. The files of ``sha256_of`` (package paths) are hashed with
    SHA-256 too, from the same bytes: returns their hex digests by path.
    """
    sha256: dict[str, str] = {}
    frame = Frame(compression.parameters(workers), plan.tar_size, out)
    buffer = memoryview(bytearray(CHUNK))
    written = 0
    for header, entry in zip(plan.headers(), plan.entries, strict=True):
        frame.write(header)
        written += len(header)
        if entry.is_dir:
            continue
        if entry.source == SUMMARY_NAME:
            frame.write(summary_bytes)
        else:
            extra = new_hasher("sha256", threads=False) if entry.source in sha256_of else None
            _copy_file(folder / str(entry.source), entry, frame, buffer, progress, extra)
            if extra is not None:
                sha256[str(entry.source)] = extra.hexdigest()
        pad = _padded(entry.size) - entry.size
        frame.write(bytes(pad))
        written += entry.size + pad
    frame.write(bytes(plan.tar_size - written))
    frame.close()
    return sha256


def _copy_file(path: Path, entry: ArchiveEntry, frame: Frame, buffer: memoryview,
               progress: Callable[[int], None] | None, extra: Any = None) -> None:
    """Feed one file to the compressor, hashing it on the way (the compressor's workers
    run meanwhile: the feeding thread only copies into their job buffers); ``extra``: a
    second hasher fed the same bytes."""
    algo = str(entry.digest).partition(":")[0]
    hasher = new_hasher(algo, threads=False)
    remaining = entry.size
    # a regular file, never a link followed nor a FIFO waited on (if one took its place
    # since the package was checked)
    with os.fdopen(open_regular(path, nofollow=True), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            raise IntegrityError("package file differs from its summary (size)",
                                 file=str(path), expected=entry.size, actual=size)
        while remaining:
            n = f.readinto(buffer[:min(len(buffer), remaining)])
            if not n:
                raise IntegrityError("package file ended early", file=str(path),
                                     missing=remaining)
            chunk = buffer[:n]
            hasher.update(chunk)
            if extra is not None:
                extra.update(chunk)
            frame.write(chunk)
            remaining -= n
            if progress is not None:
                progress(n)
    actual = make_key(algo, hasher.hexdigest())
    if actual != entry.digest:
        raise IntegrityError("package file differs from its summary (digest)",
                             file=str(path), expected=entry.digest, actual=actual)
