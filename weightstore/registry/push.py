"""``weightstore push PACKAGE REF``: a package folder to a registry, weight by weight.

Order of work: plan the artifact from metadata (:mod:`.artifact`); find every payload's
sha256 (free for sha256 stores, remembered in the store index for blake3 ones, else
computed once while reading the bytes, which are checked against their key at the same
time); then, in parallel, for every blob: HEAD (skip what the registry has), mount from
another repository of the registry known to hold it, or upload (monolithic up to the
chunk size, chunked above it, resuming from the offset the registry reports after a
failed chunk). A chunked upload's session is recorded after every chunk
(:mod:`.sessions`), so a push killed mid-blob continues that blob on the rerun from where
the registry has it. The manifest goes last, by digest and then by tag, so an interrupted
push never leaves a tag naming missing blobs; a rerun skips every blob already sent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    IntegrityError,
    PackageError,
    RegistryAuthError,
    RegistryDigestError,
    RegistryError,
)
from ..io.digests import ALGORITHMS, make_key, new_hasher, split_key
from ..package.summary import SUMMARY_NAME
from ..packaging.inventory import read_summary_bytes
from ..packaging.proof import PROVEN_INTERNAL, check_recorded_build, say_unproven
from ..store import WeightStore
from . import digests, sessions
from .artifact import (
    PackagePlan,
    build_artifact,
    created_at,
    list_files,
    plan_package,
)
from .auth import Credentials
from .client import CHUNK, RegistryClient, Transport
from .reference import Reference, parse_reference

CHUNK_RETRIES = 5
KEPT_IN_MEMORY = 16 << 20  # files up to this size are uploaded from the bytes that were hashed

Pieces = Callable[[int, int], Iterable[bytes]]


@dataclass
class PushReport:
    reference: str
    manifest_digest: str
    blobs: int = 0
    blob_bytes: int = 0
    present: int = 0
    mounted: int = 0
    uploaded: int = 0
    uploaded_bytes: int = 0  # blob bytes we uploaded
    uploaded_weight_bytes: int = 0  # of which weight payloads
    resumed: int = 0  # uploads continued on the session a killed push left
    resumed_bytes: int = 0  # bytes the registry held of those (not sent again)
    sent_bytes: int = 0  # every byte of request bodies, manifests included
    hashed_bytes: int = 0  # payload bytes read to compute sha256 digests

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def file_pieces(path: Path, base: int = 0) -> Pieces:
    """Bytes [start, end) of a blob that sits at ``base`` in ``path``, in 1 MiB reads."""
    def pieces(start: int, end: int) -> Iterator[bytes]:
        fd = os.open(path, os.O_RDONLY)
        try:
            pos = start
            while pos < end:
                data = os.pread(fd, min(CHUNK, end - pos), base + pos)
                if not data:
                    raise PackageError("file shrank while being pushed", file=str(path))
                yield data
                pos += len(data)
        finally:
            os.close(fd)
    return pieces


def bytes_pieces(data: bytes) -> Pieces:
    def pieces(start: int, end: int) -> Iterator[bytes]:
        yield data[start:end]
    return pieces


class CheckedPieces:
    """The bytes of one blob, read from ``path`` (at ``base``) as they are uploaded and
    hashed as they go: the piece that completes the blob is handed over only once the
    whole blob hashed to ``digest``, the sha256 the package was checked with, so a file
    changed on disk after the check never completes an upload (a monolithic body stops
    short of its length; the last chunk of a chunked upload is not sent, nor the upload
    finished) and the manifest is never pushed. A range asked for again (a retried
    request, a resumed session) continues from the hash state saved at its start; a start
    with no saved state (a session a killed push left) hashes the bytes before it again
    from the file."""

    def __init__(self, path: Path, base: int, size: int, digest: str) -> None:
        self.path, self.base, self.size, self.digest = path, base, size, digest
        self._states: dict[int, Any] = {0: hashlib.sha256()}  # offset -> hash state there

    def __call__(self, start: int, end: int) -> Iterator[bytes]:
        state = self._state_at(start)
        for stale in [p for p in self._states if p > start]:  # bytes read again replace them
            del self._states[stale]
        pos = start
        if pos == end == self.size:
            self._check(state)
        for data in file_pieces(self.path, self.base)(start, end):
            state.update(data)
            pos += len(data)
            if pos == self.size:
                self._check(state)
            self._states[pos] = state.copy()
            yield data

    def _state_at(self, start: int) -> Any:
        below = max(p for p in self._states if p <= start)
        state = self._states[below].copy()
        for data in file_pieces(self.path, self.base)(below, start):
            state.update(data)
        return state

    def verify(self) -> None:
        """Read the whole blob and check it, sending nothing: a blob the registry already
        holds (present, or mounted) is still the package's own bytes."""
        state = hashlib.sha256()
        for data in file_pieces(self.path, self.base)(0, self.size):
            state.update(data)
        actual = "sha256:" + state.hexdigest()
        if actual != self.digest:
            raise IntegrityError("package bytes do not match their digest; nothing was "
                                 "published", file=str(self.path), offset=self.base,
                                 size=self.size, expected=self.digest, actual=actual)

    def _check(self, state: Any) -> None:
        actual = "sha256:" + state.hexdigest()
        if actual != self.digest:
            raise IntegrityError("a file changed after it was checked; its upload was "
                                 "stopped and nothing was published", file=str(self.path),
                                 offset=self.base, size=self.size, expected=self.digest,
                                 actual=actual)


def _hashes(pieces: Iterable[bytes], algos: Iterable[str]) -> dict[str, str]:
    hashers = {a: new_hasher(a) for a in algos}
    for data in pieces:
        for h in hashers.values():
            h.update(data)
    return {a: h.hexdigest() for a, h in hashers.items()}


def _hash_range(path: Path, offset: int, size: int, algos: Iterable[str]) -> dict[str, str]:
    return _hashes(file_pieces(path, offset)(0, size), algos)


def payload_digests(folder: Path, plan: PackagePlan, store: WeightStore,
                    jobs: int) -> tuple[dict[str, str], int]:
    """sha256 of every payload (and the bytes read to find them). Bytes read are also
    checked against their store key: a damaged package is never pushed."""
    sizes = plan.payload_sizes()
    out = {k: "sha256:" + split_key(k)[1] for k in sizes if split_key(k)[0] == "sha256"}
    out.update(digests.known_sha256(store, [k for k in sizes if k not in out]))
    todo = [k for k in sizes if k not in out]
    sources = plan.payload_sources()

    def compute(key: str) -> tuple[str, str]:
        algo, hex_ = split_key(key)
        name, offset = sources[key]
        found = _hash_range(folder / name, offset, sizes[key], {"sha256", algo})
        if found[algo] != hex_:
            raise IntegrityError("package bytes do not match their key", file=name,
                                 offset=offset, key=key, actual=make_key(algo, found[algo]))
        return key, "sha256:" + found["sha256"]

    with ThreadPoolExecutor(jobs) as pool:
        computed = dict(pool.map(compute, todo))
    out.update(computed)
    if computed:
        digests.remember(store, sha256=computed)
    return out, sum(sizes[k] for k in todo)


def _file_digests(folder: Path, plan: PackagePlan, summary: dict[str, Any],
                  summary_bytes: bytes, ref: Reference,
                  ) -> tuple[dict[str, tuple[str, int]], dict[str, bytes]]:
    """(sha256, size) of every file that is not a weight file, each hashed in the same
    read with the digest its summary lists, and the bytes hashed of those up to
    :data:`KEPT_IN_MEMORY` (the summary's always), which are what is uploaded; and the
    folder checked against the summary as a whole (nothing missing or unlisted, every
    size and digest, the weight files' pieces) before anything is uploaded. The weight
    files' payloads are checked against their keys as they are hashed
    (:func:`payload_digests`), their padding by :func:`_check_padding`; files ``prepare``
    added are checked as ``verify`` checks them."""
    from ..package.assembly import contents_problem
    from ..resolve.prepared_record import companion_contents

    listed = {str(c["path"]): str(c["digest"]) for c in summary["contents"]}
    others = [n for n in plan.other_files if n != SUMMARY_NAME]
    records, graphs = companion_contents([n for n in others if n not in listed], folder)
    listed.update((g["path"], g["digest"]) for g in graphs)
    out = {SUMMARY_NAME: (_digest(summary_bytes), len(summary_bytes))}
    kept = {SUMMARY_NAME: summary_bytes}
    found: dict[str, tuple[int, str]] = {}
    for name in others:
        path = folder / name
        size = path.stat().st_size
        algo = listed.get(name, "sha256:").partition(":")[0]
        if algo not in ALGORITHMS:  # a digest weightstore cannot take: never a match
            algo = "sha256"
        if size <= KEPT_IN_MEMORY:
            kept[name] = path.read_bytes()
            size = len(kept[name])
            digests = _hashes([kept[name]], {"sha256", algo})
        else:
            digests = _hash_range(path, 0, size, {"sha256", algo})
        out[name] = ("sha256:" + digests["sha256"], size)
        if name not in records:
            found[name] = (size, make_key(algo, digests[algo]))
    try:
        problem = contents_problem(summary, {f.name: f for f in plan.weight_files}, found,
                                   {g["path"]: (g["size"], g["digest"]) for g in graphs})
    except (KeyError, TypeError, ValueError):
        problem = "the summary's contents are malformed"
    if problem is not None:
        raise IntegrityError("the package does not match its summary; nothing was pushed",
                             folder=str(folder), reference=str(ref), problem=problem)
    return out, kept


def _check_padding(folder: Path, plan: PackagePlan) -> None:
    """Bytes of weight files outside every payload must be zero: the artifact records
    only payloads, so anything else could not be rebuilt."""
    for f in plan.weight_files:
        for offset, length in f.gaps():
            for data in file_pieces(folder / f.name, offset)(0, length):
                if data.count(0) != len(data):
                    raise PackageError("a weight file holds bytes no weight accounts for",
                                       file=f.name, offset=offset, length=length)


def push(package: str | os.PathLike[str], reference: str, *, store: WeightStore,
         transport: Transport | None = None, jobs: int = 4,
         mount_from: Iterable[str] = (), progress: bool | None = False,
         credentials: Credentials | None = None) -> PushReport:
    """Push the package folder to ``reference``; see the module docstring. ``progress``:
    a bar over the blob bytes with rate and ETA (None: only on a terminal).
    ``credentials``: used instead of those :func:`.auth.find_credentials` finds."""
    from ..progress import Progress

    folder = Path(package)
    ref = parse_reference(reference)
    if ref.digest:
        raise RegistryError("push to a tag, not to a digest", reference=reference)
    # well formed, its files listed, every path inside the folder; the build, when the
    # store recorded it
    summary_bytes, summary = read_summary_bytes(folder)
    proven = check_recorded_build(folder, store.root, summary_bytes, summary)
    plan = plan_package(folder, summary, list_files(folder))
    _check_padding(folder, plan)
    sha, hashed = payload_digests(folder, plan, store, jobs)
    file_digests, kept = _file_digests(folder, plan, summary, summary_bytes, ref)
    artifact = build_artifact(plan, sha, file_digests, created_at())
    # what is uploaded is what was checked: the bytes hashed, or bytes hashed again as
    # they are sent and held back from the registry unless they match (CheckedPieces)
    sources: dict[str, tuple[int, Pieces]] = {}
    for key, (name, offset) in plan.payload_sources().items():
        size = plan.payload_sizes()[key]
        sources.setdefault(sha[key], (size, upload_pieces(folder / name, offset, size,
                                                          sha[key])))
    for name, (digest, size) in file_digests.items():
        sources.setdefault(digest, (size, bytes_pieces(kept[name]) if name in kept
                                    else upload_pieces(folder / name, 0, size, digest)))
    sources.setdefault(_digest(artifact.config), (len(artifact.config),
                                                  bytes_pieces(artifact.config)))

    client = RegistryClient(ref.host, transport, credentials, push=True)
    client.ping()
    report = PushReport(reference=str(ref), manifest_digest=artifact.manifest_digest,
                        blobs=len(sources), blob_bytes=sum(s for s, _ in sources.values()),
                        hashed_bytes=hashed)
    known = digests.repositories(store, ref.host, sources)
    extra = [r for r in mount_from if r != ref.repository]

    def send(digest: str) -> tuple[str, str, int, int]:
        size, pieces = sources[digest]
        candidates = extra + [r for r in known.get(digest, []) if r != ref.repository
                              and r not in extra]
        how, held = upload_blob(client, ref, digest, size, pieces, candidates)
        if how != "uploaded" and isinstance(pieces, CheckedPieces):
            pieces.verify()  # its digest was taken on trust (a sha256 key, remembered)
        return digest, how, size, held

    done: list[str] = []
    weight_digests = set(sha.values())
    sessions.prune()
    try:
        with (Progress("pushing", report.blob_bytes, enabled=progress) as bar,
              ThreadPoolExecutor(jobs) as pool):
            client.on_blob_bytes = bar.advance
            for digest, how, size, held in pool.map(send, sorted(sources, key=lambda d: (
                    -sources[d][0], d))):
                done.append(digest)
                if how != "uploaded":
                    bar.advance(size)
                elif held:
                    bar.advance(held)  # already on the registry from a killed push
                setattr(report, how, getattr(report, how) + 1)
                if held:
                    report.resumed += 1
                    report.resumed_bytes += held
                if how == "uploaded":
                    report.uploaded_bytes += size - held
                    if digest in weight_digests:
                        report.uploaded_weight_bytes += size - held
    finally:
        client.on_blob_bytes = None
        digests.remember(store, host=ref.host, repository=ref.repository, digests=done)
    client.put_manifest(ref, artifact.manifest_digest, artifact.manifest)
    client.put_manifest(ref, ref.tag or "latest", artifact.manifest)
    report.sent_bytes = client.sent_bytes
    if proven == PROVEN_INTERNAL:  # every file was checked against the summary
        say_unproven(folder, store.root)
    return report


def upload_pieces(path: Path, base: int, size: int, digest: str) -> Pieces:
    """How a blob is read from the package at upload time: checked as it is sent."""
    return CheckedPieces(path, base, size, digest)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload_blob(client: RegistryClient, ref: Reference, digest: str, size: int,
                pieces: Pieces, mount_from: list[str]) -> tuple[str, int]:
    """Make ``digest`` present in ``ref``'s repository: ('present' | 'mounted' |
    'uploaded', bytes the registry already held from a session a killed push left)."""
    if client.has_blob(ref, digest):
        sessions.forget(ref.host, ref.repository, digest)
        return "present", 0
    location = None
    for source in mount_from:
        location = client.start_upload(ref, digest, mount_from=source)
        if location is None:
            sessions.forget(ref.host, ref.repository, digest)
            return "mounted", 0
        break  # the registry opened an upload instead: use it
    if size <= client.transport.chunk_size:
        location = location or client.start_upload(ref, digest)
        client.put_monolithic(ref, location, digest, size, pieces)
        return "uploaded", 0
    with sessions.claimed(ref.host, ref.repository, digest) as recorded:
        upload = _ChunkedUpload(client, ref, digest, size, pieces, recorded)
        return "uploaded", upload.run(location)


class _ChunkedUpload:
    """One blob sent in ``PATCH`` chunks on a session recorded after every chunk the
    registry acknowledged (:mod:`.sessions`), so that a rerun after the process was
    killed continues from where the registry has it."""

    def __init__(self, client: RegistryClient, ref: Reference, digest: str, size: int,
                 pieces: Pieces, recorded: bool) -> None:
        self.client, self.ref, self.digest, self.size = client, ref, digest, size
        self.pieces = pieces
        self.recorded = recorded  # False: another push holds this blob's record
        self.chunk = client.transport.chunk_size

    def run(self, location: str | None) -> int:
        """Send the blob; returns the bytes a recorded session already held."""
        offset = 0
        if location is None and self.recorded:
            location, offset = self._recorded()
        if location is None:
            location = self.client.start_upload(self.ref, self.digest)
        try:
            self._send(location, offset)
        except IntegrityError:
            self._forget()  # bytes other than the checked ones: never continue them
            raise
        except RegistryDigestError:
            if not offset:
                raise
            # the session held other bytes than ours (another client's, or a file that
            # changed since): send the whole blob again on a new session
            self._forget()
            self._send(self.client.start_upload(self.ref, self.digest), 0)
            offset = 0
        self._forget()
        return offset

    def _recorded(self) -> tuple[str | None, int]:
        """The recorded session and the bytes the registry holds of it; (None, 0) when
        there is none to continue (no record, a session the registry no longer knows or
        refuses, one holding more than the record explains)."""
        ref, digest = self.ref, self.digest
        record = sessions.load(ref.host, ref.repository, digest, self.size)
        if record is None:
            return None, 0
        try:
            held = self.client.upload_status(ref, record.location, digest)
        except RegistryAuthError:
            raise
        except RegistryError as exc:
            if exc.context.get("status") is None:  # unreachable: nothing to ask
                raise
            held = -1
        # "Range: 0-0" says 0 or 1 byte: start again rather than guess
        if held < 2 or held > min(self.size, record.sent + record.chunk):
            self._forget()
            return None, 0
        return record.location, held

    def _send(self, location: str, offset: int) -> None:
        client, ref, digest = self.client, self.ref, self.digest
        self._save(location, offset)
        failures = 0
        while offset < self.size:
            end = min(self.size, offset + self.chunk)
            try:
                location = client.patch_chunk(ref, location, digest, offset, end, self.pieces)
                offset = end
            except RegistryAuthError:
                raise
            except RegistryError:
                failures += 1
                if failures > CHUNK_RETRIES:
                    raise
                offset, location = _resume(client, ref, location, digest)
            self._save(location, offset)
        client.finish_upload(ref, location, digest)

    def _save(self, location: str, sent: int) -> None:
        if self.recorded:
            sessions.save(sessions.UploadSession(
                registry=self.ref.host, repository=self.ref.repository, digest=self.digest,
                size=self.size, location=location, sent=sent, chunk=self.chunk))

    def _forget(self) -> None:
        if self.recorded:
            sessions.forget(self.ref.host, self.ref.repository, self.digest)


def _resume(client: RegistryClient, ref: Reference, location: str, digest: str,
            ) -> tuple[int, str]:
    """Where to go on after a failed chunk: the offset the session holds, or a fresh
    session from 0 when the registry no longer accepts that one (a chunk it received in
    part leaves the session's state behind its bytes)."""
    try:
        return client.upload_status(ref, location, digest), location
    except RegistryAuthError:
        raise
    except RegistryError as exc:
        if exc.context.get("status") is None:  # unreachable: nothing to resume against
            raise
    return 0, client.start_upload(ref, digest) or location
