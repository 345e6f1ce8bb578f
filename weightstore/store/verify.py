"""Checking that every indexed object still holds the bytes its key names.

A content-addressed store is only as good as the claim that the bytes behind a key hash to
that key. Verification re-hashes everything (on a thread pool: both digests release the GIL)
and also checks the structure the writers promise: per-weight files named by their digest
and sized exactly, combined ranges inside their file and disjoint. Leftovers that harm
nothing (unindexed object files, temp files no process holds (:mod:`.temps`), in the root
and the cache folders, combined-file bytes no row references) are warnings. A range this
user may not read is reported as ``no_permission``: it is not damage, and repair leaves it
alone.

:func:`verify_store` checks one snapshot of the index without any lock, so builds go on
meanwhile; a finding is kept only if a fresh look shows the same row (gc or compaction may
have moved or removed it). :mod:`weightstore.store.repair` drops the entries behind the
problems from the index.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import IntegrityError
from ..io.digests import digest_file, split_key
from .index import INDEX_NAME, MalformedRow, shown, well_formed
from .layout import kind_of, scan, separate_file_name
from .objects import StoredObject
from .temps import is_resumable
from .temps import leftovers as leftovers_of

ProblemKind = Literal["missing_file", "short_file", "size_mismatch", "digest_mismatch",
                      "name_mismatch", "overlap", "unreadable", "no_permission",
                      "malformed_row", "malformed_root", "malformed_lease",
                      "not_regular_file", "orphan_file", "temp_file", "unreferenced_bytes",
                      "malformed_time", "stale_marker"]

if TYPE_CHECKING:
    from .core import Store


@dataclass(frozen=True)
class Problem:
    """One finding; ``key`` is None for files the index does not mention."""

    kind: ProblemKind
    file: str
    key: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.file, "key": self.key, "detail": self.detail}


@dataclass(frozen=True)
class VerifyReport:
    """Problems make the store untrustworthy; warnings only waste space."""

    root: str
    objects: int
    bytes_hashed: int
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "objects": self.objects,
            "bytes_hashed": self.bytes_hashed,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [w.to_dict() for w in self.warnings],
        }


def verify_objects(root: Path, index: dict[str, StoredObject], jobs: int,
                   trusted: Collection[str] = ()) -> VerifyReport:
    """Check ``index`` against the files under ``root``.

    Keys in ``trusted`` get every check but the re-hash (their bytes were just hashed).
    """
    problems, hashed = check_rows(root, list(index.values()), jobs, trusted)
    ends: dict[str, int] = {}
    for obj in index.values():
        ends[obj.file] = max(ends.get(obj.file, 0), obj.end)
    return VerifyReport(root=str(root), objects=len(index), bytes_hashed=hashed,
                        problems=tuple(sorted(problems, key=_order)),
                        warnings=leftovers(root, ends))


def check_rows(root: Path, objects: list[StoredObject], jobs: int,
               trusted: Collection[str] = (), *, rehash: bool = True,
               progress: Callable[[int], None] | None = None,
               ) -> tuple[list[Problem], int]:
    """The problems of ``objects`` (every row of each file they name), and the bytes
    hashed (none without ``rehash``: structure only). ``progress`` is told the size of
    each object once it is checked."""
    problems: list[Problem] = []
    sizes: dict[str, int | None] = {}
    to_hash: list[StoredObject] = []
    inside: list[StoredObject] = []  # rows whose range lies inside a regular file
    for obj in objects:
        if obj.file not in sizes:
            sizes[obj.file] = _size(root / obj.file)
        problems.extend(_check_shape(obj, sizes[obj.file]))
        file_size = sizes[obj.file]
        fits = file_size is not None and file_size >= 0 and obj.end <= file_size
        if fits:
            inside.append(obj)
        if rehash and fits and obj.key not in trusted:
            to_hash.append(obj)
        elif rehash and progress is not None:
            progress(obj.size)  # nothing to hash: the bar still reaches its end
    # A range past its file's end is the damaged row itself (short_file): judged against
    # it, every intact row it spans would look damaged too.
    problems.extend(_overlaps(inside))

    def check(obj: StoredObject) -> Problem | None:
        found = _check_digest(root, obj)
        if progress is not None:
            progress(obj.size)
        return found

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        problems.extend(p for p in pool.map(check, to_hash) if p is not None)
    return problems, sum(o.size for o in to_hash)


def leftovers(root: Path, ends: dict[str, int]) -> tuple[Problem, ...]:
    """Warnings about what no row covers; ``ends``: each indexed file's last range end."""
    listing = scan(root)
    warnings = [Problem("orphan_file", name, None, f"{size} bytes no index entry refers to")
                for name, size in listing.objects.items() if name not in ends]
    warnings += [Problem("temp_file", name, None,
                         "a pull's partial download no pull holds, kept to be resumed; gc "
                         "removes it" if is_resumable(name.rpartition("/")[2]) else
                         "left by a killed write (no process holds it); the next write "
                         "to the store or gc removes it")
                 for name in leftovers_of(root)]
    warnings += [Problem("unreferenced_bytes", name, None,
                         f"{size - ends[name]} bytes past the last indexed range (an "
                         f"interrupted append); gc's compaction reclaims them")
                 for name, size in listing.objects.items()
                 if name in ends and kind_of(name) == "combined" and size > ends[name]]
    return tuple(sorted(warnings, key=_order))


def _check_shape(obj: StoredObject, file_size: int | None) -> list[Problem]:
    if file_size is None:
        return [Problem("missing_file", obj.file, obj.key, "file does not exist")]
    if file_size < 0:
        return [Problem("not_regular_file", obj.file, obj.key,
                        "not a regular file (a symlink or a folder)")]
    found: list[Problem] = []
    if obj.kind == "separate":
        expected = separate_file_name(obj.key)
        if obj.file != expected:
            found.append(Problem("name_mismatch", obj.file, obj.key,
                                 f"per-weight file for this key must be named {expected}"))
        if obj.offset != 0 or file_size != obj.size:
            found.append(Problem("size_mismatch", obj.file, obj.key,
                                 f"file has {file_size} bytes; index says {obj.size} bytes "
                                 f"at offset {obj.offset}"))
    elif obj.end > file_size:
        found.append(Problem("short_file", obj.file, obj.key,
                             f"file has {file_size} bytes; range [{obj.offset}, {obj.end}) "
                             f"runs past its end"))
    return found


def _overlaps(objects: Iterable[StoredObject]) -> list[Problem]:
    """Non-empty ranges of one file that share bytes (the writers never produce these)."""
    by_file: dict[str, list[StoredObject]] = defaultdict(list)
    for obj in objects:
        if obj.size:
            by_file[obj.file].append(obj)
    found: list[Problem] = []
    for file, objs in by_file.items():
        objs.sort(key=lambda o: (o.offset, o.end, o.key))
        reach: StoredObject | None = None
        for obj in objs:
            if reach is not None and obj.offset < reach.end:
                found.append(Problem("overlap", file, obj.key,
                                     f"range [{obj.offset}, {obj.end}) overlaps "
                                     f"[{reach.offset}, {reach.end}) of {reach.key}"))
            if reach is None or obj.end > reach.end:
                reach = obj
    return found


def _check_digest(root: Path, obj: StoredObject) -> Problem | None:
    algo, expected = split_key(obj.key)
    try:
        actual = digest_file(algo, root / obj.file, obj.offset, obj.size)
    except PermissionError as exc:
        return Problem("no_permission", obj.file, obj.key,
                       f"this user may not read it ({exc.strerror}); left alone")
    except (OSError, IntegrityError) as exc:
        return Problem("unreadable", obj.file, obj.key, f"cannot read the range: {exc}")
    if actual != expected:
        return Problem("digest_mismatch", obj.file, obj.key,
                       f"bytes [{obj.offset}, {obj.end}) hash to {algo}:{actual}")
    return None


def _size(path: Path) -> int | None:
    """The size of a regular file; None when missing, -1 when it is something else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


VERIFY_BATCH = 20_000  # rows checked at a time: memory stays flat however large the store


def verify_store(store: Store, jobs: int, *, rehash: bool = True,
                 progress: bool | None = False) -> VerifyReport:
    """Verify one snapshot of ``store``'s index, streamed in batches of whole files, then
    keep the findings that still hold (``rehash=False``: structure only). ``progress``:
    a bar over the bytes to hash (None: only on an interactive terminal)."""
    from ..progress import Progress

    with store.index.reading() as conn:
        files = store.index.files(conn)
        ends = {file: end for file, _, _, end in files}
        total = sum(size or 0 for _, _, size, _ in files) if rehash else 0
        with Progress("verifying", total, enabled=progress if rehash else False) as bar:
            checked = check_snapshot(store, conn, jobs, rehash=rehash, progress=bar.advance)
        problems = [*checked.problems, *table_problems(conn)]
        odd_times = time_warnings(conn)
    report = VerifyReport(root=str(store.root), objects=checked.objects,
                          bytes_hashed=checked.hashed,
                          problems=tuple(sorted(problems, key=_order)),
                          warnings=tuple(sorted((*leftovers(store.root, ends), *odd_times,
                                                 *marker_warnings(store)), key=_order)))
    return still_current(store, report, checked.rows)


@dataclass(frozen=True)
class SnapshotCheck:
    """What :func:`check_snapshot` found: the problems of the ``objects`` rows, the rows
    behind them (for :func:`still_current`), how many rows and bytes it checked."""

    problems: tuple[Problem, ...]
    rows: dict[str, StoredObject]
    objects: int
    hashed: int

    def report(self, root: str) -> VerifyReport:
        return VerifyReport(root=root, objects=self.objects, bytes_hashed=self.hashed,
                            problems=tuple(sorted(self.problems, key=_order)), warnings=())


def check_snapshot(store: Store, conn: Any, jobs: int, *, rehash: bool = True,
                   progress: Callable[[int], None] | None = None) -> SnapshotCheck:
    """Every row of the ``objects`` table in the snapshot ``conn``, checked against the
    files (malformed rows, shapes, overlaps and, with ``rehash``, each range hashed
    against its key), in batches of whole files: memory stays flat however large the
    store. Nothing here is filtered by a fresh look: see :func:`still_current`."""
    problems: list[Problem] = []
    seen: dict[str, StoredObject] = {}
    objects = hashed = 0
    batch: list[StoredObject] = []
    for obj in store.index.objects_by_file(conn):
        if isinstance(obj, MalformedRow):
            problems.append(Problem("malformed_row", obj.file, obj.key, obj.detail))
            objects += 1
            continue
        if len(batch) >= VERIFY_BATCH and obj.file != batch[-1].file:
            objects, hashed = _run(store, batch, jobs, rehash, problems, seen, objects,
                                   hashed, progress)
            batch = []
        batch.append(obj)
    objects, hashed = _run(store, batch, jobs, rehash, problems, seen, objects, hashed,
                           progress)
    return SnapshotCheck(tuple(problems), seen, objects, hashed)


def marker_warnings(store: Store) -> list[Problem]:
    """``meta.json`` that is neither the format 2 marker nor an export: an older
    weightstore could take it for its index and write objects no index row records."""
    from .meta import is_current

    if not store.index.initialised() or is_current(store.meta_path) is not False:
        return []  # no index yet: a format 1 meta.json is the index, migrated on write
    return [Problem("stale_marker", store.meta_path.name, None,
                    "not the format 2 marker an older weightstore refuses; "
                    "'store verify --repair' writes it again")]


def table_problems(conn: Any) -> list[Problem]:
    """The damaged rows of the tables beside ``objects`` (see :mod:`.roots` and
    :mod:`.leases` for what each must hold), as problems of the index file."""
    from . import leases, roots

    found = [Problem("malformed_root", INDEX_NAME, None,
                     f"roots row {rid}: {detail}; repair "
                     + ("keeps it, created set to now and pinned to 1 where they are "
                        "wrong" if kept else "drops it with its keys"))
             for rid, detail, kept in roots.malformed_roots(conn)]
    found += [Problem("malformed_root", INDEX_NAME, None,
                      f"root_keys row ({shown(root)}, {shown(key)}): {detail}; repair drops it")
              for root, key, detail in roots.malformed_root_keys(conn)]
    found += [Problem("malformed_lease", INDEX_NAME, None,
                      f"leases row {lease}: {detail}; repair drops it with its keys")
              for lease, detail in leases.malformed_leases(conn)]
    found += [Problem("malformed_lease", INDEX_NAME, None,
                      f"lease_keys row ({shown(lease)}, {shown(key)}): {detail}; repair drops "
                      f"it") for lease, key, detail in leases.malformed_lease_keys(conn)]
    return found


def time_warnings(conn: Any) -> list[Problem]:
    """Objects whose ``created`` is not an integer, one warning per file: gc's grace
    cannot judge them (text or bytes sort after every time: never collected), which
    wastes space at worst; repair sets the time to now."""
    return [Problem("malformed_time", file, None,
                    f"{count} row(s) whose created is not a unix time (e.g. "
                    f"{shown(example)}): gc's grace cannot judge them; repair sets it to now")
            for file, count, example in conn.execute(
                f"SELECT file, count(*), min(created) FROM objects "
                f"WHERE typeof(created) != 'integer' AND {well_formed()} GROUP BY file")]


def _run(store: Store, batch: list[StoredObject], jobs: int, rehash: bool,
         problems: list[Problem], seen: dict[str, StoredObject], objects: int, hashed: int,
         progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    found, n = check_rows(store.root, batch, jobs, rehash=rehash, progress=progress)
    rows = {obj.key: obj for obj in batch}
    for p in found:
        if p.key is not None:
            seen[p.key] = rows[p.key]
    problems.extend(found)
    return objects + len(batch), hashed + n


def still_current(store: Store, report: VerifyReport,
                  snapshot: dict[str, StoredObject]) -> VerifyReport:
    """Drop the problems whose row changed or vanished since the snapshot."""
    keys = [p.key for p in report.problems if p.key is not None]
    if not keys:
        return report
    now = store.index.locate(keys)
    kept = tuple(p for p in report.problems
                 if p.key is None or now.get(p.key) == snapshot.get(p.key))
    return VerifyReport(root=report.root, objects=report.objects,
                        bytes_hashed=report.bytes_hashed, problems=kept,
                        warnings=report.warnings)


def _order(p: Problem) -> tuple[str, str, str]:
    return (p.file, p.key or "", p.kind)
