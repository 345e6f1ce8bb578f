"""The weight store's core: deduplicated, content-addressed payload bytes shared by every
build (objects, the index, locks, roots). Its maintenance (verify, repair, gc, compaction,
the sweeps, GE's ``meta.json`` export) sits on top of it and takes a :class:`Store`;
:class:`weightstore.store.store.WeightStore` is the facade of both.

Bytes move outside the store-wide lock; the lock (the SQLite index's write transaction,
see :mod:`weightstore.store.index`) covers only recording rows, so its hold time does not
grow with payload bytes. A payload is indexed only after its bytes are durable and hash to
its key; two writers of one key race harmlessly (one row wins, the other's bytes are
discarded or left as unreferenced bytes that compaction reclaims). Readers (``locate``,
``stats``, ``verify``, ``read``) never wait for writers. Callers never receive the whole
index: they ask where given keys live (:meth:`WeightStore.locate`).

The root folder is created by the first write (``put``), never by reading: ``stats``,
``verify`` and ``repair`` of a folder that does not exist are a :class:`StoreError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import REPAIR_HINT, IntegrityError, StoreError
from ..io.digests import digest_bytes, split_key
from ..io.files import NotRegularFileError, alignment_problem, open_regular, read_exact
from . import leases
from .index import INDEX_NAME, Index
from .layout import (
    COMBINED_SUFFIX,
    LOCK_NAME,
    META_NAME,
    combined_file_name,
    is_safe_component,
    separate_file_name,
)
from .objects import StoredObject
from .payload import FilePayload, PayloadSource
from .writer import WriteOutcome, append_combined, discard, publish_staged, write_separate

if TYPE_CHECKING:
    from .roots import Root, RootRecord
    from .stats import StoreStats

LOCKS_DIR = "locks"
PUT_ATTEMPTS = 3
COMBINED_SIBLINGS = 8  # combined files one model name may append to at the same time
STAGED_AT_ONCE = 128  # per-weight objects staged (held open) before their rows are recorded

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


class Store:
    """A store root on disk; cheap to construct, holds no open files between calls.

    Constructing one creates nothing: the root folder is made by the first ``put``.
    """

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 600.0) -> None:
        self.root = Path(root).absolute()
        self.lock_timeout = lock_timeout
        if self.root.exists() and not self.root.is_dir():
            raise StoreError("store root exists and is not a folder", path=str(self.root))
        self.index = Index(self.root, lock_timeout)
        self._lease: tuple[int, int] | None = None  # (pid, lease id) of this process

    def __repr__(self) -> str:
        return f"WeightStore({str(self.root)!r})"

    @property
    def meta_path(self) -> Path:
        return self.root / META_NAME

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    @property
    def lock_path(self) -> Path:
        """Format 1's lock file: taken only while a format 1 store is migrated."""
        return self.root / LOCK_NAME

    # -- leases ------------------------------------------------------------------------

    @contextlib.contextmanager
    def leased(self) -> Iterator[Store]:
        """Hold every key this store object locates or puts until the block ends, so that
        gc and compaction running meanwhile never take them away (see :mod:`.leases`)."""
        self._make_root()
        if not self.writable():  # no gc can run on it either: nothing to protect from
            yield self
            return
        # a lease dies with its process: a crash makes its rows moot, no sync for them
        with self.index.writing(durable=False) as conn:
            lease = leases.open_lease(conn)
        self._lease = (os.getpid(), lease)
        try:
            yield self
        finally:
            self._lease = None
            with contextlib.suppress(StoreError), self.index.writing(durable=False) as conn:
                leases.close_lease(conn, lease)

    def open_for_writing(self) -> list[str]:
        """Do now what the first write does: a store of an older format is migrated (once,
        under format 1's lock), ``meta.json``'s marker put back, the temp files of killed
        writers swept (:mod:`.temps`; returned). For gc and repair, which must plan on the
        store they change. Nothing happens to a store that does not exist or that this
        user may only read."""
        if not self.root.is_dir() or not self.writable():
            return []
        with self.index.writing():
            pass
        return self.index.take_swept()

    def writable(self) -> bool:
        """False for a store this user may only read (permissions, a read-only mount):
        it still verifies and serves builds whose payloads are all present."""
        if not self.root.is_dir():
            return True  # the first write creates it (or says why it cannot)
        return self.index.writable()

    def _lease_id(self) -> int | None:
        if self._lease is not None and self._lease[0] == os.getpid():
            return self._lease[1]
        return None

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
        located: dict[str, StoredObject] = {}
        written: dict[str, StoredObject] = {}
        padding = 0
        todo = dict(wanted)
        for _ in range(PUT_ATTEMPTS):  # a key gc took between our look and our commit
            if not todo:
                break
            rows = self.index.locate(todo)
            present = self._present(rows, todo)
            missing = [src for key, src in todo.items() if key not in present]
            # rows whose bytes were not intact: our new bytes replace them
            stale = {key: rows[key] for key in rows if key not in present}
            if not missing and self._lease_id() is None:
                located.update(present)  # nothing to write or to hold: no write lock
                todo = {}
                break
            if combined_file is None:
                outcome, found, new = self._put_separate(todo, missing, stale, jobs)
            else:
                with self._free_combined(combined_file) as file:
                    # appends to this file are ours alone now; look again
                    present = self._present(self.index.locate(s.key for s in missing),
                                            todo)
                    missing = [src for src in missing if src.key not in present]
                    outcome = append_combined(self.root, file, missing, alignment, jobs)
                    found, new = self._record(todo, outcome, stale, publish=False)
            _report_resized(stale, new, todo)
            located.update(found)
            written.update(new)
            padding += outcome.padding_bytes
            if outcome.error is not None:
                raise outcome.error
            todo = {k: v for k, v in todo.items() if k not in found and k not in new}
        if todo:
            raise StoreError("payloads kept vanishing from the store while being stored "
                             "(a gc running without leases?)", path=str(self.root),
                             key=next(iter(todo)))
        located.update(written)
        return PutReport(
            objects={key: located[key] for key in wanted},
            written_objects=len(written),
            written_bytes=sum(o.size for o in written.values()),
            reused_objects=len(wanted) - len(written),
            reused_bytes=sum(wanted[k].size for k in wanted if k not in written),
            padding_bytes=padding,
        )

    def _put_separate(self, todo: dict[str, PayloadSource], missing: list[PayloadSource],
                      stale: dict[str, StoredObject], jobs: int,
                      ) -> tuple[WriteOutcome, dict[str, StoredObject],
                                 dict[str, StoredObject]]:
        """Stage and record ``missing`` per-weight objects, at most :data:`STAGED_AT_ONCE`
        at a time (each staged file stays open, held, until it is renamed into place); the
        first transaction also looks at every key of ``todo``. Returns the last outcome
        (its error stops the rest), and (already present, written)."""
        found: dict[str, StoredObject] = {}
        new: dict[str, StoredObject] = {}
        at_once = _staged_at_once()
        for start in range(0, max(len(missing), 1), at_once):
            chunk = missing[start:start + at_once]
            outcome = write_separate(self.root, chunk, jobs)
            wanted = todo if start == 0 else {src.key: src for src in chunk}
            present, written = self._record(wanted, outcome, stale, publish=True)
            found.update(present)
            new.update(written)
            if outcome.error is not None:
                break
        return outcome, found, new

    def _record(self, wanted: dict[str, PayloadSource], outcome: WriteOutcome,
                stale: dict[str, StoredObject], *, publish: bool,
                ) -> tuple[dict[str, StoredObject], dict[str, StoredObject]]:
        """The store-wide critical section of a put: look at the rows once more, rename
        staged per-weight objects into place, insert rows. Returns (already present,
        written)."""
        staged = dict(zip((o.key for o in outcome.objects), outcome.staged, strict=False))
        new: dict[str, StoredObject] = {}
        renamed: list[Path] = []
        try:
            with self.index.writing() as conn:
                self._hold(conn, wanted)
                present = {key: obj for key, obj in
                           self._present(self.index.locate(wanted, conn), wanted).items()
                           if stale.get(key) != obj}
                new = {o.key: o for o in outcome.objects if o.key not in present}
                if publish:
                    publish_staged(self.root, list(new.values()),
                                   [staged[k] for k in new], renamed)
                self.index.insert(conn, new.values())
        finally:
            if publish:  # any temp file not renamed into place goes
                discard([p for p in staged.values() if p not in renamed])
        return present, new

    def heal(self, src: PayloadSource, damaged: StoredObject | None = None) -> StoredObject:
        """Rewrite the object of ``src.key`` from ``src`` (bytes verified against the key
        first): a per-weight file is replaced, a combined range is appended again and its
        row re-pointed (the damaged range becomes unreferenced bytes for compaction).
        ``damaged``: the object found damaged; the rewrite is then reported on stderr,
        naming it and ``src.describe()``."""
        healed = self._rewrite(src)
        if damaged is not None:
            print(f"weightstore: store object {src.key} in {damaged.file} at offset "
                  f"{damaged.offset} was damaged; rewritten from {src.describe()}",
                  file=sys.stderr, flush=True)
        return healed

    def _rewrite(self, src: PayloadSource) -> StoredObject:
        old = self.lookup(src.key)
        if old is None or old.kind == "separate":
            outcome = write_separate(self.root, [src], 1)
            if outcome.error is not None:
                raise outcome.error
            try:
                renamed: list[Path] = []
                with self.index.writing() as conn:
                    self._hold(conn, [src.key])
                    publish_staged(self.root, outcome.objects, outcome.staged, renamed)
                    self.index.insert(conn, outcome.objects)
            finally:
                discard([p for p in outcome.staged if p not in renamed])
            return outcome.objects[0]
        with self._free_combined(old.file) as file:  # a sibling when it is not appendable
            outcome = append_combined(self.root, file, [src], _alignment_of(old), 1)
            if outcome.error is not None:
                raise outcome.error
            with self.index.writing() as conn:
                self._hold(conn, [src.key])
                self.index.insert(conn, outcome.objects)
        return outcome.objects[0]

    def adopt(self, key: str, path: str | os.PathLike[str]) -> StoredObject:
        """Index a file the caller wrote in the store root (a temp name) as the per-weight
        object of ``key``, by renaming it into place: no copy, no second read.

        The caller must have hashed exactly the bytes it wrote to the file (as a registry
        pull does while streaming) and found ``key``, and fsynced it; the file is renamed
        in the transaction that records its row, or removed when the key is present.
        """
        return self.adopt_many({key: path})[key]

    def adopt_many(self, paths: dict[str, str | os.PathLike[str]]) -> dict[str, StoredObject]:
        """:meth:`adopt` for several files in one transaction (one commit, one directory
        fsync): a pull adopts together the blobs that finished while another commit ran."""
        objects, staged, wanted = [], [], {}
        for key, path in paths.items():
            split_key(key)
            tmp = Path(path)
            if tmp.parent != self.root or not tmp.name.startswith("."):
                raise StoreError("only a temp file in the store root can be adopted",
                                 path=str(tmp), key=key)
            obj = StoredObject(key=key, file=separate_file_name(key), offset=0,
                               size=tmp.stat().st_size)
            objects.append(obj)
            staged.append(tmp)
            wanted[key] = FilePayload(key=key, size=obj.size, path=str(tmp))
        outcome = WriteOutcome(objects=tuple(objects), padding_bytes=0, staged=tuple(staged),
                               written_bytes=sum(o.size for o in objects))
        rows = self.index.locate(wanted)
        stale = {k: rows[k] for k in rows if k not in self._present(rows, wanted)}
        found, new = self._record(wanted, outcome, stale, publish=True)
        merged = {**found, **new}
        return {key: merged[key] for key in paths}

    def _hold(self, conn: Any, keys: Iterable[str]) -> None:
        lease = self._lease_id()
        if lease is not None:
            leases.hold(conn, lease, keys)

    def _present(self, rows: dict[str, StoredObject],
                 wanted: dict[str, PayloadSource]) -> dict[str, StoredObject]:
        """Indexed keys whose bytes are really there (a crash or a user may remove files).

        Only sizes are checked here; bytes damaged on disk after they were written are found
        by :meth:`verify` and dropped from the index by :meth:`repair`. A per-weight object
        that is not a regular file (a symlink) is damage: the key is written again. So is
        a row whose size is not the payload's (the key is a digest of the payload's bytes:
        the row, not the payload, is wrong): the payload is written again and its new row
        replaces the old one (the bytes the old one pointed at are left to compaction).
        """
        sizes: dict[str, int | None] = {}
        present: dict[str, StoredObject] = {}
        for key, obj in rows.items():
            src = wanted[key]
            if obj.size != src.size:
                continue  # damage: written again
            if obj.file not in sizes:
                sizes[obj.file] = self._file_size(obj.file)
            file_size = sizes[obj.file]
            if file_size is None:
                continue
            if obj.kind == "separate":
                if obj.offset == 0 and file_size == obj.size:
                    present[key] = obj
            elif file_size >= obj.end:
                present[key] = obj
        return present

    def _file_size(self, file: str) -> int | None:
        """Size of a regular store file; None when it is missing or not a regular file."""
        if not is_safe_component(file):
            return None
        try:
            st = os.lstat(self.root / file)
        except OSError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    @contextlib.contextmanager
    def _free_combined(self, file: str) -> Iterator[str]:
        """Hold the lock of ``file``, or of a sibling when another writer is appending to
        it (``<name>.1_weight_combined`` ...): two builds of same-named models append side
        by side instead of in turn. Where a payload sits never matters to a package. A name
        taken by something that is not a regular file (damage: a FIFO, a symbolic link)
        is passed over the same way."""
        stem = file[: -len(COMBINED_SUFFIX)]
        for n in range(COMBINED_SIBLINGS):
            name = file if n == 0 else f"{stem}.{n}{COMBINED_SUFFIX}"
            if not self._appendable(name):
                continue
            try:
                lock = self.file_lock(name, timeout=0)
                lock.__enter__()
            except StoreError:
                continue
            try:
                yield name
            finally:
                lock.__exit__(None, None, None)
            return
        with self.file_lock(file):  # every sibling busy: wait for the first
            yield file

    def _appendable(self, file: str) -> bool:
        """``file`` is absent or a regular file (never appended to otherwise)."""
        try:
            return stat.S_ISREG(os.lstat(self.root / file).st_mode)
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def file_lock(self, file: str, timeout: float | None = None, *, removable: bool = False):
        """The lock of one combined file: appends and compaction of it take turns. Its
        lock file is removed on release when the combined file no longer exists (compacted
        away, or emptied by gc), so ``locks/`` does not grow with every compaction; every
        taker checks that it locked the file at the path (see
        :func:`weightstore.io.locks.file_lock`), which makes the removal safe.
        ``removable``: a lock of something transient (one blob being pulled), whose file
        goes whenever it is released."""
        from ..io.locks import file_lock

        folder = self.root / LOCKS_DIR
        folder.mkdir(exist_ok=True)
        path = self.root / file
        return file_lock(folder / f"{file}.lock",
                         self.lock_timeout if timeout is None else timeout, StoreError,
                         f"store file {file}", removable=removable,
                         remove_if=None if removable else lambda: not os.path.lexists(path))

    # -- reading -----------------------------------------------------------------------

    def locate(self, keys: Iterable[str]) -> dict[str, StoredObject]:
        """Where each of ``keys`` lives (absent keys are left out): batched indexed
        lookups, so time and memory follow the number of keys, not the store's size.

        Under :meth:`leased`, the keys are held in the same transaction.
        """
        keys = list(keys)
        for key in keys:
            split_key(key)
        lease = self._lease_id()
        if lease is None:
            return self.index.locate(keys)
        with self.index.writing() as conn:
            leases.hold(conn, lease, keys)
            return self.index.locate(keys, conn)

    def missing(self, payloads: Iterable[PayloadSource]) -> list[str]:
        """Keys of ``payloads`` the store does not hold intact (what a put would write)."""
        wanted = _collapse(payloads)
        present = self._present(self.index.locate(wanted), wanted)
        return [key for key in wanted if key not in present]

    def still_missing(self, payloads: Iterable[PayloadSource]) -> list[str]:
        """Of ``payloads``, found missing by an earlier :meth:`missing`, the keys still
        missing now: what a pull asks once it holds a blob's partial file. Another pull
        brings a blob as a per-weight object, renamed into place before its transaction
        commits: a key whose per-weight file is not there is still missing, with no look
        at the index; one whose file is there is looked up once the index's write lock
        has been had (that commit done). A build that put a key into a combined file
        meanwhile is not seen: the key is downloaded once more, and its adoption finds it
        present (:meth:`adopt_many`)."""
        payloads = list(payloads)
        placed = [p for p in payloads
                  if os.path.lexists(self.root / separate_file_name(p.key))]
        if not placed:
            return [p.key for p in payloads]
        with self.index.writing():
            pass
        found = set(p.key for p in placed) - set(self.missing(placed))
        return [p.key for p in payloads if p.key not in found]

    def lookup(self, key: str) -> StoredObject | None:
        """Where the object of ``key`` lies (file, offset, size), or None."""
        return self.locate([key]).get(key)

    def objects(self) -> Iterator[StoredObject]:
        """Every object, by key, streamed from one snapshot (for export and tests)."""
        with self.index.reading() as conn:
            yield from self.index.objects(conn)

    def object_ages(self) -> list[tuple[int, int]]:
        """``(created, size)`` of every well-formed object row (created: unix seconds, as
        the index recorded it), from one snapshot; a row whose time is not an integer is
        left out, as damage is (repair's)."""
        from .index import well_formed

        with self.index.reading() as conn:
            rows = conn.execute(f"SELECT created, size FROM objects WHERE {well_formed()}")
            return [(c, n) for c, n in rows if type(c) is int]

    def path_of(self, obj: StoredObject) -> Path:
        """The store file holding ``obj``; a file name that would leave the store root is
        a StoreError."""
        if not is_safe_component(obj.file):
            raise StoreError("stored object names a file outside the store root",
                             path=str(self.root), file=obj.file, key=obj.key)
        return self.root / obj.file

    def read(self, obj: StoredObject) -> bytes:
        """Exactly the object's bytes, hashed against its key: a missing or short file, or
        bytes that do not match, is an IntegrityError naming the file, offset and repair."""
        data = self._read_raw(obj)
        algo, expected = split_key(obj.key)
        if digest_bytes(algo, data) != expected:
            raise IntegrityError("stored object does not match its key", key=obj.key,
                                 path=str(self.path_of(obj)), offset=obj.offset,
                                 size=obj.size, hint=REPAIR_HINT)
        return data

    def open_object(self, obj: StoredObject) -> int:
        """A descriptor of ``obj``'s file, for reading. Every read of a store object opens
        it here: anything but a regular file (a FIFO, whose open would wait for a writer
        forever, a device, a folder, a symbolic link) is refused without blocking, as the
        damage it is, and so is a missing file."""
        path = self.path_of(obj)
        try:
            return open_regular(path, nofollow=True)
        except FileNotFoundError:
            problem = "stored object file is missing"
        except NotRegularFileError as exc:
            problem = f"stored object file is {exc}"
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
            problem = "stored object file is a symbolic link"
        raise IntegrityError(problem, path=str(path), key=obj.key, hint=REPAIR_HINT)

    def _read_raw(self, obj: StoredObject) -> bytes:
        path = self.path_of(obj)
        fd = self.open_object(obj)
        try:
            return read_exact(fd, obj.offset, obj.size)
        except EOFError as exc:
            raise IntegrityError("stored object file is shorter than its index entry",
                                 path=str(path), key=obj.key, offset=obj.offset,
                                 size=obj.size, hint=REPAIR_HINT) from exc
        finally:
            os.close(fd)

    def stats(self) -> StoreStats:
        """Objects, payload bytes, bytes on disk, padding and unreferenced bytes, from one
        snapshot of the index (``weightstore store stats``)."""
        from .stats import compute_stats

        self._require_root()
        with self.index.reading() as conn:
            return compute_stats(self.root, self.index.files(conn))

    def register_root(self, record: RootRecord, keys: Iterable[str]) -> None:
        """Record that the package folder ``record.folder`` uses ``keys``."""
        from . import roots

        self._make_root()
        if not self.writable():
            return  # a read-only store: nothing will ever collect what the package uses
        with self.index.writing() as conn:
            roots.register(conn, record, keys)

    def add_root_keys(self, folder: str | os.PathLike[str], keys: Iterable[str]) -> bool:
        """Add ``keys`` to the root of ``folder``; False when the store has no root for it
        (a read-only store: True, as no gc can run on it)."""
        from . import roots

        self._make_root()
        if not self.writable():
            return True
        with self.index.writing() as conn:
            return roots.add_keys(conn, str(Path(folder).absolute()), keys)

    def roots(self) -> list[Root]:
        """Every root (a package folder a build registered, and the keys it holds alive
        against gc), live or dead (``weightstore store ls``)."""
        from . import roots

        self._require_root()
        with self.index.reading() as conn:
            return roots.list_roots(conn)

    def named_roots(self, package: str, version: str | None = None,
                    layout: str | None = None, *, root_id: int | None = None,
                    key: str | None = None) -> tuple[list[tuple[int, str, str, str, str]],
                                                     list[str]]:
        """The roots a name names, ``(id, package, version, layout, fingerprint)``, kept
        to the one ``root_id`` or to those whose objects include ``key``; and every
        ``package/version/layout`` the store knows (for an error to list), from one
        snapshot of the index."""
        from . import roots

        self._require_root()
        with self.index.reading() as conn:
            rows = roots.named(conn, (package, version, layout))
            if root_id is not None:
                rows = [r for r in rows if r[0] == root_id]
            if key is not None:
                rows = [r for r in rows if roots.holds_key(conn, r[0], key)]
            known = sorted({"/".join(r[1:4]) for r in roots.named(conn, ())})
        return rows, known

    def pin(self, selector: str, pinned: bool = True) -> list[int]:
        """Pin (or unpin) the roots ``selector`` names: gc keeps a pinned root's objects
        even when its folder is gone. Returns their ids."""
        from . import roots

        ids = self._find_roots(selector)
        with self.index.writing() as conn:
            roots.set_pinned(conn, ids, pinned)
        return ids

    def remove_roots(self, selector: str) -> list[int]:
        """Drop the roots ``selector`` names (their objects become garbage unless another
        root holds them). Returns their ids."""
        from . import roots

        ids = self._find_roots(selector)
        with self.index.writing() as conn:
            roots.remove(conn, ids)
        return ids

    def _find_roots(self, selector: str) -> list[int]:
        from . import roots

        self._require_root()
        with self.index.reading() as conn:
            ids = roots.find(conn, selector)
        if not ids:
            raise StoreError("no root matches", path=str(self.root), root=selector)
        return ids

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


def _staged_at_once() -> int:
    """:data:`STAGED_AT_ONCE`, or a quarter of this process's limit of open files when
    that is lower."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return STAGED_AT_ONCE
    if soft == resource.RLIM_INFINITY:
        return STAGED_AT_ONCE
    return max(1, min(STAGED_AT_ONCE, soft // 4))


def _check_put_args(kind: str, combined_name: str | None, alignment: int,
                    jobs: int) -> str | None:
    """Validate before locking; return the combined file name (None for per-weight)."""
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs must be a positive integer (got {jobs!r})")
    problem = alignment_problem(alignment)
    if problem is not None:
        raise ValueError(problem)
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


def _report_resized(stale: dict[str, StoredObject], written: dict[str, StoredObject],
                    wanted: dict[str, PayloadSource]) -> None:
    """Say on stderr, as :meth:`WeightStore.heal` does, which objects were written again
    because their row disagreed with the payload's size."""
    for key in written:
        old = stale.get(key)
        if old is not None and old.size != wanted[key].size:
            print(f"weightstore: store object {key} in {old.file} at offset {old.offset} "
                  f"was damaged (its index entry says {old.size} bytes, the payload has "
                  f"{wanted[key].size}); rewritten from {wanted[key].describe()}",
                  file=sys.stderr, flush=True)


def _alignment_of(obj: StoredObject) -> int:
    """The largest power of two (at most 4096) dividing the offset: what it was written
    with, or a multiple of it."""
    return min(4096, obj.offset & -obj.offset) if obj.offset else 4096
