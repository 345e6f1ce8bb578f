"""Every file of a package with its size and digest: the summary's ``contents``.

The inventory is what makes a package checkable as a whole: ``weightstore verify``
re-hashes against it, the up-to-date check compares it through a stat cache, archives are
planned from it and unpacking checks each member against it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import IntegrityError, PackageError
from ..io.digests import digest_file, make_key
from ..io.files import is_relative_inside
from ..package.bundle_record import device_path
from ..package.summary import (
    CONTENTS_SINCE,
    SUMMARY_NAME,
    check_structure,
    read_summary_file,
)


def package_files(folder: Path) -> list[str]:
    """Relative POSIX paths of every file below ``folder`` but the summary, sorted.

    A package holds only regular files and folders; anything else (a symlink, a device) is
    refused, since neither onnx nor an archive reader should follow it.
    """
    out: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in [*dirs, *files]:
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if name in dirs and stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise PackageError("a package holds only regular files and folders",
                                   path=path.relative_to(folder).as_posix(),
                                   folder=str(folder))
            out.append(path.relative_to(folder).as_posix())
    return sorted(p for p in out if p != SUMMARY_NAME)


def package_contents(folder: Path, algo: str, jobs: int = 1,
                     known: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """``[{"path", "size", "digest"}]`` for every file of the package, sorted by path.

    ``known`` maps paths to digests (``"<algo>:<hex>"``) their writer took from the very
    bytes it wrote: those files are not read again. Every other file is hashed here.
    """
    names = package_files(folder)
    known = known or {}

    def entry(name: str) -> dict[str, Any]:
        path = folder / name
        digest = known.get(name) or make_key(algo, digest_file(algo, path))
        return {"path": name, "size": path.stat().st_size, "digest": digest}

    from concurrent.futures import ThreadPoolExecutor  # not needed to read a summary

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(entry, names))


def read_summary(folder: Path) -> dict[str, Any]:
    """The package's summary, which must list its contents (format_version 3 or later)."""
    return read_summary_bytes(folder)[1]


def read_summary_bytes(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """The summary's exact bytes (archives hold them as they are) and its content."""
    data, summary = read_summary_file(folder)
    check_summary(summary, str(folder / SUMMARY_NAME))
    return data, summary


def check_summary(summary: Any, where: str) -> None:
    """Refuse a summary this version cannot trust for file digests."""
    check_structure(summary, where)  # a known format_version among the rest
    version = summary["format_version"]
    if version < CONTENTS_SINCE or not isinstance(summary.get("contents"), list):
        raise PackageError(f"package summary lists no file digests (format_version "
                           f"{version}); rebuild the package", file=where,
                           format_version=version)
    for i, c in enumerate(summary["contents"]):
        if not (isinstance(c, dict) and isinstance(c.get("path"), str)
                and isinstance(c.get("size"), int) and c["size"] >= 0
                and isinstance(c.get("digest"), str) and ":" in c["digest"]):
            raise PackageError("malformed contents entry in the package summary", file=where,
                               entry=i)
        check_member_path(c["path"], where)
    listed = {c["path"]: (c["size"], c["digest"]) for c in summary["contents"]}
    held = [(f"companions[{i}]", c, [c["path"]])
            for i, c in enumerate(summary.get("companions", []))]
    held += [(f"devices[{i}].companions[{j}]", c, [device_path(d["name"], c["path"]),
                                                  c["path"]])
             for i, d in enumerate(summary.get("devices", []))
             for j, c in enumerate(d.get("companions", []))]
    for at, c, places in held:  # a device's own file, or else the package's
        place = next((p for p in places if p in listed), None)
        if place is None or listed[place] != (c["size"], c["digest"]):
            raise PackageError("package summary lists a companion file its contents do not "
                               "hold with that size and digest", file=where, key=at,
                               path=c["path"])


def check_member_path(name: str, where: str) -> PurePosixPath:
    """A relative path that stays inside its folder: no absolute path, no ``..``, no empty,
    ``.`` or backslash component, no NUL."""
    if not is_relative_inside(name):
        raise PackageError("unsafe path", path=name, file=where)
    return PurePosixPath(name)


@dataclass(frozen=True)
class Problem:
    kind: str  # missing | size | digest | unexpected | unreadable | build
    path: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.detail}"


@dataclass
class VerifyReport:
    package: str
    files: int = 0
    bytes_hashed: int = 0
    problems: list[Problem] = field(default_factory=list)
    recorded: bool = False  # the store knows the build and the summary is its own
    prepared: list[dict[str, Any]] = field(default_factory=list)  # see PreparedProof

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def proven(self) -> str | None:
        """What the check proved (:mod:`weightstore.packaging.proof`): ``"build"``, that the
        folder is the build its store recorded; ``"internal-consistency"``, only that it
        agrees with its own summary (no store here knows the build); None on a problem."""
        from .proof import PROVEN_BUILD, PROVEN_INTERNAL

        if not self.ok:
            return None
        return PROVEN_BUILD if self.recorded else PROVEN_INTERNAL

    def to_dict(self) -> dict[str, Any]:
        return {"package": self.package, "files": self.files,
                "bytes_hashed": self.bytes_hashed, "ok": self.ok, "proven": self.proven,
                "prepared": self.prepared,
                "problems": [p.to_dict() for p in self.problems]}


def verify_package(folder: str | os.PathLike[str], jobs: int = 1,
                   digest: Callable[[str, Path], str] | None = None, *,
                   progress: bool | None = False, store: Path | None = None,
                   hashed: bool = True) -> VerifyReport:
    """Re-hash every file of a package against its summary; unlisted files are problems too.

    ``digest(algo, path)`` defaults to a full re-hash; the up-to-date check passes a stat
    cache instead. ``hashed=False`` reads no file's bytes: every listed file is still
    checked for its kind (a regular file, never followed through a link) and size, and
    every unlisted or non-regular file is still a problem; only the digests are not.
    ``progress``: a bar over the bytes (None: only on a terminal).
    ``store``: a store whose action record of the build, when it has one, must name this
    very summary (a ``build`` problem otherwise; see :mod:`weightstore.packaging.proof`).
    """
    from .proof import NOT_THE_BUILD, recorded_build

    folder = Path(folder)
    summary_bytes, summary = read_summary_bytes(folder)
    report = VerifyReport(summary.get("package", folder.name))
    recorded = recorded_build(store, summary_bytes, summary)
    report.recorded = recorded is True
    if recorded is False:
        report.problems.append(Problem("build", SUMMARY_NAME, NOT_THE_BUILD))
    contents: Sequence[dict[str, Any]] = summary["contents"]

    def hash_of(algo: str, path: Path) -> str:
        return make_key(algo, digest_file(algo, path))

    digest = digest or hash_of

    def check(entry: dict[str, Any]) -> Problem | None:
        path = folder / entry["path"]
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                return Problem("missing", entry["path"], "not a regular file")
            if st.st_size != entry["size"]:
                return Problem("size", entry["path"],
                               f"{st.st_size} bytes, the summary says {entry['size']}")
            if not hashed:
                return None
            algo = entry["digest"].partition(":")[0]
            actual = digest(algo, path)
        except FileNotFoundError:
            return Problem("missing", entry["path"], "not in the package")
        except (OSError, ValueError) as exc:
            return Problem("unreadable", entry["path"], str(exc))
        if actual != entry["digest"]:
            return Problem("digest", entry["path"],
                           f"content is {actual}, the summary says {entry['digest']}")
        return None

    def counted(entry: dict[str, Any]) -> Problem | None:
        found = check(entry)
        bar.advance(entry["size"])
        return found

    from ..progress import Progress

    with Progress("verifying", sum(e["size"] for e in contents), enabled=progress) as bar:
        if jobs <= 1:  # the up-to-date check: digests mostly cached, no pool to start
            found = list(map(counted, contents))
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(jobs) as pool:
                found = list(pool.map(counted, contents))
    report.files = len(contents)
    report.bytes_hashed = sum(e["size"] for e, p in zip(contents, found, strict=True)
                              if hashed and (p is None or p.kind == "digest"))
    report.problems += [p for p in found if p is not None]
    listed = {e["path"] for e in contents}
    try:
        present = package_files(folder)
    except PackageError as exc:
        report.problems.append(Problem("unexpected", exc.context.get("path", ""),
                                       "not a regular file"))
        present = []
    unlisted = [name for name in present if name not in listed]
    if any(name.startswith("prepared/") for name in unlisted):
        from ..resolve.prepared_record import companion_contents, prepared_proof

        records, graphs = companion_contents(unlisted, folder)
        report.files += len(graphs)
        report.problems += [p for p in map(check, graphs) if p is not None]
        report.prepared = [prepared_proof(folder, r, g["path"])
                           for r, g in zip(records, graphs, strict=True)]
        known = {*records, *(g["path"] for g in graphs)}
        unlisted = [name for name in unlisted if name not in known]
    report.problems += [Problem("unexpected", name, "not listed in the summary")
                        for name in unlisted]
    report.problems.sort(key=lambda p: p.path)
    return report


def verified_package(folder: str | os.PathLike[str], *, hashed: bool = True,
                     jobs: int = 1) -> VerifyReport:
    """:func:`verify_package`, with any problem raised: what ``verify`` refuses, a reader
    that takes the folder's word for its files (``diff``, ``release``) refuses too, with
    the first problem in one line (an :class:`IntegrityError`)."""
    report = verify_package(folder, jobs=jobs, hashed=hashed)
    if report.problems:
        raise IntegrityError(f"package differs from its summary: {report.problems[0]}",
                             folder=str(folder), problems=len(report.problems))
    return report
