"""``weightstore pull REF [DIR] [--device D | --scenario S]``: an artifact back into a folder.

The manifest first; then only the payload blobs the local store lacks, each streamed to
a temp file beside the store's objects while its sha256 (and its store key, for a store
of another algorithm) is computed, and put into the store only when both match: a wrong
byte never enters the store. A blob cut off mid-stream resumes from the bytes already
received (``Range``). A per-weight output file whose payload the pull downloads is
written by the download itself, with the bytes as they are hashed. Meanwhile the other
files are assembled from the store (:mod:`weightstore.package.assembly`: every piece
copied as soon as its payload is in, while other blobs still download, and re-hashed
against its key), byte-identical to the pushed package (payloads at their offsets, zero
bytes between them).

With ``--device`` or ``--scenario``, the variant is resolved from the model metadata
first (the device folder's models and ``bundle.json``, or the package models with the
scenario replayed) and only the live payloads are fetched: the output is the variant's
self-contained folder, its weight files holding the live payloads at their offsets and
zeros (holes) elsewhere, and its ``bundle.json`` (the device's record, or one for the
scenario) listing the store key of each live payload, which its models are verified
against when they are loaded, resolved or checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    IntegrityError,
    ModelError,
    PackageError,
    RegistryDigestError,
    RegistryError,
    ScenarioError,
)
from ..io.digests import make_key, new_hasher, split_key
from ..io.files import (
    WRITE_ERRNOS,
    discard_temp_dir,
    make_temp_dir,
    name_path,
    parse_json,
    publish_dir,
    published_meanwhile,
)
from ..package.assembly import assemble, summary_weight_files
from ..package.summary import read_summary_file
from ..store import FilePayload, StoredObject, WeightStore
from . import digests
from .artifact import (
    SUMMARY_NAME,
    ParsedArtifact,
    WeightFile,
    parse_assembly,
    parse_manifest,
    sha256_digest,
    summary_assembly,
)
from .assemble import contents_algo, contents_check
from .client import BROKEN, CHUNK, MAX_DOCUMENT, RegistryClient, Transport, body_pieces
from .reference import Reference, parse_reference

if TYPE_CHECKING:  # onnx loads only when --device or --scenario resolves a graph
    import onnx

STREAM_ATTEMPTS = 4
DEVICES = "devices"


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
             copy_to: Path | None = None) -> tuple[int, str | None]:
    """Stream one blob to ``target``, checking its sha256 and size as it arrives. Returns
    the bytes received and, with ``also``, the hex digest of that algorithm over the same
    bytes. A mismatch removes ``target`` and names the digest. With ``resume``, bytes
    already in ``target`` (a pull cut off before) are hashed and only the rest is
    requested; if the whole then does not match, the blob is fetched once more from 0.

    ``copy_to``: a second file (new, or truncated) that gets every byte the hashers get,
    as they get it, the kept prefix included, and is fsynced with ``target``: when the
    digests match, it holds exactly the verified bytes, with no copy or read-back after.
    On a mismatch its content is undefined (its caller discards it)."""
    try:
        return _download(client, ref, desc, target, resume, also, copy_to)
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
              resume: bool, also: str | None,
              copy_to: Path | None) -> tuple[int, str | None]:
    digest, size = desc["digest"], desc["size"]
    received = 0
    from_zero = not resume
    for _ in range(STREAM_ATTEMPTS):
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
            if not broken:
                out.sync()
        if broken:
            from_zero = False
            continue  # resume from what arrived
        if pos == size and "sha256:" + hashers[0].hexdigest() == digest:
            return received, hashers[-1].hexdigest() if also else None
        if resumed:  # the kept prefix was bad: once more, from 0, in the same file
            from_zero = True  # (a blob's partial file is its lock: never replaced)
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
            for data in body_pieces(resp, client.transport, digest=desc["digest"],
                                    reference=str(ref)):
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
        if not store.missing_settled([FilePayload(key=key, size=desc["size"], path="")]):
            tmp.unlink()  # the other one brought it
            return 0, None
        try:
            with slot:
                received = _download_payload(client, ref, key, desc, tmp, copy_to)
            return received, adopt(key, tmp)
        except IntegrityError:
            tmp.unlink(missing_ok=True)
            raise


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


def pull(reference: str, output: str | os.PathLike[str] | None = None, *,
         store: WeightStore, transport: Transport | None = None, jobs: int = 4,
         device: str | None = None, scenario: str | None = None,
         force: bool = False, progress: bool | None = False) -> PullReport:
    """Pull ``reference`` into ``output``; see the module docstring. ``progress``: a bar
    over the payload bytes to fetch, with rate and ETA (None: only on a terminal)."""
    if device is not None and scenario is not None:
        raise ValueError("give a device or a scenario, not both")
    ref = parse_reference(reference)
    client = RegistryClient(ref.host, transport)
    data, _ = client.get_manifest(ref)
    manifest_digest = sha256_digest(data)
    if ref.digest and manifest_digest != ref.digest:
        raise RegistryDigestError("manifest does not match its digest", digest=ref.digest,
                                  reference=str(ref))
    from .foreign import is_foreign, pull_foreign

    if is_foreign(data):  # not pushed by weightstore: a generic ModelPack or ORAS artifact
        if device is not None or scenario is not None:
            raise RegistryError("--device and --scenario need a weightstore artifact; this "
                                "one was pushed by another client", reference=str(ref))
        return pull_foreign(client, ref, data, output, store=store, jobs=jobs, force=force,
                            progress=progress)
    parsed = parse_manifest(data, str(ref))
    out = output_folder(ref, output, force)
    report = PullReport(str(ref), manifest_digest, str(out))
    with staged_output(out, store, force) as stage:
        config = blob_bytes(client, ref, parsed.config, stage / ".config")
        _check_config(config, parsed, str(ref))
        (stage / ".config").unlink()
        legacy = None
        if parsed.assembly is not None:  # a format 1 artifact: its own record
            legacy = parse_assembly(blob_bytes(client, ref, parsed.assembly,
                                               stage / ".assembly"), parsed, str(ref))
            (stage / ".assembly").unlink()
        summary = _read_summary(client, ref, parsed, stage, report)
        files = summary_assembly(summary, parsed, str(ref)) if legacy is None else legacy
        check_declared_sizes(parsed, files, summary, str(ref))
        with store.leased():
            plan = _plan_variant(client, ref, parsed, files, summary, stage, report,
                                 device=device, scenario=scenario)
            hashed = fetch_and_assemble(client, ref, store, parsed.payloads, plan.wanted,
                                        report, jobs, progress, plan.folder, plan.files)
            # only the pairs this pull hashed: a payload taken from the store says
            # nothing about the blob the manifest names for it
            digests.remember(store, sha256=hashed, host=ref.host, repository=ref.repository,
                             digests=[d["digest"] for d in parsed.payloads.values()])
            if plan.summary is not None:
                _check_contents(plan.folder, plan.summary, plan.files, plan.known, ref)
            publish_dir(plan.folder, out, replace=force, over_empty=True)
            if plan.summary is not None:
                _register(store, out, plan.summary, plan.wanted)
    report.received_bytes = client.received_bytes
    return report


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
    download(client, ref, desc, path)
    return path.read_bytes()


def _check_config(data: bytes, parsed: ParsedArtifact, reference: str) -> None:
    try:
        doc = parse_json(data)
        fmt = doc["config"]["format"]
        diff_ids = doc["modelfs"]["diffIds"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError("malformed model config", reference=reference) from None
    if fmt != "onnx" or not isinstance(diff_ids, list):
        raise RegistryError("model config is not an ONNX model pack", reference=reference,
                            format=fmt)


def _download_files(client: RegistryClient, ref: Reference, parsed: ParsedArtifact,
                    names: list[str], stage: Path, report: PullReport,
                    also: str | None = None) -> dict[str, str]:
    """Download the layers of ``names`` into ``stage``; with ``also`` (an algorithm),
    returns each file's ``"<algo>:<hex>"`` taken on the way."""
    found = {}
    for name in names:
        desc = parsed.files.get(name)
        if desc is None:
            raise RegistryError("malformed model artifact: a file its metadata names has no "
                                "layer", reference=str(ref), file=name)
        target = stage / name
        target.parent.mkdir(parents=True, exist_ok=True)
        received, hex_ = download(client, ref, desc, target, also=also)
        report.file_bytes += received
        if also is not None and hex_ is not None:
            found[name] = make_key(also, hex_)
    return found


def _load_model(path: Path, ref: Reference) -> onnx.ModelProto:
    """A model file of the artifact, parsed; a malformed one is a typed error."""
    import onnx
    from google.protobuf.message import DecodeError

    from ..catalogue.utf8 import check_message

    try:
        data = path.read_bytes()
        # before parsing: protobuf's pure-Python parser (protobuf 3) refuses such a string
        # itself, naming neither the field nor the offset
        check_message(memoryview(data), 0, len(data), onnx.ModelProto.DESCRIPTOR)
        return onnx.load_from_string(data)
    except ModelError as exc:  # a string that is not UTF-8, as every reader refuses it
        raise RegistryError(f"malformed model artifact: {exc.message}", reference=str(ref),
                            file=path.name, **exc.context) from None
    except (DecodeError, OSError, ValueError, RecursionError) as exc:
        raise RegistryError(f"malformed model artifact: a model file does not parse "
                            f"({type(exc).__name__})", reference=str(ref),
                            file=path.name) from None


@dataclass(frozen=True)
class _Plan:
    """What a pull writes: the folder to publish, its weight files, the payloads it
    needs (key -> size), and for a whole package its summary and the digests of the
    files downloaded whole (in the algorithm of the summary's ``contents``)."""

    folder: Path
    files: list[WeightFile]
    wanted: dict[str, int]
    summary: dict[str, Any] | None = None
    known: dict[str, str] = field(default_factory=dict)


def _read_summary(client: RegistryClient, ref: Reference, parsed: ParsedArtifact,
                  stage: Path, report: PullReport) -> dict[str, Any]:
    """The artifact's ``summary.json``, downloaded into ``stage`` (a metadata document:
    no larger than any other) and checked as every summary is: well formed, its paths
    inside."""
    desc = parsed.files.get(SUMMARY_NAME)
    if desc is not None and desc["size"] > MAX_DOCUMENT:
        raise RegistryError("malformed model manifest: metadata blob too large",
                            file=SUMMARY_NAME, size=desc["size"], limit=MAX_DOCUMENT,
                            reference=str(ref))
    _download_files(client, ref, parsed, [SUMMARY_NAME], stage, report)
    return read_summary_file(stage)[1]


def check_declared_sizes(parsed: ParsedArtifact, files: list[WeightFile],
                         summary: dict[str, Any], reference: str) -> None:
    """Every size the manifest and the assembly record declare is the one the summary
    gives, before a byte of them is fetched or a file allocated: the weight files are the
    ones the summary's models place their payloads in (same sizes, same pieces), and each
    file layer the summary's ``contents`` lists has the size listed there. (The assembly
    record's own files are bounded by their pieces: :func:`.artifact.parse_assembly`.)"""
    def bad(why: str, **ctx: Any) -> RegistryError:
        return RegistryError(f"malformed model artifact: {why}", reference=reference, **ctx)

    try:
        placed = {f.name: f for f in summary_weight_files(summary)}
        listed = {str(c["path"]): c["size"] for c in summary.get("contents", [])}
    except (KeyError, TypeError, ValueError, PackageError):
        raise bad("the summary's files or contents are malformed", file=SUMMARY_NAME) from None
    declared = {f.name: f for f in files}
    for name in sorted(declared.keys() | placed.keys()):
        mine, theirs = declared.get(name), placed.get(name)
        if mine is None or theirs is None or mine.size != theirs.size:
            raise bad("the assembly record's weight file is not the summary's", file=name,
                      size=mine.size if mine else None,
                      listed_size=theirs.size if theirs else None)
        if mine != theirs:
            raise bad("the assembly record places other pieces than the summary", file=name)
    for name, size in sorted(listed.items()):
        layer = parsed.files.get(name)
        if name in declared:
            found = declared[name].size
        elif layer is not None:
            found = layer["size"]
        else:
            continue  # missing: the contents check names it
        if found != size:
            raise bad("a declared size is not the one the summary lists", file=name,
                      size=found, listed_size=size)


def _plan_variant(client: RegistryClient, ref: Reference, parsed: ParsedArtifact,
                  files: list[WeightFile], summary: dict[str, Any], stage: Path,
                  report: PullReport, *, device: str | None, scenario: str | None) -> _Plan:
    """Fetch the metadata the output needs and decide which payloads it needs. A whole
    package is assembled in ``stage`` itself, a variant in a folder inside it."""
    if device is None and scenario is None:
        algo = contents_algo(summary)
        known = _download_files(client, ref, parsed, sorted(set(parsed.files) - {SUMMARY_NAME}),
                                stage, report, also=algo)
        wanted = {p.key: p.size for f in files for p in f.pieces}
        return _Plan(stage, files, _count(wanted, report), summary, known)
    from ..package.bundle_record import BUNDLE_NAME, device_record, model_entry, render_record
    from ..resolve.source import record_beside, store_keys_of
    from ..resolve.variant import variant_graph
    from ..scenarios.resolve import live_payloads

    by_name = {m.get("name"): store_keys_of(m) for m in summary["models"]}
    result = make_temp_dir(stage, ".variant.")
    # (model, scenario, file, name, the payload keys of its ranges, its size)
    models: list[tuple[onnx.ModelProto, str | None, str, str, dict, int]] = []
    record = None
    if device is not None:
        prefix = f"{DEVICES}/{device}/"
        names = sorted(n for n in parsed.files if n.startswith(prefix))
        if not names:
            known = sorted({n.split("/")[1] for n in parsed.files
                            if n.startswith(f"{DEVICES}/") and n.count("/") == 2})
            raise PackageError("no such device in the artifact", device=device,
                               reference=str(ref), known=", ".join(known) or "none")
        _download_files(client, ref, parsed, names, stage, report)
        from ..package.bundle_record import read_bundle

        record = read_bundle(stage, device)
        for entry in record["models"]:
            path = stage / prefix / entry["file"]
            # the keys of the record beside it (format 2); a format 1 record's are the
            # summary's
            keys = store_keys_of(record_beside(path) or {}) or by_name.get(entry.get("name"),
                                                                              {})
            models.append((_load_model(path, ref), entry["scenario"], entry["file"],
                           entry.get("name"), keys, 0))
            (result / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, result / entry["file"])
    else:
        entries = [(m, list(m.get("scenarios", []))) for m in summary["models"]]
        if not any(scenario in names for _, names in entries):
            raise ScenarioError("no model of the artifact has this scenario",
                                scenario=scenario, reference=str(ref))
        _download_files(client, ref, parsed, [str(m["file"]) for m, _ in entries], stage,
                        report)
        from ..io.models import save_model

        for m, names in entries:
            file, chosen = str(m["file"]), scenario if scenario in names else None
            resolved = variant_graph(_load_model(stage / file, ref), chosen)
            (result / file).parent.mkdir(parents=True, exist_ok=True)
            size = save_model(resolved, result / file)
            keys = store_keys_of(record_beside(stage / file) or {})  # the summary's
            models.append((resolved, chosen, file, str(m["name"]), keys, size))
    live: dict[str, int] = {}
    described = []
    for model, chosen, file, name, keys, size in models:
        payloads = live_payloads(model, chosen)
        for p in payloads:
            # the record's key of its range; an earlier version's model also declares it
            key = p.checksum or keys.get((p.location, p.offset))
            if key is None or key not in parsed.payloads:
                raise RegistryError("a live weight has no payload layer in the artifact",
                                    reference=str(ref), model=file, weight=p.name)
            live[key] = p.length
        described.append(model_entry(name, file, chosen, size, payloads, keys))
    kept = []
    for f in files:
        pieces = tuple(p for p in f.pieces if p.key in live)
        if pieces:
            kept.append(WeightFile(f.name, f.size, pieces))
    # the variant folder's own record, as a device's: its models, their files and keys
    if record is None:
        record = device_record(None, {}, scenario, described,
                               {f.name: f.size for f in kept})
    else:  # the device's, each model with its keys (a format 1 record had none)
        record = device_record(record["device"], record.get("capabilities") or {},
                               record.get("scenario_rule"), [
                                   {**entry, "external_weights": d["external_weights"]}
                                   for entry, d in zip(record["models"], described,
                                                       strict=True)], {
                                   f["name"]: f["size"] for f in record["files"]})
    (result / BUNDLE_NAME).write_bytes(render_record(record))
    return _Plan(result, kept, _count(live, report))


def _check_contents(folder: Path, summary: dict[str, Any], files: list[WeightFile],
                    known: dict[str, str], ref: Reference) -> None:
    """A pulled package is exactly what its summary lists (when it lists its files): the
    weight files by construction, every other file by the digest taken while it
    downloaded; nothing unlisted (:func:`.assemble.contents_check`)."""
    problem = contents_check(folder, summary, files, known)
    if problem is not None:
        raise IntegrityError("the pulled package does not match its summary",
                             reference=str(ref), problem=problem)


def _count(wanted: dict[str, int], report: PullReport) -> dict[str, int]:
    report.payloads = len(wanted)
    report.payload_bytes = sum(wanted.values())
    return wanted


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

    order = sorted(missing, key=lambda k: (-wanted[k], k))
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


def _register(store: WeightStore, folder: Path, summary: dict[str, Any],
              wanted: dict[str, int]) -> None:
    """A pulled package is a root of the store, like a built one."""
    from ..store import RootRecord

    try:
        record = RootRecord(package=str(summary["package"]), version=str(summary["version"]),
                            layout=str(summary["layout"]["name"]),
                            folder=str(folder.absolute()),
                            fingerprint=str(summary["fingerprint"]))
    except (KeyError, TypeError):
        return
    store.register_root(record, sorted(wanted))
