"""The store index (format_version 2): one SQLite row per object, plus roots and leases.

Why SQLite: lookups in O(log N), writes in O(changes), memory independent of the store's
size, transactions, and readers that never wait for writers (WAL journal). Format 1 kept
the whole index in ``meta.json``, parsed whole on every lookup and rewritten whole on every
``put``; such a store is migrated on its first write, every object kept.

Rules (after diskcache's, the most used SQLite-backed file cache):

- autocommit connections; a writer opens ``BEGIN IMMEDIATE``, so it holds the one write
  lock for exactly as long as it records rows (never while payload bytes move);
- one connection per thread, opened again after a fork;
- ``PRAGMA user_version`` is the format version: 0 is a new or format 1 store, 2 this one;
  a newer one is refused, and a file holding the tables at 0 or 1 lost its version;
- a full disk (or an I/O error) is never called damage (:func:`index_failure`);
- files are unlinked only once no committed row refers to them.

A process waiting for the write lock says so on stderr every 10 s. SQLite's locks are not
safe on network filesystems: a store belongs on a local disk (registries share across
machines).

Tables::

    objects(key PK, file, offset, size, created)      created: unix seconds, for gc's grace
    roots(id PK, package, version, layout, folder UNIQUE, fingerprint, created, pinned)
    root_keys(root, key)                               the keys a root's package uses
    leases(id PK, pid, host, started, created)         a running build ...
    lease_keys(lease, key)                             ... and the keys it relies on
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError, StoreError
from ..io.digests import ALGORITHMS, HEX_LENGTH, split_key
from ..io.files import WRITE_ERRNOS, file_mode
from .layout import FORMAT_VERSION, INDEX_NAME, LOCK_NAME, META_NAME, is_safe_component
from .objects import MAX_INT, StoredObject
from .temps import sweep_quietly

BATCH = 900  # values per IN (...) list: below SQLite's historical limit of 999
WAIT_REPORT_SECONDS = 10.0
WAL_SWITCH_SECONDS = 30.0  # a switch refused this long is not a race between openers
WAL_SWITCH_WAIT_MS = 100  # how long one try at the switch waits for other connections
CHECKPOINT_BYTES = 4 << 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    key TEXT PRIMARY KEY, file TEXT NOT NULL, offset INTEGER NOT NULL,
    size INTEGER NOT NULL, created INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_by_file ON objects(file, offset);
CREATE TABLE IF NOT EXISTS roots (
    id INTEGER PRIMARY KEY, package TEXT NOT NULL, version TEXT NOT NULL,
    layout TEXT NOT NULL, folder TEXT NOT NULL UNIQUE, fingerprint TEXT NOT NULL,
    created INTEGER NOT NULL, pinned INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS root_keys (
    root INTEGER NOT NULL, key TEXT NOT NULL, PRIMARY KEY (root, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS root_keys_by_key ON root_keys(key);
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, host TEXT NOT NULL,
    started TEXT NOT NULL, created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lease_keys (
    lease INTEGER NOT NULL, key TEXT NOT NULL, PRIMARY KEY (lease, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lease_keys_by_key ON lease_keys(key);
"""


# What a column dropped by hand comes back with (the columns SQLite lets one drop: neither
# keys nor indexed): a time of now, no pin, and for what names a root or a lease a value
# that makes its row damage, which repair then drops (what named it is gone). An objects
# row without its size cannot be restored: such an index is not readable.
_RESTORED_COLUMNS = {
    "objects": (("created", "INTEGER NOT NULL DEFAULT {now}"),),
    "roots": (("package", "TEXT NOT NULL DEFAULT ''"), ("version", "TEXT NOT NULL DEFAULT ''"),
              ("layout", "TEXT NOT NULL DEFAULT ''"),
              ("fingerprint", "TEXT NOT NULL DEFAULT ''"),
              ("created", "INTEGER NOT NULL DEFAULT {now}"),
              ("pinned", "INTEGER NOT NULL DEFAULT 0")),
    "leases": (("pid", "INTEGER NOT NULL DEFAULT 0"), ("host", "TEXT NOT NULL DEFAULT ''"),
               ("started", "TEXT NOT NULL DEFAULT ''"),
               ("created", "INTEGER NOT NULL DEFAULT {now}")),
}


def _schema_gaps(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """``(what, the statement that restores it)`` for each part of the schema missing
    from an index that holds the ``objects`` table (the format version: no statement,
    the first write sets it). Columns before tables: a table created again has them."""
    have = {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    if "objects" not in have:
        return []
    gaps: list[tuple[str, str]] = []
    if conn.execute("PRAGMA user_version").fetchone()[0] < FORMAT_VERSION:
        gaps.append(("user_version", ""))
    now = int(time.time())
    for table, columns in _RESTORED_COLUMNS.items():
        if table not in have:
            continue
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        gaps += [(f"{table}.{column}", f"ALTER TABLE {table} ADD COLUMN {column} "
                                       f"{declaration.format(now=now)}")
                 for column, declaration in columns if column not in present]
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            name = statement.split("EXISTS", 1)[1].split()[0]
            if name not in have:
                gaps.append((name, statement))
    return gaps


def batched(values: Iterable[str], size: int = BATCH) -> Iterator[list[str]]:
    """Lists of at most ``size`` values, for ``IN (...)`` queries."""
    chunk: list[str] = []
    for value in values:
        chunk.append(value)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def marks(values: Collection[object]) -> str:
    return ",".join("?" * len(values))


@dataclass(frozen=True)
class MalformedRow:
    """An ``objects`` row that cannot describe a payload (a value of the wrong type, a
    negative or overflowing range, a file name that is no single path component): damage,
    which verify reports, repair drops, and every other reader sees as an absent key."""

    key: str
    file: str
    raw: tuple
    detail: str

    # what a report prints of a row: the values as they are (repr'd when not integers)
    @property
    def offset(self) -> int | str:
        return self.raw[2] if type(self.raw[2]) is int else repr(self.raw[2])

    @property
    def size(self) -> int | str:
        return self.raw[3] if type(self.raw[3]) is int else repr(self.raw[3])

    @property
    def end(self) -> int | str:
        offset, size = self.offset, self.size
        return offset + size if type(offset) is int and type(size) is int else "?"


def check_row(row: tuple) -> StoredObject | MalformedRow:
    """The one place where ``objects`` rows are read into objects: SQLite keeps whatever
    type a value was written with (``1e30`` stays REAL, ``'abc'`` TEXT), so nothing read
    from the index is believed before it is checked here. :func:`well_formed` is the same
    rule for the aggregates computed in SQL."""
    key, file, offset, size = row[:4]
    detail = None
    if type(key) is not str:
        detail = f"key is not text ({key!r})"
    else:
        try:
            split_key(key)
        except IntegrityError:
            detail = "key is not a digest key"
    if detail is None:
        if type(file) is not str or not is_safe_component(file):
            detail = f"file is not a single path component ({file!r})"
        elif type(offset) is not int or type(size) is not int:
            detail = f"offset {offset!r} or size {size!r} is not an integer"
        elif offset < 0 or size < 0 or offset > MAX_INT - size:
            detail = f"range at offset {offset} of {size} bytes is impossible"
    if detail is None:
        return StoredObject(key=key, file=file, offset=offset, size=size)
    return MalformedRow(key=key if type(key) is str and "\x00" not in key else repr(key),
                        file=file if type(file) is str and "\x00" not in file
                        else repr(file), raw=tuple(row[:4]), detail=detail)


def row_object(row: tuple) -> StoredObject | None:
    """The object of a well-formed row; None for a malformed one (an absent key)."""
    obj = check_row(row)
    return obj if isinstance(obj, StoredObject) else None


def digest_key(column: str) -> str:
    """SQL true where ``column`` holds a digest key (``split_key``'s rule): text,
    ``<algo>:`` and as many lowercase hex digits as the algorithm's digest has."""
    algos = " OR ".join(
        f"(substr({column}, 1, {len(algo) + 1}) = '{algo}:' "
        f"AND length({column}) = {len(algo) + 1 + HEX_LENGTH[algo]})" for algo in ALGORITHMS)
    return (f"(typeof({column}) = 'text' AND ({algos}) "
            f"AND substr({column}, instr({column}, ':') + 1) NOT GLOB '*[^0-9a-f]*' "
            f"AND instr(CAST({column} AS BLOB), X'00') = 0)")


def well_formed(table: str = "") -> str:
    """check_row's rule, for aggregates SQLite computes itself (``table``: the alias of
    ``objects`` in the query): a digest key, a single-component file name, an integer
    range that can exist."""
    t = f"{table}." if table else ""
    return (f"{digest_key(f'{t}key')} "
            f"AND typeof({t}file) = 'text' AND length({t}file) BETWEEN 1 AND 255 "
            f"AND {t}file NOT IN ('.', '..') AND instr({t}file, '/') = 0 "
            f"AND instr({t}file, '\\') = 0 AND instr({t}file, ':') = 0 "
            f"AND instr(CAST({t}file AS BLOB), X'00') = 0 "
            f"AND typeof({t}offset) = 'integer' AND typeof({t}size) = 'integer' "
            f"AND {t}offset >= 0 AND {t}size >= 0 AND {t}offset <= {MAX_INT} - {t}size")


def is_digest_key(value: object) -> bool:
    """Is ``value`` (read from any table) a digest key?"""
    if type(value) is not str or "\x00" in value:
        return False
    try:
        split_key(value)
    except IntegrityError:
        return False
    return True


def shown(value: object, limit: int = 60) -> str:
    """A value read from the index as a report shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def malformed_key_rows(conn: sqlite3.Connection, table: str, owner: str,
                       owners: str) -> list[tuple[object, object, str]]:
    """``(owner, key, what is wrong)`` of every damaged row of a key table
    (``root_keys`` of ``roots``, ``lease_keys`` of ``leases``): an owner that is no
    integer or names no row of ``owners``, a key that is no digest key."""
    found = []
    for held_by, key in conn.execute(
            f"SELECT {owner}, key FROM {table} WHERE typeof({owner}) != 'integer' "
            f"OR NOT {digest_key('key')} OR {owner} NOT IN (SELECT id FROM {owners})"):
        if type(held_by) is not int:
            detail = f"{owner} is not an integer ({shown(held_by)})"
        elif not is_digest_key(key):
            detail = f"key is not a digest key ({shown(key)})"
        else:
            detail = f"names no {owner} ({held_by})"
        found.append((held_by, key, detail))
    return found


SQLITE_IOERR, SQLITE_FULL = 10, 13  # primary result codes: the OS failed, not the file
# what tells nothing about the file: busy, locked, out of memory, cannot open, no locks
OS_FAILURES = frozenset({5, 6, 7, 8, 14, 15, 22, 23})


# SQLite's own text of each primary result code above (sqlite3_errstr), for Python 3.10,
# whose exceptions carry no ``sqlite_errorcode`` (added in 3.11)
_ERROR_TEXTS = {"database is locked": 5, "database table is locked": 6, "out of memory": 7,
                "attempt to write a readonly database": 8, "disk I/O error": SQLITE_IOERR,
                "database or disk is full": SQLITE_FULL,
                "unable to open database file": 14, "locking protocol": 15,
                "large file support is disabled": 22, "authorization denied": 23}


def primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of ``exc`` (None for another error): the exception's
    ``sqlite_errorcode`` where Python gives it, else read from SQLite's text for it."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if type(code) is int:
        return code & 0xFF
    return _ERROR_TEXTS.get(str(exc))


def not_damage(exc: BaseException) -> bool:
    """Did ``exc`` come from SQLite failing to read or write (an I/O error, a full
    disk: an index that opens fine once there is space), rather than from the file?"""
    cause = exc.__cause__
    code = primary_code(cause) if cause is not None else None
    if code is not None:
        return code in (SQLITE_IOERR, SQLITE_FULL)
    return isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS


FULL_MARGIN = 1 << 20  # below this many free bytes, an I/O error is taken for a full disk


def disk_is_full(folder: os.PathLike[str] | str) -> bool:
    """Less than :data:`FULL_MARGIN` left for this user on ``folder``'s file system (a new
    index, its journal or even a reader's shared-memory file may not fit; SQLite reports
    such a failure as an I/O error, not as a full disk)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return False
    return st.f_bavail * st.f_frsize < FULL_MARGIN


def index_failure(exc: BaseException, doing: str, index: Path, *,
                  damage: bool = False) -> StoreError:
    """The error of a failure ``doing`` something with the store index ``index``: a full
    disk says so and names the store (SQLite's "database or disk is full", or an I/O
    error on an all but full file system), an I/O error is never called damage; with
    ``damage`` (opening or reading the file), what SQLite finds wrong in it is. Raise it
    ``from exc``: :func:`not_damage` reads the cause."""
    primary = primary_code(exc)
    io_error = primary == SQLITE_IOERR or (isinstance(exc, OSError)
                                           and exc.errno in WRITE_ERRNOS)
    if primary == SQLITE_FULL or (io_error and disk_is_full(index.parent)):
        return StoreError(f"cannot {doing} the store index: disk is full (the disk holding "
                          f"the store {index.parent}); free space and run it again (a full "
                          f"disk is no damage: the index is left as it was)", path=str(index))
    if damage and not (io_error or isinstance(exc, OSError) or primary in OS_FAILURES):
        return StoreError(f"the store index is damaged: {exc}", path=str(index))
    return StoreError(f"cannot {doing} the store index: {exc}", path=str(index))


EXACT_FLOAT = 2**53  # below it, SQLite's total() of integers is exact


class Index:
    """The SQLite index of one store root; cheap to construct, connects on first use."""

    def __init__(self, root: Path, busy_timeout: float = 600.0) -> None:
        self.root = root
        self.path = root / INDEX_NAME
        self.busy_timeout = busy_timeout
        self.write_holds: list[float] = []  # seconds each write transaction held the lock
        self.rebuilding = False  # repair may create an index beside a format 2 marker
        self._local = threading.local()
        self._memory: tuple[tuple[int, int], sqlite3.Connection] | None = None
        self._swept: int | None = None  # the pid that swept the store's leftover temp files
        self._removed: list[str] = []  # what that sweep removed, until taken

    # -- connections -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """This thread's connection to the file (made again in a forked child)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        try:
            if not self.path.exists():  # the mode of an ordinary file: a group may share it
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, file_mode()))
            conn = sqlite3.connect(self.path, timeout=min(WAIT_REPORT_SECONDS,
                                                          self._timeout()),
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=FULL")
            # checkpoints run after the write transaction, not inside its COMMIT
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except (sqlite3.Error, OSError) as exc:
            raise index_failure(exc, "open", self.path) from exc
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this thread's connections (the next use opens the file again): before
        the file is renamed, so that nothing goes on writing into the old one."""
        for name in ("conn", "ro"):
            conn = getattr(self._local, name, None)
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                setattr(self._local, name, None)
        self._local.current = None

    def readable(self) -> bool:
        """Whether the index is a sound SQLite file of this format whose every ``objects``
        row can be read: an index repair must never set aside (what is wrong in it is
        damage of single rows, or a table, a column or its format version lost, which
        :meth:`restore_schema` brings back). A version below 2 in a file that holds the
        ``objects`` table is such a loss: creation commits the tables and the version in
        one transaction, and format 1 never had a SQLite file."""
        if not self.exists():
            return False
        try:
            conn = self._reader()
            if not 0 <= self._version(conn) <= FORMAT_VERSION:
                return False
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return False
            for _ in conn.execute("SELECT key, file, offset, size FROM objects"):
                pass
        except (sqlite3.Error, StoreError):
            return False
        return True

    def missing_schema(self) -> list[str]:
        """What a readable index lost of its schema (its format version, a table, an
        index, a column); nothing for one that cannot be read (or holds no ``objects``
        table: a new file, or one lost whole)."""
        try:
            conn = self._reader()
            if not 0 <= self._version(conn) <= FORMAT_VERSION:
                return []
            gaps = _schema_gaps(conn)
        except (sqlite3.Error, StoreError):
            return []
        return [name for name, _ in gaps]

    @staticmethod
    def restore_schema(conn: sqlite3.Connection) -> list[str]:
        """Create what is missing of the schema (in the caller's write transaction): a
        table or index (empty), a column with the value of :data:`_RESTORED_COLUMNS` in
        every row. Returns what was restored."""
        gaps = _schema_gaps(conn)
        for _, statement in gaps:
            if statement:
                conn.execute(statement)
        return [name for name, _ in gaps]

    def _timeout(self) -> float:
        return self.busy_timeout if self.busy_timeout >= 0 else float("inf")

    def exists(self) -> bool:
        return self.path.is_file()

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot, without any lock a writer could wait for.

        Before the first write there is no SQLite file: a format 1 ``meta.json`` is then
        read into memory (it is migrated by the first write), and no index at all reads as
        an empty store. Reading never creates anything.
        """
        if not self.exists():
            yield self._legacy_snapshot()
            return
        conn = self._reader()
        try:
            conn.execute("BEGIN")
        except sqlite3.Error as exc:
            raise index_failure(exc, "read", self.path) from exc
        try:
            if self._version(conn) < FORMAT_VERSION:
                self._refuse_lost_version(conn)
                # being created or migrated right now: what meta.json says until then
                conn.execute("COMMIT")
                try:
                    snapshot = self._legacy_snapshot(initialising=True)
                except StoreError:
                    # the marker replaces meta.json only after the creation commits: if
                    # it appeared since our look, the index is ready; read it instead
                    if self._version(conn) < FORMAT_VERSION:
                        raise
                    conn.execute("BEGIN")
                else:
                    yield snapshot
                    return
            self._check_version(conn)
            yield conn
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise
        except sqlite3.DatabaseError as exc:
            raise index_failure(exc, "read", self.path, damage=True) from exc
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")

    def writable(self) -> bool:
        """Whether this user can write the index (and so the store): not on a read-only
        mount, nor through permissions."""
        try:
            if os.statvfs(self.root).f_flag & os.ST_RDONLY:
                return False
        except (OSError, AttributeError):
            pass
        return os.access(self.root, os.W_OK) and (not self.exists()
                                                   or os.access(self.path, os.W_OK))

    def _reader(self) -> sqlite3.Connection:
        """The thread's connection; on a store this user cannot write (permissions, a
        read-only mount), an immutable read-only one."""
        if self.writable():
            return self._connect()
        conn = getattr(self._local, "ro", None)
        if conn is None or self._local.ro_pid != os.getpid():
            conn = self._read_only()
            self._local.ro, self._local.ro_pid = conn, os.getpid()
        return conn

    def _read_only(self) -> sqlite3.Connection:
        """``mode=ro`` reads the journal too (SQLite >= 3.22, with the -shm file present);
        where even that is impossible, ``immutable=1`` reads the main file alone."""
        base = self.path.absolute().as_uri()
        error: sqlite3.Error | None = None
        for query in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                conn = sqlite3.connect(base + query, uri=True, isolation_level=None,
                                       check_same_thread=False)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.Error as exc:
                error = exc
        raise index_failure(error, "open", self.path) from error

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int:
        return conn.execute("PRAGMA user_version").fetchone()[0]

    def _check_version(self, conn: sqlite3.Connection) -> None:
        version = self._version(conn)
        if version > FORMAT_VERSION:
            raise StoreError("store index was written by a newer weightstore; upgrade to "
                             "read it", path=str(self.path), format_version=version,
                             supported=FORMAT_VERSION)
        if version < FORMAT_VERSION:
            raise StoreError("store index is not initialised (an interrupted creation, which "
                             "the next write completes, or a lost index, which 'weightstore "
                             "store verify --repair' rebuilds)", path=str(self.path))

    def _lost(self) -> StoreError:
        """The error of a format 2 store whose index is gone, or holds nothing."""
        what = "holds no table" if self.exists() else "is missing"
        return StoreError(f"the store's SQLite index {what}; run 'weightstore store verify "
                          f"--repair' to rebuild it from the objects on disk",
                          path=str(self.path))

    def _refuse_lost_version(self, conn: sqlite3.Connection) -> None:
        """An index below this format that holds the ``objects`` table lost its version:
        creation commits the tables and the version together, and format 1 kept its
        index in ``meta.json``, never in SQLite. Repair sets it again, every row kept."""
        version = self._version(conn)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                        "'objects'").fetchone() is None:
            return
        origin = ("which no weightstore writes: format 1 kept its index in meta.json"
                  if version == 1 else "its version was reset")
        raise StoreError(f"the store index holds its tables but says format version "
                         f"{version}, not {FORMAT_VERSION} ({origin}); run 'weightstore "
                         f"store verify --repair', which sets it again, every row kept",
                         path=str(self.path), format_version=version,
                         supported=FORMAT_VERSION)

    def _legacy_snapshot(self, initialising: bool = False) -> sqlite3.Connection:
        """An in-memory index of a format 1 store (or an empty one), kept while
        ``meta.json`` is unchanged."""
        from .meta import read_legacy

        meta = self.root / META_NAME
        try:
            st = meta.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = (0, 0)
        if self._memory is not None and self._memory[0] == stamp:
            return self._memory[1]
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        conn.executescript(_SCHEMA)
        legacy = read_legacy(meta) if stamp != (0, 0) else None
        if legacy is None and stamp != (0, 0) and (initialising or not self.exists()):
            raise self._lost()
        _insert(conn, (legacy or {}).values(), 0)
        self._memory = (stamp, conn)
        return conn

    @contextlib.contextmanager
    def writing(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``: the store-wide critical section.

        Creates the store's index on first use (migrating a format 1 ``meta.json``). Keep
        the body to recording rows and renames: its duration is every writer's wait.

        ``durable`` False: the commit does not wait for the disk (``synchronous=NORMAL``
        for this transaction: atomic and consistent still, only a power cut may undo
        it, and the next durable commit or checkpoint makes it durable too). For rows
        whose loss a crash makes moot (a lease, which dies with its process) or that are
        a cache (digests remembered): one sync less each.
        """
        conn = self._connect()
        try:
            self._ensure_current(conn)
            # set for each transaction, so none inherits another's
            conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._begin(conn)
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise
        except sqlite3.DatabaseError as exc:
            raise index_failure(exc, "write", self.path, damage=True) from exc
        start: float | None = time.perf_counter()
        try:
            yield conn
            conn.execute("COMMIT")
            self.write_holds.append(time.perf_counter() - start)
            start = None
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
                    exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
                raise index_failure(exc, "write", self.path) from exc
            raise
        finally:
            if start is not None:
                self.write_holds.append(time.perf_counter() - start)
        self._checkpoint(conn)

    def take_swept(self) -> list[str]:
        """The temp files the first write's sweep removed, not yet taken (for gc and
        repair to report)."""
        removed, self._removed = self._removed, []
        return removed

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Fold the journal into the index once it passes :data:`CHECKPOINT_BYTES`
        (PASSIVE: it never waits for, nor blocks, writers)."""
        try:
            if os.stat(f"{self.path}-wal").st_size < CHECKPOINT_BYTES:
                return
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except (OSError, sqlite3.Error):
            pass

    def _begin(self, conn: sqlite3.Connection) -> None:
        start = time.monotonic()
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise index_failure(exc, "write", self.path) from exc
                waited = time.monotonic() - start
                if waited >= self._timeout():
                    raise StoreError("timed out waiting for the store index write lock",
                                     path=str(self.path), timeout=self.busy_timeout) from exc
                print(f"weightstore: waiting {waited:.0f} s for the store index write lock "
                      f"({self.path}): {self._writers(conn)}", file=sys.stderr, flush=True)

    @staticmethod
    def _writers(conn: sqlite3.Connection) -> str:
        """Who may hold the write lock: the running builds (their leases)."""
        from datetime import datetime, timezone

        try:
            rows = conn.execute("SELECT pid, host, created FROM leases ORDER BY created"
                                ).fetchall()
        except sqlite3.Error:
            rows = []
        if not rows:
            return "another process is writing it"

        def since(created: object) -> str:  # a lease row is not believed: it may be damage
            if type(created) is int and 0 <= created < 253402300800:  # before year 10000
                return datetime.fromtimestamp(created, timezone.utc).isoformat(
                    timespec="seconds")
            return shown(created, 30)

        def plain(value: object) -> str:
            return str(value) if type(value) in (int, str) else shown(value, 30)

        return "held by one of: " + ", ".join(
            f"pid {plain(pid)} on {plain(host)} since {since(created)}"
            for pid, host, created in rows[:5])

    def _ensure_current(self, conn: sqlite3.Connection) -> None:
        """What the first write of a process does, exactly once: initialise the schema
        (migrating a format 1 store, under its lock), put back the marker, and sweep the
        temp files killed writers left (:func:`.temps.sweep_quietly`, once per object)."""
        if getattr(self._local, "current", None) == (os.getpid(), id(conn)):
            return
        if self._version(conn) > FORMAT_VERSION:
            self._check_version(conn)  # refused before anything of it is changed
        self._ensure_wal(conn)
        version = self._version(conn)
        if version > FORMAT_VERSION:
            self._check_version(conn)
        if version < FORMAT_VERSION:
            self._migrate(conn)
        else:
            self.refresh_marker()
        self._local.current = (os.getpid(), id(conn))
        if self._swept != os.getpid():
            self._swept = os.getpid()
            self._removed = sweep_quietly(self.root)

    def _ensure_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (persistent). The switch needs a moment without other
        connections, which racing openers of a new store do not give at once: retried for
        up to ``WAL_SWITCH_SECONDS``. A switch refused that long is no race between openers
        (another program keeps the file open in its own journal mode, or the file system
        has no shared memory for WAL): a StoreError naming the index, not a hang."""
        start = time.monotonic()
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                if not self._empty():  # an empty file has had no writer to wait for
                    self._begin(conn)  # waits for writers, reporting who holds the index
                if self._switch_to_wal(conn) == "wal":
                    return
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise index_failure(exc, "initialise", self.path) from exc
            except sqlite3.Error as exc:
                raise index_failure(exc, "initialise", self.path) from exc
            if time.monotonic() - start >= min(self._timeout(), WAL_SWITCH_SECONDS):
                raise StoreError("cannot switch the store index to WAL: another program "
                                 "keeps it open, or its file system does not support it",
                                 path=str(self.path), journal_mode=self._journal_mode(conn),
                                 waited_seconds=round(time.monotonic() - start, 1))
            time.sleep(0.01)

    def _switch_to_wal(self, conn: sqlite3.Connection) -> str:
        """One try at the switch, from inside the write transaction ``_begin`` opened
        (none for an empty file: its commit alone would write the first page through a
        rollback journal, four syncs, before the switch writes it again), waiting only
        briefly for other connections (the connection's own busy wait is for writers,
        seconds long; ending the transaction waits on a reader too): the answer is the
        mode now in force, the old one while another connection has the file open."""
        waits = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute(f"PRAGMA busy_timeout={WAL_SWITCH_WAIT_MS}")
        try:
            if conn.in_transaction:
                conn.execute("COMMIT")
            return conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(waits)}")

    def _empty(self) -> bool:
        """Is the index file still empty (a new store that no one has written)?"""
        try:
            return os.stat(self.path).st_size == 0
        except OSError:
            return False

    @staticmethod
    def _journal_mode(conn: sqlite3.Connection) -> str:
        try:
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
        except sqlite3.Error as exc:
            return f"unknown ({exc})"

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Create the tables and copy a format 1 ``meta.json`` into them.

        Runs under format 1's lock file, so that no older weightstore writes ``meta.json``
        meanwhile; ``meta.json`` then becomes a format 2 marker that older versions refuse.
        """
        from ..io.locks import file_lock
        from .meta import read_legacy, restore_marker

        with file_lock(self.root / LOCK_NAME, self.busy_timeout, StoreError, "store"):
            self._begin(conn)
            try:
                if conn.execute("PRAGMA user_version").fetchone()[0] < FORMAT_VERSION:
                    if not self.rebuilding:
                        self._refuse_lost_version(conn)
                    for statement in _SCHEMA.split(";"):  # executescript would COMMIT
                        if statement.strip():
                            conn.execute(statement)
                    legacy = None if self.rebuilding else read_legacy(self.root / META_NAME)
                    if legacy is None and (self.root / META_NAME).exists() \
                            and not self.rebuilding:
                        raise self._lost()
                    legacy = legacy or {}
                    _insert(conn, legacy.values(), int(time.time()))
                    conn.execute(f"PRAGMA user_version={FORMAT_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            with contextlib.suppress(OSError):  # under the lock already; imported, so kept
                restore_marker(self.root / META_NAME, INDEX_NAME, keep=False)

    def refresh_marker(self) -> bool:
        """Put the format 2 marker in place of a ``meta.json`` an older weightstore could
        take for its index (none, format 1, garbage: :func:`.meta.restore_marker`); True
        when it was written. A store this user may not write keeps what it has, and so
        does one whose index is not initialised: its ``meta.json`` may be the format 1
        index, which only the migration replaces, once it has imported it."""
        from ..io.locks import file_lock
        from .meta import is_current, restore_marker

        if is_current(self.root / META_NAME) is not False or not self.initialised():
            return False
        try:  # under format 1's lock, so that an older weightstore is not writing it
            with file_lock(self.root / LOCK_NAME, self.busy_timeout, StoreError, "store"):
                return restore_marker(self.root / META_NAME, INDEX_NAME)
        except OSError:
            return False

    def initialised(self) -> bool:
        """Does the index exist at this format's version?"""
        if not self.exists():
            return False
        try:
            return self._version(self._reader()) == FORMAT_VERSION
        except (sqlite3.Error, StoreError):
            return False

    # -- objects -----------------------------------------------------------------------

    def locate(self, keys: Iterable[str], conn: sqlite3.Connection | None = None,
               ) -> dict[str, StoredObject]:
        """The rows of ``keys`` that exist, in batched ``IN (...)`` queries."""
        if conn is None:
            with self.reading() as snapshot:
                return self.locate(keys, snapshot)
        found: dict[str, StoredObject] = {}
        for chunk in batched(dict.fromkeys(keys)):
            for row in conn.execute(f"SELECT key, file, offset, size FROM objects "
                                    f"WHERE key IN ({marks(chunk)})", chunk):
                obj = row_object(row)
                if obj is not None:  # a malformed row is damage: the key is absent
                    found[obj.key] = obj
        return found

    def insert(self, conn: sqlite3.Connection, objects: Iterable[StoredObject]) -> None:
        _insert(conn, objects, int(time.time()))

    @staticmethod
    def objects(conn: sqlite3.Connection, file: str | None = None,
                ) -> Iterator[StoredObject]:
        """Every row (streamed), by key; or the rows of one file, by offset."""
        if file is None:
            cursor = conn.execute("SELECT key, file, offset, size FROM objects ORDER BY key")
        else:
            cursor = conn.execute("SELECT key, file, offset, size FROM objects WHERE file = ? "
                                  "ORDER BY offset, size", (file,))
        for row in cursor:
            obj = row_object(row)
            if obj is not None:
                yield obj

    @staticmethod
    def rows(conn: sqlite3.Connection) -> Iterator[tuple[str, str, int, int]]:
        """Every well-formed row as ``(key, file, offset, size)``, by key (streamed)."""
        for row in conn.execute("SELECT key, file, offset, size FROM objects ORDER BY key"):
            obj = row_object(row)
            if obj is not None:
                yield obj.key, obj.file, obj.offset, obj.size

    @staticmethod
    def objects_by_file(conn: sqlite3.Connection) -> Iterator[StoredObject | MalformedRow]:
        """Every row (streamed), grouped by file, by offset within a file; a malformed
        row as such (for verify to report)."""
        for row in conn.execute("SELECT key, file, offset, size FROM objects "
                                "ORDER BY file, offset, size"):
            yield check_row(row)

    @staticmethod
    def row(conn: sqlite3.Connection, key: str) -> StoredObject | MalformedRow | None:
        """The row of ``key`` as it is, malformed or not (for repair to look again)."""
        row = conn.execute("SELECT key, file, offset, size FROM objects WHERE key = ?",
                           (key,)).fetchone()
        if row is not None:
            return check_row(row)
        # a key that is not text, or holds a NUL, is shown (and reported) by its repr
        for odd in conn.execute("SELECT key, file, offset, size FROM objects WHERE "
                                "typeof(key) != 'text' OR instr(CAST(key AS BLOB), X'00') > 0"):
            found = check_row(odd)
            if isinstance(found, MalformedRow) and found.key == key:
                return found
        return None

    @staticmethod
    def files(conn: sqlite3.Connection) -> list[tuple[str, int, int, int]]:
        """``(file, objects, payload bytes, end of the last range)`` per indexed file
        (well-formed rows only).

        Each range fits SQLite's integers, but their sum need not (two rows of 2**62 bytes
        in one file, damage verify reports as ranges past the file's end): SQLite's
        ``sum()`` would fail the whole query with "integer overflow", so the sum is
        ``total()``'s (a float, exact below 2**53), made exact in Python beyond."""
        out = []
        for file, count, payload, end in conn.execute(
                f"SELECT file, count(*), total(size), max(offset + size) FROM objects "
                f"WHERE {well_formed()} GROUP BY file ORDER BY file").fetchall():
            if payload < EXACT_FLOAT:
                payload = int(payload)
            else:
                payload = sum(size for (size,) in conn.execute(
                    f"SELECT size FROM objects WHERE file = ? AND {well_formed()}", (file,)))
            out.append((file, count, payload, end))
        return out

    @staticmethod
    def count(conn: sqlite3.Connection) -> int:
        return conn.execute("SELECT count(*) FROM objects").fetchone()[0]


def _insert(conn: sqlite3.Connection, objects: Iterable[StoredObject], created: int) -> None:
    conn.executemany("INSERT OR REPLACE INTO objects (key, file, offset, size, created) "
                     "VALUES (?, ?, ?, ?, ?)",
                     ((o.key, o.file, o.offset, o.size, created) for o in objects))
