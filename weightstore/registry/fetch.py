"""Downloads of a pull: blobs streamed from a registry, verified, into the store and the
output folder.

A payload blob streams to a partial file beside the store's objects (its lock, so two
pulls of one blob take turns), its sha256 and its store key computed over the bytes as they
are written; only when both match is it renamed into the store. A per-weight output file
gets the same bytes as they arrive; every other output file is assembled from the store
while the downloads run. Used by :mod:`.pull` (weightstore's own artifacts) and
:mod:`.foreign` (anyone's), neither of which the other needs for this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    IntegrityError,
    PackageError,
    RegistryDigestError,
    RegistryError,
)
from ..io.digests import new_hasher, split_key
from ..io.files import (
    WRITE_ERRNOS,
    discard_temp_dir,
    make_temp_dir,
    name_path,
    published_meanwhile,
)
from ..package.assembly import assemble
from ..store import FilePayload, StoredObject, WeightStore
from .artifact import WeightFile
from .client import BROKEN, CHUNK, MAX_DOCUMENT, RegistryClient
from .reference import Reference

STREAM_ATTEMPTS = 4


@dataclass
class PullReport:
    reference: str
    manifest_digest: str
    output: str
    payloads: int = 0  # payloads the output needs
    payload_bytes: int = 0
    fetched: int = 0  # payload blobs downloaded (the rest were in the store)
    fetched_bytes: int = 0
    file_bytes: int = 0  # models, summary, device records, assembly, config
    received_bytes: int = 0  # every byte read from the registry

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def download(client: RegistryClient, ref: Reference, desc: dict[str, Any], target: Path,
             resume: bool = False, also: str | None = None,
             copy_to: Path | None = None, durable: bool = True) -> tuple[int, str | None]:
    """Stream one blob to ``target``, checking its sha256 and size as it arrives. Returns
    the bytes received and, with ``also``, the hex digest of that algorithm over the same
    bytes. A mismatch removes ``target`` and names the digest. With ``resume``, bytes
    already in ``target`` (a pull cut off before) are hashed and only the rest is
    requested; if the whole then does not match, the blob is fetched once more from 0.

    ``copy_to``: a second file (new, or truncated) that gets every byte the hashers get,
    as they get it, the kept prefix included, and is fsynced with ``target``: when the
    digests match, it holds exactly the verified bytes, with no copy or read-back after.
    On a mismatch its content is undefined (its caller discards it).

    ``durable`` False: no fsync, for a file its caller reads and removes at once."""
    try:
        return _download(client, ref, desc, target, resume, also, copy_to, durable)
    except OSError as exc:  # a full disk: the file, and nothing of it left
        if exc.errno in WRITE_ERRNOS:
            target.unlink(missing_ok=True)
        raise name_path(exc, target) from None


class _Tee:
    """The file a blob streams into, and a copy that gets the same bytes at the same
    offsets (:func:`download`'s ``copy_to``)."""

    def __init__(self, main: Any, copy: Any | None) -> None:
        self.files = [main] if copy is None else [main, copy]

    def seek(self, pos: int) -> None:
        for f in self.files:
            f.seek(pos)

    def truncate(self) -> None:
        for f in self.files:
            f.truncate()

    def write(self, data: bytes | memoryview) -> None:
        for f in self.files:
            f.write(data)

    def sync(self) -> None:
        for f in self.files:
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def _open_copy(path: Path | None) -> Iterator[Any]:
    """``path`` opened for a blob's copy (created or truncated, never through a link), or
    None."""
    if path is None:
        yield None
        return
    from ..io.files import file_mode

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 file_mode())
    with open(fd, "wb") as f:
        yield f


def _download(client: RegistryClient, ref: Reference, desc: dict[str, Any], target: Path,
              resume: bool, also: str | None, copy_to: Path | None,
              durable: bool) -> tuple[int, str | None]:
    digest, size = desc["digest"], desc["size"]
    received = 0
    from_zero = not resume
    attempts = 0
    while attempts < STREAM_ATTEMPTS:
        attempts += 1
        hashers = _hashers(also)
        have = target.stat().st_size if not from_zero and target.exists() else 0
        resumed = have > 0
        if have > size:
            have = 0
        with open(target, "r+b" if have else "wb") as f, _open_copy(copy_to) as copy:
            for data in iter(lambda: f.read(CHUNK), b"") if have else ():
                for h in hashers:
                    h.update(data)
                if copy is not None:
                    copy.write(data)
            out = _Tee(f, copy)
            pos, broken = have, False
            if have < size:
                broken, pos, count = _stream(client, ref, desc, out, have, hashers, also)
                received += count
            if not broken and durable:
                out.sync()
        if broken:
            from_zero = False
            continue  # resume from what arrived
        if pos == size and "sha256:" + hashers[0].hexdigest() == digest:
            return received, hashers[-1].hexdigest() if also else None
        if resumed:  # the kept prefix was bad: once more, from 0, in the same file
            from_zero = True  # (a blob's partial file is its lock: never replaced)
            continue
        if client.blob_refused(digest):  # a mirror's bytes: from 0, from the next source
            from_zero, attempts = True, attempts - 1  # (each source is refused once)
            continue
        target.unlink(missing_ok=True)
        raise RegistryDigestError("blob does not match its digest", digest=digest,
                                  reference=str(ref), size=size, received=pos)
    raise RegistryError("blob transfer kept breaking off", digest=digest, reference=str(ref))


def _stream(client: RegistryClient, ref: Reference, desc: dict[str, Any], f: Any,
            have: int, hashers: list[Any], also: str | None) -> tuple[bool, int, int]:
    """Append the blob's bytes from ``have`` to ``f``; (broken off, end, bytes read)."""
    resp = client.open_blob(ref, desc["digest"], have)
    if have and resp.status_code == 200:  # the registry sent it whole
        hashers[:] = _hashers(also)
        have = 0
    f.seek(have)
    f.truncate()
    pos = have
    try:
        with resp:
            for data in client.pieces(resp, digest=desc["digest"], reference=str(ref)):
                pos += len(data)
                client.count_received(len(data))
                if pos > desc["size"]:
                    break
                for h in hashers:
                    h.update(data)
                f.write(data)
    except BROKEN:
        return True, pos, pos - have
    return False, pos, pos - have


def _hashers(also: str | None) -> list[Any]:
    """sha256 first (the registry's digest), then the store's algorithm if another."""
    first = hashlib.sha256()
    return [first] if also in (None, "sha256") else [first, new_hasher(also)]


def _fetch_payload(client: RegistryClient, ref: Reference, store: WeightStore, key: str,
                   desc: dict[str, Any], adopt: Callable[[str, Path], StoredObject],
                   slot: threading.Semaphore,
                   copy_to: Path | None = None) -> tuple[int, StoredObject | None]:
    """Download one payload blob into the store: (bytes received, its object, or None
    when another pull brought it meanwhile). Its sha256 and its store key are both
    computed on the bytes as they are written; only when both match is the file renamed
    into the store (no copy, no second read). The partial file's name is its digest, so
    a later pull resumes it; the blob's lock keeps two pulls from writing it at once.
    ``slot`` is held while the blob downloads, not while it waits for its commit.
    ``copy_to``: a file of the output that is this payload and nothing else, written with
    the same bytes as they are hashed (:func:`download`); left unwritten when another
    pull brought the payload."""
    tmp = _blob_temp(store, desc)
    # two pulls of one blob into one store take turns on its partial file
    with _blob_lock(store, tmp):
        if not store.still_missing([FilePayload(key=key, size=desc["size"], path="")]):
            tmp.unlink()  # the other one brought it
            return 0, None
        try:
            with slot:
                received = _download_payload(client, ref, key, desc, tmp, copy_to)
            return received, adopt(key, tmp)
        except IntegrityError:
            tmp.unlink(missing_ok=True)
            raise
        except BaseException:
            _drop_if_empty(tmp)  # nothing to resume (a blob refused, not found): not kept
            raise


def _drop_if_empty(tmp: Path) -> None:
    """Remove a blob's partial file that holds no byte (its lock created it)."""
    with contextlib.suppress(OSError):
        if tmp.stat().st_size == 0:
            tmp.unlink()


def _blob_temp(store: WeightStore, desc: dict[str, Any]) -> Path:
    """The partial file of a payload blob's download in the store."""
    return store.root / f".pull-{desc['digest'].split(':', 1)[1]}.tmp"


def _blob_lock(store: WeightStore, tmp: Path) -> contextlib.AbstractContextManager[None]:
    """A blob's download: its partial file, held (:func:`~weightstore.io.locks.
    partial_file_lock`) until it is renamed into the store, removed, or left to resume."""
    from ..errors import StoreError
    from ..io.locks import partial_file_lock

    return partial_file_lock(tmp, store.lock_timeout, StoreError, "download of a blob")


def _download_payload(client: RegistryClient, ref: Reference, key: str,
                      desc: dict[str, Any], tmp: Path, copy_to: Path | None = None) -> int:
    """Download a payload blob to ``tmp`` (and ``copy_to``), its sha256 and its store key
    both computed over the bytes written; the bytes received."""
    algo, hex_ = split_key(key)
    received, found = download(client, ref, desc, tmp, resume=True, also=algo,
                               copy_to=copy_to)
    if found != hex_:
        raise IntegrityError("a blob's bytes do not match the key its layer names",
                             digest=desc["digest"], key=key, reference=str(ref))
    return received


@dataclass(frozen=True)
class _RegistryBlob(FilePayload):
    """A payload downloaded to a temp file, named by where it came from."""

    origin: str = ""

    def describe(self) -> str:
        return self.origin


def _heal_payload(client: RegistryClient, ref: Reference, store: WeightStore, key: str,
                  desc: dict[str, Any]) -> int:
    """Fetch again the blob of a payload whose store object is damaged and put it back
    (:meth:`WeightStore.heal`: verified against its key, rewritten under the store's
    locks, reported on stderr, as a build rewrites one from its source); the bytes
    received."""
    tmp = _blob_temp(store, desc)
    with _blob_lock(store, tmp):
        try:
            received = _download_payload(client, ref, key, desc, tmp)
            store.heal(_RegistryBlob(key, desc["size"], str(tmp),
                                     origin=f"the registry's blob {desc['digest']} of {ref}"),
                       store.locate([key]).get(key))
        finally:
            tmp.unlink(missing_ok=True)
    return received


def output_folder(ref: Reference, output: str | os.PathLike[str] | None,
                  force: bool) -> Path:
    """Where a pull writes (by default the repository's last name component): an empty or
    absent folder, or with ``force`` any folder."""
    out = Path(output) if output is not None else Path(ref.repository.rsplit("/", 1)[-1])
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise PackageError("output folder is not empty (use --force to replace it)",
                           folder=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


@contextlib.contextmanager
def staged_output(out: Path, store: WeightStore, force: bool) -> Iterator[Path]:
    """A temp folder beside ``out`` to write the pull into, under ``out``'s lock (one
    publish of a folder at a time); removed at the end, published or not."""
    from ..io.locks import target_lock

    with target_lock(out, store.root):
        if not force and out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise published_meanwhile(out)  # a pull that waited for the lock
        stage = make_temp_dir(out.parent, f".{out.name}.")
        try:
            yield stage
        finally:
            discard_temp_dir(stage)


def blob_bytes(client: RegistryClient, ref: Reference, desc: dict[str, Any],
                path: Path) -> bytes:
    if desc["size"] > MAX_DOCUMENT:
        raise RegistryError("malformed model manifest: metadata blob too large",
                            digest=desc["digest"], reference=str(ref))
    download(client, ref, desc, path, durable=False)  # read here and removed by the caller
    return path.read_bytes()


def fetch_and_assemble(client: RegistryClient, ref: Reference, store: WeightStore,
                       payloads: dict[str, dict[str, Any]], wanted: dict[str, int],
                       report: PullReport, jobs: int, progress: bool | None, folder: Path,
                       files: list[WeightFile]) -> dict[str, str]:
    """Fetch the missing payloads (``payloads``: store key -> layer descriptor) while the
    output's files are written. A file that is one payload and nothing else (a per-weight
    file) whose payload this pull downloads is written by the download itself, with the
    bytes as they are hashed (no copy, no read-back); every other file is assembled from
    the store, a piece copied (and re-hashed) as soon as its payload is in, so the copies
    overlap the downloads that are still running. Returns key -> sha256 of the payloads
    this pull downloaded, both digests computed over the bytes it received."""
    missing = store.missing([FilePayload(key=k, size=n, path="") for k, n in wanted.items()])
    direct = _written_by_download(files, missing)
    rest = [f for f in files if direct.get(f.pieces[0].key if f.pieces else "") is not f]
    arriving: dict[str, Future[StoredObject]] = {k: Future() for k in wanted}
    with ThreadPoolExecutor(1) as runner:
        assembling = runner.submit(assemble, store, folder, rest, jobs=jobs,
                                   arriving=arriving)
        try:
            hashed = _fetch_missing(client, ref, store, payloads, wanted, missing, report,
                                    jobs, progress, arriving, folder, direct)
        except BaseException as exc:
            for future in arriving.values():
                if not future.done():
                    future.set_exception(exc)
            wait([assembling])
            raise
        # what the store already had, or another pull brought meanwhile
        settle = [k for k, f in arriving.items() if not f.done()]
        found = store.locate(settle) if settle else {}
        for key in settle:
            arriving[key].set_result(found.get(key))  # type: ignore[arg-type]
        healed: set[str] = set()
        while True:
            try:
                assembling.result()
                return hashed
            except IntegrityError as exc:  # a store object damaged since it was written
                key = exc.context.get("key")
                if key not in wanted or key in healed:
                    raise
                healed.add(key)
                received = _heal_payload(client, ref, store, key, payloads[key])
            report.fetched += 1
            report.fetched_bytes += received
            hashed[key] = payloads[key]["digest"]
            for f in files:  # assembled again, from the store as it is now
                (folder / f.name).unlink(missing_ok=True)
            assembling = runner.submit(assemble, store, folder, files, jobs=jobs)


def _written_by_download(files: list[WeightFile], missing: list[str]) -> dict[str, WeightFile]:
    """The files a download writes itself: per key to download, the first file that is
    that payload and nothing else (the others holding it are assembled from the store)."""
    keys = set(missing)
    direct: dict[str, WeightFile] = {}
    for f in files:
        if f.is_separate and f.pieces[0].key in keys:
            direct.setdefault(f.pieces[0].key, f)
    return direct


def _fetch_missing(client: RegistryClient, ref: Reference, store: WeightStore,
                   payloads: dict[str, dict[str, Any]], wanted: dict[str, int],
                   missing: list[str], report: PullReport, jobs: int, progress: bool | None,
                   arriving: dict[str, Future[StoredObject]], folder: Path,
                   direct: dict[str, WeightFile]) -> dict[str, str]:
    """Download ``missing`` into the store, each of ``direct``'s files written on the way;
    key -> sha256 of each payload downloaded."""
    from ..progress import Progress

    hashed: dict[str, str] = {}
    if not missing:
        return hashed
    store._make_root()
    adoption = _GroupAdoption(store)
    # jobs blobs in flight; as many threads again wait for their commit meanwhile
    slots = threading.Semaphore(jobs)

    def fetch(key: str) -> tuple[int, bool]:
        own = direct.get(key)
        copy_to = folder / own.name if own is not None else None
        if copy_to is not None:
            copy_to.parent.mkdir(parents=True, exist_ok=True)
        received, obj = _fetch_payload(client, ref, store, key, payloads[key],
                                       adoption.adopt, slots, copy_to)
        if obj is not None:
            # download() matched the sha256 and the key over the bytes it wrote
            hashed[key] = payloads[key]["digest"]
            arriving[key].set_result(obj)  # its pieces are copied while others download
        elif own is not None:  # another pull brought it: copied from the store
            assemble(store, folder, [own], jobs=1)
        return received, obj is not None

    order = download_order(missing, wanted)
    try:
        with (Progress("pulling", sum(wanted[k] for k in missing), enabled=progress) as bar,
              ThreadPoolExecutor(2 * jobs) as pool):
            client.on_blob_bytes = bar.advance
            for received, downloaded in pool.map(fetch, order):
                report.fetched += downloaded  # not one another pull brought meanwhile
                report.fetched_bytes += received
    finally:
        client.on_blob_bytes = None
    return hashed


def download_order(keys: list[str], sizes: dict[str, int]) -> list[str]:
    """The order blobs start in: the largest and the smallest in turn (largest first),
    so that small blobs (companion files, biases, norms) download, sync and commit
    alongside the big ones instead of after them, where nothing hides their latency;
    a big blob still starts among the first."""
    by_size = sorted(keys, key=lambda k: (-sizes[k], k))
    order = []
    while by_size:
        order.append(by_size.pop(0))
        if by_size:
            order.append(by_size.pop())
    return order


class _GroupAdoption:
    """Puts verified blobs into the store, the blobs that finish while a commit runs
    together in the next one: the index's write transaction (a commit and a directory
    fsync) is taken once per group instead of once per blob, and the threads that wait
    for it go on downloading sooner. A failed commit fails every blob of its group."""

    def __init__(self, store: WeightStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._queue: dict[str, Path] = {}
        self._done: dict[str, StoredObject | BaseException] = {}
        self._busy = False

    def adopt(self, key: str, tmp: Path) -> StoredObject:
        with self._cond:
            self._queue[key] = tmp
            while key not in self._done:
                if self._busy:  # a commit is running: ours goes in the next one
                    self._cond.wait()
                    continue
                self._busy = True
                group, self._queue = self._queue, {}
                self._cond.release()
                try:
                    result: dict[str, Any] = dict(self._store.adopt_many(group))
                except BaseException as exc:  # every waiter of the group raises it
                    result = dict.fromkeys(group, exc)
                finally:
                    self._cond.acquire()
                    self._busy = False
                self._done.update(result)
                self._cond.notify_all()
            found = self._done.pop(key)
        if isinstance(found, BaseException):
            raise found
        return found


