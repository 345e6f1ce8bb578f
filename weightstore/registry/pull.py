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
bytes between them). Companion files (configs, tokenizers, docs the summary lists) travel
as payloads do: each is fetched into the store under the digest the summary lists for it
(checked with its sha256 as it arrives, so a registry or mirror serving other bytes is
refused), only when the store lacks it, and written from there.

With ``--device`` or ``--scenario``, the variant is resolved from the model metadata
first (the device folder's models and ``bundle.json``, or the package models with the
scenario replayed) and only the live payloads are fetched: the output is the variant's
self-contained folder, as ``weightstore bundle`` writes one
(:mod:`weightstore.packaging.variant_files`): its weight files holding only the live
payloads, laid out again at the layout's alignment, its models pointing at them, and its
``bundle.json`` (the device's record, or one for the scenario) listing the store key of
each live payload at its new place, which its models are verified against when they are
loaded, resolved or checked. The folder gets the companion files
its runtime opens at its root, listed in its ``bundle.json``: a device's own set
(``devices[i].companions`` of the summary, its overrides included), the package's for a
scenario; it is then a complete runtime folder.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
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
    make_temp_dir,
    parse_json,
    publish_dir,
)
from ..package.assembly import Piece, summary_weight_files
from ..package.summary import read_summary_file
from ..store import WeightStore
from . import digests
from .artifact import (
    SUMMARY_NAME,
    ParsedArtifact,
    WeightFile,
    companion_files,
    parse_assembly,
    parse_manifest,
    sha256_digest,
    summary_assembly,
)
from .assemble import contents_algo, contents_check
from .auth import Credentials
from .client import MAX_DOCUMENT, RegistryClient, Transport
from .mirrors import reading_client
from .reference import Reference, parse_reference

if TYPE_CHECKING:  # onnx's messages load only when --device or --scenario resolves a graph
    from ..io.onnx_proto import ModelProto

from .fetch import (
    PullReport,
    blob_bytes,
    download,
    fetch_and_assemble,
    output_folder,
    staged_output,
)

DEVICES = "devices"


def pull(reference: str, output: str | os.PathLike[str] | None = None, *,
         store: WeightStore, transport: Transport | None = None, jobs: int = 4,
         device: str | None = None, scenario: str | None = None,
         force: bool = False, progress: bool | None = False,
         credentials: Credentials | None = None) -> PullReport:
    """Pull ``reference`` into ``output``; see the module docstring. ``progress``: a bar
    over the payload bytes to fetch, with rate and ETA (None: only on a terminal).
    ``credentials``: used instead of those :func:`.auth.find_credentials` finds."""
    if device is not None and scenario is not None:
        raise ValueError("give a device or a scenario, not both")
    ref = parse_reference(reference)
    client = reading_client(ref, transport, credentials)
    data, media_type = client.get_manifest(ref)
    manifest_digest = sha256_digest(data)
    if ref.digest and manifest_digest != ref.digest:
        raise RegistryDigestError("manifest does not match its digest", digest=ref.digest,
                                  reference=str(ref))
    from .kinds import refuse_other_kinds

    refuse_other_kinds(data, media_type, str(ref))  # an image, an index, a Helm chart
    from .foreign_plan import is_foreign

    if is_foreign(data):  # not pushed by weightstore: a generic ModelPack or ORAS artifact
        from .foreign import pull_foreign

        if device is not None or scenario is not None:
            raise RegistryError("--device and --scenario need a weightstore artifact; this "
                                "one was pushed by another client", reference=str(ref))
        return pull_foreign(client, ref, data, output, store=store, jobs=jobs, force=force,
                            progress=progress)
    parsed = parse_manifest(data, str(ref))
    out = output_folder(ref, output, force)
    report = PullReport(str(ref), manifest_digest, str(out))
    # the config and the summary download side by side, the summary beside the store's
    # lease too (a first pull creates the store); both are documents of bounded size, so
    # an error waits for the other at most that long before the stage is removed
    with staged_output(out, store, force) as stage, ThreadPoolExecutor(2) as beside:
        config = beside.submit(blob_bytes, client, ref, parsed.config, stage / ".config")
        summary_read = beside.submit(_read_summary, client, ref, parsed, stage, report)
        _check_config(config.result(), parsed, str(ref))
        (stage / ".config").unlink()
        legacy = None
        if parsed.assembly is not None:  # a format 1 artifact: its own record
            legacy = parse_assembly(blob_bytes(client, ref, parsed.assembly,
                                               stage / ".assembly"), parsed, str(ref))
            (stage / ".assembly").unlink()
        with store.leased():
            summary = summary_read.result()
            files = summary_assembly(summary, parsed, str(ref)) if legacy is None else legacy
            check_declared_sizes(parsed, files, summary, str(ref))
            plan = _plan_variant(client, ref, parsed, files, summary, stage, report,
                                 device=device, scenario=scenario)
            hashed = fetch_and_assemble(client, ref, store,
                                        {**plan.companion_layers, **parsed.payloads},
                                        plan.wanted, report, jobs, progress, plan.folder,
                                        plan.files + plan.companions)
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


METADATA_JOBS = 4  # metadata files (models, device records, ...) downloaded at once


def _download_files(client: RegistryClient, ref: Reference, parsed: ParsedArtifact,
                    names: list[str], stage: Path, report: PullReport,
                    also: str | None = None) -> dict[str, str]:
    """Download the layers of ``names`` into ``stage``, :data:`METADATA_JOBS` at a time
    (their requests and syncs overlap instead of queueing one behind the other); with
    ``also`` (an algorithm), returns each file's ``"<algo>:<hex>"`` taken on the way."""
    descs = {}
    for name in names:
        desc = parsed.files.get(name)
        if desc is None:
            raise RegistryError("malformed model artifact: a file its metadata names has no "
                                "layer", reference=str(ref), file=name)
        descs[name] = desc
        (stage / name).parent.mkdir(parents=True, exist_ok=True)

    def fetch(name: str) -> tuple[int, str | None]:
        return download(client, ref, descs[name], stage / name, also=also)

    if len(names) > 1:
        with ThreadPoolExecutor(min(METADATA_JOBS, len(names))) as pool:
            done = list(pool.map(fetch, names))
    else:
        done = [fetch(name) for name in names]
    found = {}
    for name, (received, hex_) in zip(names, done, strict=True):
        report.file_bytes += received
        if also is not None and hex_ is not None:
            found[name] = make_key(also, hex_)
    return found


def _check_listed(summary: dict[str, Any], names: list[str], taken: dict[str, str],
                  ref: Reference) -> None:
    """The package files ``names`` a variant folder is made from (its models, a device's
    record; ``taken``: their digests, taken as they downloaded) are the bytes the summary's
    ``contents`` lists, as a whole pull checks every file (a summary from before
    ``contents`` lists none)."""
    if contents_algo(summary) is None:
        return
    listed = {c.get("path"): c.get("digest") for c in summary["contents"]}
    for name in names:
        if listed.get(name) != taken.get(name):
            raise IntegrityError("the pulled package does not match its summary",
                                 reference=str(ref), file=name, expected=listed.get(name),
                                 actual=taken.get(name))


def _load_model(path: Path, ref: Reference) -> ModelProto:
    """A model file of the artifact, parsed; a malformed one is a typed error."""
    from google.protobuf.message import DecodeError

    from ..catalogue.utf8 import check_message
    from ..io.onnx_proto import ModelProto, parse_model

    try:
        data = path.read_bytes()
        # before parsing: protobuf's pure-Python parser (protobuf 3) refuses such a string
        # itself, naming neither the field nor the offset
        check_message(memoryview(data), 0, len(data), ModelProto.DESCRIPTOR)
        return parse_model(data)
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
    needs (key -> size, companion files' included), its companion files (each one payload,
    fetched by the layer ``companion_layers`` names for its key), and for a whole package
    its summary and the digests of the files downloaded whole (in the algorithm of the
    summary's ``contents``)."""

    folder: Path
    files: list[WeightFile]
    wanted: dict[str, int]
    summary: dict[str, Any] | None = None
    known: dict[str, str] = field(default_factory=dict)
    companions: list[WeightFile] = field(default_factory=list)
    companion_layers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _companions(entries: dict[str, Any], layers: dict[str, dict[str, Any]],
                ref: Reference) -> tuple[list[WeightFile], dict[str, dict[str, Any]],
                                         dict[str, str]]:
    """The companion files ``entries`` names (path in the output -> summary entry) as
    files of one payload each, keyed by the digest the summary lists, each key's layer
    (from ``layers``: a companion file's digest -> its layer), and the digest of what
    each file will hold. A payload is fetched into the store as a weight payload is, its
    sha256 and its key both checked on the bytes as they arrive, and written from there
    re-hashed: a file holds its key's bytes or is not written (an empty file, the empty
    digest)."""
    files, found, written = [], {}, {}
    for name, entry in sorted(entries.items()):
        try:
            key, size = str(entry["digest"]), entry["size"]
            split_key(key)
            if type(size) is not int or size < 0:
                raise ValueError(size)
        except (KeyError, TypeError, ValueError, IntegrityError):
            raise RegistryError("malformed model artifact: a companion file's entry in the "
                                "summary", reference=str(ref), file=name) from None
        layer = layers.get(key)
        if layer is None or layer["size"] != size:
            raise RegistryError("malformed model artifact: a companion file the summary "
                                "lists has no layer of its size", reference=str(ref),
                                file=name, size=size,
                                layer_size=None if layer is None else layer["size"])
        files.append(WeightFile(name, size, (Piece(key, 0, size),) if size else ()))
        if size:
            found[key] = layer
            written[name] = key
        else:
            algo = split_key(key)[0]
            written[name] = make_key(algo, new_hasher(algo).hexdigest())
    return files, found, written


def _companion_layers(summary: dict[str, Any], parsed: ParsedArtifact, ref: Reference,
                      ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Every companion file of the package: its path -> summary entry, and its digest
    -> its layer."""
    try:
        every = companion_files(summary)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise RegistryError("malformed model artifact: the summary's companion files",
                            reference=str(ref), file=SUMMARY_NAME) from None
    layers = {}
    for name, entry in sorted(every.items()):
        desc = parsed.files.get(name)
        if desc is None:
            raise RegistryError("malformed model artifact: a file its metadata names has "
                                "no layer", reference=str(ref), file=name)
        layers.setdefault(str(entry.get("digest")), desc)
    return every, layers



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
    every, layers = _companion_layers(summary, parsed, ref)
    if device is None and scenario is None:
        algo = contents_algo(summary)
        companions, by_key, written = _companions(every, layers, ref)
        known = _download_files(client, ref, parsed,
                                sorted(set(parsed.files) - {SUMMARY_NAME} - set(every)),
                                stage, report, also=algo)
        wanted = {p.key: p.size for f in files + companions for p in f.pieces}
        return _Plan(stage, files, _count(wanted, report), summary, {**known, **written},
                     companions, by_key)
    from ..package.bundle_record import BUNDLE_NAME, device_record, render_record
    from ..package.summary import layout_alignment
    from ..packaging.variant_files import VariantModel, write_models
    from ..resolve.source import record_beside, store_keys_of
    from ..resolve.variant import variant_graph

    by_name = {m.get("name"): store_keys_of(m) for m in summary["models"]}
    entries = _variant_companions(summary, device, ref)
    result = make_temp_dir(stage, ".variant.")
    models: list[VariantModel] = []
    record = None
    if device is not None:
        prefix = f"{DEVICES}/{device}/"
        names = sorted(n for n in parsed.files if n.startswith(prefix) and n not in every)
        if not names:
            known = sorted({n.split("/")[1] for n in parsed.files
                            if n.startswith(f"{DEVICES}/") and n.count("/") == 2})
            raise PackageError("no such device in the artifact", device=device,
                               reference=str(ref), known=", ".join(known) or "none")
        taken = _download_files(client, ref, parsed, names, stage, report,
                                also=contents_algo(summary))
        from ..package.bundle_record import read_bundle

        record = read_bundle(stage, device)
        _no_clash(entries, [str(e["file"]) for e in record["models"]], files, ref)
        for entry in record["models"]:
            path = stage / prefix / entry["file"]
            # the keys of the record beside it (format 2); a format 1 record's are the
            # summary's
            keys = store_keys_of(record_beside(path) or {}) or by_name.get(entry.get("name"),
                                                                              {})
            models.append(VariantModel(entry.get("name"), entry["file"],
                                       _load_model(path, ref), entry["scenario"], keys))
        _check_listed(summary, names, taken, ref)
    else:
        models_of = [(m, list(m.get("scenarios", []))) for m in summary["models"]]
        _no_clash(entries, [str(m["file"]) for m, _ in models_of], files, ref)
        if not any(scenario in names for _, names in models_of):
            raise ScenarioError("no model of the artifact has this scenario",
                                scenario=scenario, reference=str(ref))
        model_files = [str(m["file"]) for m, _ in models_of]
        taken = _download_files(client, ref, parsed, model_files, stage, report,
                                also=contents_algo(summary))
        for m, names in models_of:
            file, chosen = str(m["file"]), scenario if scenario in names else None
            resolved = variant_graph(_load_model(stage / file, ref), chosen)
            keys = store_keys_of(record_beside(stage / file) or {})  # the summary's
            models.append(VariantModel(str(m["name"]), file, resolved, chosen, keys))
        _check_listed(summary, model_files, taken, ref)
    # the models, their live payloads at their places in the folder's own weight files
    written = write_models(result, models, layout_alignment(summary),
                           contents_algo(summary) or str(summary.get("hash") or "blake3"))
    live = written.live
    for key in live:
        if key not in parsed.payloads:
            file, _ = written.sources[key]
            raise RegistryError("a live weight has no payload layer in the artifact",
                                reference=str(ref), file=file, key=key)
    # the companion files its runtime opens, at the folder's root
    companions, by_key, _ = _companions(entries, layers, ref)
    listed = [entries[name] for name in sorted(entries)]
    sizes = {f.name: f.size for f in written.files}
    # the variant folder's own record, as a device's: its models, their files and keys,
    # its companion files
    if record is None:
        record = device_record(None, {}, scenario, written.entries, sizes, listed)
    else:
        record = device_record(record["device"], record.get("capabilities") or {},
                               record.get("scenario_rule"), written.entries, sizes, listed)
    (result / BUNDLE_NAME).write_bytes(render_record(record))
    wanted = {**live, **{p.key: p.size for f in companions for p in f.pieces}}
    return _Plan(result, written.files, _count(wanted, report), companions=companions,
                 companion_layers=by_key)


def _no_clash(entries: dict[str, Any], models: list[str], files: list[WeightFile],
              ref: Reference) -> None:
    """A variant folder holds its models, its record and weight files at their names, and
    its companion files at their paths: none of those may be another's, nor a folder of
    it (:func:`.recipe.companions.collision`)."""
    from ..package.bundle_record import BUNDLE_NAME
    from ..recipe.companions import collision

    taken = sorted({BUNDLE_NAME, *models, *(f.name for f in files)})
    for name in sorted(entries):
        other = collision(name, taken)
        if other is not None:
            raise RegistryError("malformed model artifact: a companion file has the path of "
                                "another file of the variant's folder", reference=str(ref),
                                file=name, other=other)
        taken.append(name)


def _variant_companions(summary: dict[str, Any], device: str | None,
                        ref: Reference) -> dict[str, Any]:
    """The companion files a variant folder holds at its root (path -> summary entry): a
    device's own set (``devices[i].companions``: the package's with the device's
    overrides in their place), the package's for a scenario."""
    try:
        if device is None:
            chosen = summary.get("companions") or []
        else:
            chosen = next((d.get("companions") or [] for d in summary.get("devices") or []
                           if d["name"] == device), [])
        return {str(c["path"]): c for c in chosen}
    except (KeyError, TypeError, AttributeError):
        raise RegistryError("malformed model artifact: the summary's companion files",
                            reference=str(ref), file=SUMMARY_NAME) from None


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
