"""The weight store: deduplicated, content-addressed payload bytes shared by every build.

Writers serialise on one lock and decide what is missing only while holding it, so a payload
is written once no matter how many builds race to add it. Readers (``lookup``, ``index``,
``stats``, ``read``) need no lock: ``meta.json`` is only ever replaced whole, and an object is
indexed only after its bytes are durable and hash to its key. See
:mod:`weightstore.store.writer` for the layout.

The root folder is created by the first write (``put``), never by reading: ``stats``,
``verify`` and ``repair`` of a folder that does not exist are a :class:`StoreError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import IntegrityError, StoreError
from ..fsio import read_exact
from ..hashing import split_key
from .index import StoredObject, read_index, write_index
from .layout import LOCK_NAME, META_NAME, combined_file_name, is_safe_component
from .lock import store_lock
from .payload import PayloadSource
from .repair import RepairReport, drop_damaged
from .stats import StoreStats, compute_stats
from .verify import VerifyReport, verify_objects
from .writer import WriteOutcome, append_combined, write_separate

PutKind = Literal["separate", "combined"]


@dataclass(frozen=True)
class PutReport:
    """What one ``put`` did; ``objects`` maps every requested key to where it lives now."""

    objects: dict[str, StoredObject]
    written_objects: int
    written_bytes: int
    reused_objects: int
    reused_bytes: int
    padding_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "written_objects": self.written_objects,
            "written_bytes": self.written_bytes,
            "reused_objects": self.reused_objects,
            "reused_bytes": self.reused_bytes,
            "padding_bytes": self.padding_bytes,
        }


class WeightStore:
    """A store root on disk; cheap to construct, holds no open files between calls.

    Constructing one creates nothing: the root folder is made by the first ``put``.
    """

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 600.0) -> None:
        self.root = Path(root).absolute()
        self.lock_timeout = lock_timeout
        if self.root.exists() and not self.root.is_dir():
            raise StoreError("store root exists and is not a folder", path=str(self.root))

    def __repr__(self) -> str:
        return f"WeightStore({str(self.root)!r})"

    @property
    def meta_path(self) -> Path:
        return self.root / META_NAME

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    # -- writing -----------------------------------------------------------------------

    def put(self, payloads: Iterable[PayloadSource], *, kind: PutKind,
            combined_name: str | None = None, alignment: int = 512,
            jobs: int = 4) -> PutReport:
        """Store the payloads that are not already present; report where every key lives.

        Every object written is re-hashed and compared with its key before it is indexed;
        bytes that do not match (a source changed after it was hashed) raise
        :class:`IntegrityError` naming the key and the source, and are not indexed.
        On an exception the objects completed so far are still indexed (their bytes are
        durable and verified), nothing partial remains under a final name, and the exception
        propagates. Creates the root folder if needed.
        """
        combined_file = _check_put_args(kind, combined_name, alignment, jobs)
        wanted = _collapse(payloads)
        self._make_root()
        if not wanted:
            return PutReport({}, 0, 0, 0, 0, 0)
        with store_lock(self.root, self.lock_timeout):
            index = read_index(self.meta_path)
            present = self._present(index, wanted)
            missing = [src for key, src in wanted.items() if key not in present]
            if combined_file is None:
                outcome = write_separate(self.root, missing, jobs)
            else:
                indexed_end = max((o.end for o in index.values() if o.file == combined_file),
                                  default=0)
                outcome = append_combined(self.root, combined_file, missing, alignment,
                                          indexed_end, jobs)
            _publish(self.meta_path, index, outcome)
        written = {obj.key: obj for obj in outcome.objects}
        located = {**present, **written}
        return PutReport(
            objects={key: located[key] for key in wanted},
            written_objects=len(written),
            written_bytes=outcome.written_bytes,
            reused_objects=len(present),
            reused_bytes=sum(obj.size for obj in present.values()),
            padding_bytes=outcome.padding_bytes,
        )

    def _present(self, index: dict[str, StoredObject],
                 wanted: dict[str, PayloadSource]) -> dict[str, StoredObject]:
        """Indexed keys whose bytes are really there (a crash or a user may remove files).

        Only sizes are checked here; bytes damaged on disk after they were written are found
        by :meth:`verify` and dropped from the index by :meth:`repair`.
        """
        sizes: dict[str, int | None] = {}
        present: dict[str, StoredObject] = {}
        for key, src in wanted.items():
            obj = index.get(key)
            if obj is None:
                continue
            if obj.size != src.size:
                raise IntegrityError("payload size disagrees with the stored object of the "
                                     "same key", key=key, size=src.size, stored=obj.size,
                                     file=obj.file)
            if obj.file not in sizes:
                try:
                    sizes[obj.file] = os.stat(self.root / obj.file).st_size
                except FileNotFoundError:
                    sizes[obj.file] = None
            file_size = sizes[obj.file]
            if file_size is None:
                continue
            if obj.kind == "separate":
                if obj.offset == 0 and file_size == obj.size:
                    present[key] = obj
            elif file_size >= obj.end:
                present[key] = obj
        return present

    # -- reading -----------------------------------------------------------------------

    def lookup(self, key: str) -> StoredObject | None:
        split_key(key)
        return read_index(self.meta_path).get(key)

    def index(self) -> dict[str, StoredObject]:
        """A snapshot of the whole index (one read of ``meta.json``)."""
        return read_index(self.meta_path)

    def path_of(self, obj: StoredObject) -> Path:
        if not is_safe_component(obj.file):
            raise StoreError("stored object names a file outside the store root",
                             path=str(self.root), file=obj.file, key=obj.key)
        return self.root / obj.file

    def read(self, obj: StoredObject) -> bytes:
        """Exactly the object's bytes; a missing or short file is an IntegrityError."""
        path = self.path_of(obj)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError as exc:
            raise IntegrityError("stored object file is missing", path=str(path),
                                 key=obj.key) from exc
        try:
            return read_exact(fd, obj.offset, obj.size)
        except EOFError as exc:
            raise IntegrityError("stored object file is shorter than its index entry",
                                 path=str(path), key=obj.key, offset=obj.offset,
                                 size=obj.size) from exc
        finally:
            os.close(fd)

    def stats(self) -> StoreStats:
        self._require_root()
        return compute_stats(self.root, read_index(self.meta_path))

    def verify(self, *, jobs: int = 4) -> VerifyReport:
        """Re-hash every object under the lock, so no append is judged half-published.

        A folder no writer ever touched (no index, no lock file) is verified as an empty
        store without taking the lock, so that verifying creates nothing.
        """
        self._require_root()
        if not self.meta_path.exists() and not self.lock_path.exists():
            return verify_objects(self.root, {}, jobs)
        with store_lock(self.root, self.lock_timeout):
            return verify_objects(self.root, read_index(self.meta_path), jobs)

    def repair(self, *, jobs: int = 4) -> RepairReport:
        """Verify under the lock and drop every entry whose bytes are damaged.

        Entries with a missing, short, resized, misnamed, overlapping, unreadable or
        mismatching range leave the index (``meta.json`` is replaced atomically); the
        per-weight files only they referred to are then deleted, while ranges of combined
        files are only unindexed. The next ``put`` of those keys writes them again. The
        report's ``remaining`` re-checks what is left (structure only: the bytes kept were
        hashed moments ago under the same lock).
        """
        self._require_root()
        with store_lock(self.root, self.lock_timeout):
            return drop_damaged(self.root, self.meta_path, read_index(self.meta_path), jobs)

    # -- the root folder ---------------------------------------------------------------

    def _require_root(self) -> None:
        """Reading commands never create the store: a missing root is an error."""
        if not self.root.is_dir():
            raise StoreError("no store at this path", path=str(self.root))

    def _make_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            raise StoreError("store root exists and is not a folder",
                             path=str(self.root)) from exc
        except OSError as exc:
            raise StoreError(f"cannot create the store root: {exc.strerror}",
                             path=str(self.root)) from exc


def _check_put_args(kind: str, combined_name: str | None, alignment: int,
                    jobs: int) -> str | None:
    """Validate before locking; return the combined file name (None for per-weight)."""
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs must be a positive integer (got {jobs!r})")
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two (got {alignment!r})")
    if kind == "separate":
        if combined_name is not None:
            raise ValueError("combined_name applies only to kind='combined'")
        return None
    if kind != "combined":
        raise ValueError(f"kind must be 'separate' or 'combined' (got {kind!r})")
    if combined_name is None:
        raise ValueError("kind='combined' needs a combined_name")
    return combined_file_name(combined_name)


def _collapse(payloads: Iterable[PayloadSource]) -> dict[str, PayloadSource]:
    """First source per key, in input order; duplicates must agree on the size."""
    wanted: dict[str, PayloadSource] = {}
    for src in payloads:
        key, size = src.key, src.size
        split_key(key)
        if type(size) is not int or size < 0:
            raise IntegrityError("payload size must be a non-negative integer", key=key,
                                 size=size)
        first = wanted.get(key)
        if first is None:
            wanted[key] = src
        elif first.size != size:
            raise IntegrityError("two payloads with the same key differ in size", key=key,
                                 size=size, other_size=first.size)
    return wanted


def _publish(meta_path: Path, index: dict[str, StoredObject], outcome: WriteOutcome) -> None:
    """Index the completed objects, then re-raise whatever stopped the rest."""
    try:
        if outcome.objects:
            write_index(meta_path, {**index, **{o.key: o for o in outcome.objects}})
    finally:
        if outcome.error is not None:
            raise outcome.error
