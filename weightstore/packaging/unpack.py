"""``weightstore unpack ARCHIVE DIR``: a release archive -> a verified package folder.

A short orchestrator over the archive stream and a temp folder beside ``DIR``: each member
is checked before a byte of it is written (regular files and folders only; a path that is
relative, free of ``..``, under the archive's single top folder and seen once; a file listed
in the summary, which comes first, with exactly the size listed), written with an ordinary
mode, hashed on the way and compared with the summary's digest; the archive must end as
its writer ended it (the zstd frame whole, the tar's end-of-archive blocks, nothing after
them). Only a complete, verified folder is renamed to ``DIR``; on any failure the temp
folder is removed and nothing is left.

:func:`read_archive` is that reading, with or without a folder to write into: ``diff`` and
``report --against`` read an archive through it too, so that what ``unpack`` refuses no
reader of archives takes.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, PackageError
from ..io.digests import make_key, new_hasher
from ..io.files import (
    WRITE_ERRNOS,
    dir_mode,
    discard_temp_dir,
    make_temp_dir,
    parse_json,
    publish_dir,
)
from ..io.tar import REGULAR, member_kind, read_trailer, write_new
from ..package.summary import SUMMARY_NAME
from .archive_reader import open_archive, read_small
from .inventory import check_member_path, check_summary

SUFFIX = ".tar.zst"  # a release archive: <package>-<version>-<layout>.tar.zst
CHUNK = 4 << 20


@dataclass(frozen=True)
class UnpackResult:
    folder: Path
    files: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "files": self.files, "bytes": self.bytes}


def archive_root(summary: Mapping[str, Any]) -> str:
    """The top folder of a package's release archive, and the archive's name without
    :data:`SUFFIX`: ``<package>-<version>-<layout>``."""
    name = f"{summary['package']}-{summary['version']}-{summary['layout']['name']}"
    if "/" in name or "\x00" in name or name.startswith("."):
        raise PackageError("package, version or layout name cannot name an archive",
                           name=name)
    return name


@dataclass
class ArchiveRead:
    """What :func:`read_archive` found: the summary, the files it lists (all present,
    each checked) and their bytes, and the data of the members it was asked to keep."""

    summary: dict[str, Any]
    files: int = 0
    bytes: int = 0
    whole: bool = True  # False: read only up to the files asked for (``until``)
    kept: dict[str, bytes] = field(default_factory=dict)  # path in the package -> data
    sha256: dict[str, str] = field(default_factory=dict)  # path in the package -> hex
    companions: set[str] = field(default_factory=set)  # kept for keep_companions


def unpack(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> UnpackResult:
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise PackageError("destination already exists; unpack never replaces a folder",
                           folder=str(dest))
    parent = dest.absolute().parent
    if not parent.is_dir():
        raise PackageError("destination's parent folder does not exist", folder=str(parent))
    tmp = make_temp_dir(parent, f".{dest.name}.")
    try:
        read = read_archive(Path(archive), into=tmp)
        publish_dir(tmp, dest)
        tmp = None
        return UnpackResult(dest, read.files, read.bytes)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        # a full or read-only disk: say so, with the file that could not be written
        raise PackageError(f"cannot write the package: {exc.strerror}; nothing was unpacked",
                           file=exc.filename, folder=str(dest)) from None
    finally:
        discard_temp_dir(tmp)


def _refuse(archive: Path, why: str, member: str, **context: Any) -> PackageError:
    return PackageError(f"refusing archive: {why}", archive=str(archive), member=member,
                        **context)


def read_archive(archive: Path, *, into: Path | None = None,
                 keep: Callable[[str], bool] = lambda path: False,
                 hashed: bool = True, sha256_of: Collection[str] = (),
                 keep_companions: Callable[[dict[str, Any]], Collection[str]] | None = None,
                 until: Collection[str] | None = None) -> ArchiveRead:
    """Read a release archive whole, refusing it as the module's text says: every member
    checked before a byte of it is used, every file's bytes hashed on the way and
    compared with the summary's digest, and nothing after the tar's end. ``into``: write
    the package there (an empty folder); ``keep(path)``: hold that file's data in memory
    too (metadata: up to :data:`~.archive_reader.JSON_LIMIT`). ``hashed=False`` (``diff
    --no-verify``) compares no digest: every other check still holds. ``sha256_of``: the
    files whose SHA-256 to take too (``release --verify`` checks companions by it).
    ``keep_companions(summary)``: more files to keep, chosen once the summary is read
    (the companion files a reader shows; listed in ``companions`` too). ``until``: stop
    once every one of these files the summary lists has been read (each checked as
    always, and every member before it): the archive is one zstd frame, so what comes
    after them is never decompressed (``whole`` is False then, ``files`` 0; a file the
    summary does not list is not looked for)."""
    expected: dict[str, dict[str, Any]] | None = None
    read: ArchiveRead | None = None
    folders: set[str] = set()
    seen: set[str] = set()
    pending: set[str] = set()  # the files of ``until`` not read yet
    root: str | None = None
    with open_archive(archive) as tf:
        for member in tf:
            name = member.name.rstrip("/") if member.isdir() else member.name
            if not (member.isdir() or member.type in REGULAR):
                raise _refuse(archive, "only regular files and folders are allowed",
                              member.name, type=member_kind(member))
            try:
                check_member_path(name, str(archive))
            except PackageError:
                raise _refuse(archive, "unsafe path", member.name) from None
            if root is None:
                if not member.isdir() or "/" in name:
                    raise _refuse(archive, "the first member must be the top folder",
                                  member.name)
                root = name
                _check_file_name(archive, root)
                continue
            if not name.startswith(f"{root}/"):
                raise _refuse(archive, "member outside the top folder", member.name)
            rel = name[len(root) + 1:]
            if rel in seen:
                raise _refuse(archive, "duplicate member", member.name)
            seen.add(rel)
            if expected is None:
                if rel != SUMMARY_NAME or not member.isfile():
                    raise _refuse(archive, "summary.json must come first", member.name)
                data = read_small(tf, member, archive)
                try:
                    summary = parse_json(data)
                except ValueError as exc:
                    raise _refuse(archive, f"summary is not JSON: {exc}", member.name) from None
                check_summary(summary, f"{archive}:{member.name}")
                if _root_of(summary) != root:
                    raise _refuse(archive, "the top folder is not named after the package "
                                  "its summary describes", member.name,
                                  expected=_root_of(summary))
                expected = {c["path"]: c for c in summary["contents"]}
                folders = {str(p) for c in expected for p in Path(c).parents} - {"."}
                read = ArchiveRead(summary)
                if until is not None:
                    pending = set(until) & set(expected)
                    if not pending:
                        read.whole = False
                        return read
                if keep_companions is not None:
                    read.companions = set(keep_companions(summary))
                if into is not None:
                    write_new(into / SUMMARY_NAME, [data])
                continue
            assert read is not None
            if member.isdir():
                if rel not in folders:
                    raise _refuse(archive, "folder not in the summary", member.name)
                if into is not None:
                    (into / rel).mkdir(mode=dir_mode(), parents=True, exist_ok=True)
                continue
            entry = expected.get(rel)
            if entry is None:
                raise _refuse(archive, "file not listed in the summary", member.name)
            if member.size != entry["size"]:
                raise _refuse(archive, "size differs from the summary", member.name,
                              size=member.size, expected=entry["size"])
            if keep(rel) or rel in read.companions:
                read.kept[rel] = read_small(tf, member, archive)
                chunks: Iterable[bytes] = _checked(iter([read.kept[rel]]), member, entry,
                                                   archive, hashed)
            else:
                chunks = _checked(_member_data(tf, member, archive), member, entry, archive,
                                  hashed)
            if rel in sha256_of:
                chunks = _sha256(chunks, read.sha256, rel)
            if into is not None:
                (into / rel).parent.mkdir(mode=dir_mode(), parents=True, exist_ok=True)
                write_new(into / rel, chunks)
            else:
                for _ in chunks:
                    pass
            read.bytes += member.size
            if until is not None:
                pending.discard(rel)
                if not pending:  # the rest of the frame is never decompressed
                    read.whole = False
                    return read
        read_trailer(tf)
    if read is None or expected is None:
        raise PackageError("refusing archive: no package summary in it", archive=str(archive))
    missing = sorted(set(expected) - seen)
    if missing:
        raise PackageError("refusing archive: files listed in the summary are missing",
                           archive=str(archive), missing=", ".join(missing[:5]))
    read.files = len(expected)
    return read


def _check_file_name(archive: Path, root: str) -> None:
    """A release archive is named after its top folder (``<package>-<version>-<layout>``):
    one renamed, say to another layout's name, would install what its name does not say."""
    if archive.name != f"{root}{SUFFIX}":
        raise PackageError("refusing archive: its file name is not the name of the package "
                           f"it holds, {root}{SUFFIX}", archive=str(archive), holds=root)


def _root_of(summary: dict[str, Any]) -> str | None:
    try:
        return archive_root(summary)
    except (PackageError, KeyError, TypeError):
        return None


def _member_data(tf: tarfile.TarFile, member: tarfile.TarInfo,
                 archive: Path) -> Iterator[bytes]:
    source = tf.extractfile(member)
    assert source is not None  # a regular file
    remaining = member.size
    while remaining:
        data = source.read(min(CHUNK, remaining))
        if not data:
            raise _refuse(archive, "member ends early", member.name)
        remaining -= len(data)
        yield data


def _sha256(chunks: Iterable[bytes], into: dict[str, str], rel: str) -> Iterator[bytes]:
    """``chunks`` passed on, their SHA-256 put in ``into[rel]`` once they are through."""
    hasher = new_hasher("sha256", threads=False)
    for data in chunks:
        hasher.update(data)
        yield data
    into[rel] = hasher.hexdigest()


def _checked(chunks: Iterator[bytes], member: tarfile.TarInfo, entry: dict[str, Any],
             archive: Path, hashed: bool) -> Iterator[bytes]:
    """``chunks``, hashed on their way; once they are through, their digest must be the
    summary's (an :class:`IntegrityError` otherwise, before the caller goes on)."""
    if not hashed:
        yield from chunks
        return
    algo = entry["digest"].partition(":")[0]
    hasher = new_hasher(algo, threads=False)
    for data in chunks:
        hasher.update(data)
        yield data
    actual = make_key(algo, hasher.hexdigest())
    if actual != entry["digest"]:
        raise IntegrityError("archive member differs from its summary", archive=str(archive),
                             member=member.name, expected=entry["digest"], actual=actual)
