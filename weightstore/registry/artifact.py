"""The package as an OCI artifact in the CNCF ModelPack v1 shape: a pure planner.

Metadata in (``summary.json`` and the folder's file list), descriptors and documents out;
no payload bytes are read here. Every layer is a file of the artifact: it has a media type
the ModelPack specification defines and its relative path in ``org.cncf.model.filepath``
and ``org.opencontainers.image.title``, so any ModelPack or ORAS client writes it where it
belongs. The unit of transfer is the weight payload, not the file:

- one layer per distinct payload (``application/vnd.cncf.model.weight.v1.raw``), carrying
  ``org.weightstore.payload`` (its store key). A payload that is a whole per-weight file
  ``weight_<hex>`` has that file's path (one layer per such file: a payload that is two
  files of a split layout is one blob named by two layers); every other payload (a piece
  of a combined or split file) has a path of its own, ``payloads/weight_<hex>``
  (:func:`payload_paths`);
- every other file (models, ``summary.json``, device folders) as one layer at its path;
  ONNX graphs are ``weight`` layers, records ``weight.config`` layers, and each companion
  file the summary lists (configs, tokenizers, docs, code: :func:`companion_files`) the
  layer type ModelPack gives its kind (:data:`KIND_TYPES`). Identical bytes are one blob,
  named by as many layers as files hold them.

There is no separate assembly record: ``summary.json`` lists every weight file and where
each payload sits in it (key, offset, size), which is all ``weightstore pull`` and
``weightstore assemble`` need to rebuild combined and split files byte for byte.
Artifacts of format 1 (an ``application/vnd.weightstore.assembly.v1+json`` layer, paths
on per-weight payloads only) are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import PackageError, RegistryError
from ..io.digests import split_key
from ..io.files import MAX_ALIGNMENT, is_relative_inside, parse_json
from ..package.assembly import WeightFile, summary_weight_files
from ..package.assembly import weight_file as _weight_file
from ..package.bundle_record import device_path
from .reference import DIGEST

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT_TYPE = "application/vnd.cncf.model.weight.v1.raw"
FILE_TYPE = "application/vnd.cncf.model.weight.config.v1.raw"
# the layer type of each kind of companion file, as the ModelPack specification names them
KIND_TYPES = {"config": FILE_TYPE, "doc": "application/vnd.cncf.model.doc.v1.raw",
              "code": "application/vnd.cncf.model.code.v1.raw",
              "dataset": "application/vnd.cncf.model.dataset.v1.raw",
              "weights": WEIGHT_TYPE}
ASSEMBLY_TYPE = "application/vnd.weightstore.assembly.v1+json"  # format 1 artifacts only
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
PAYLOAD = "org.weightstore.payload"
FORMAT = "org.weightstore.format_version"
FINGERPRINT = "org.weightstore.fingerprint"
FORMAT_VERSION = 2  # of the artifact: 1 had an assembly record layer
ASSEMBLY_VERSION = 1
PAYLOADS_DIR = "payloads"  # where payloads that are no whole file of the package go
GRAPH_SUFFIX = ".onnx"  # files pushed as weight layers; other files are weight.config
SUMMARY_NAME = "summary.json"
FIXED_EPOCH = 0  # createdAt when SOURCE_DATE_EPOCH is not set: builds carry no time



@dataclass(frozen=True)
class PackagePlan:
    """What a package folder holds, as the artifact sees it."""

    package: str
    version: str
    layout: str
    hash: str
    fingerprint: str
    weight_files: tuple[WeightFile, ...]
    other_files: tuple[str, ...]  # every other regular file, '/'-separated, sorted
    kinds: Mapping[str, str] = field(default_factory=dict)  # companion file path -> kind

    def layer_type(self, name: str) -> str:
        """The media type of the layer of ``name``, a file other than a weight file."""
        kind = self.kinds.get(name)
        return layer_type(name) if kind is None else KIND_TYPES[kind]

    def payload_sizes(self) -> dict[str, int]:
        """Every distinct payload key with its size, in file then offset order."""
        out: dict[str, int] = {}
        for f in self.weight_files:
            for p in f.pieces:
                out.setdefault(p.key, p.size)
        return out

    def payload_sources(self) -> dict[str, tuple[str, int]]:
        """Where each payload's bytes first sit in the package: (file, offset)."""
        out: dict[str, tuple[str, int]] = {}
        for f in self.weight_files:
            for p in f.pieces:
                out.setdefault(p.key, (f.name, p.offset))
        return out


def plan_package(folder: Path, summary: Mapping[str, Any], files: list[str]) -> PackagePlan:
    """Split the folder's ``files`` into weight files (from the summary) and the rest."""
    try:
        found = summary_weight_files(summary)
        head = (str(summary["package"]), str(summary["version"]),
                str(summary["layout"]["name"]), str(summary["hash"]),
                str(summary["fingerprint"]))
        kinds = {name: str(c["kind"]) for name, c in companion_files(summary).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise PackageError(f"malformed summary.json: {exc!r}", folder=str(folder)) from None
    for name, kind in sorted(kinds.items()):
        if kind not in KIND_TYPES:
            raise PackageError("malformed summary.json: a companion file of an unknown kind",
                               folder=str(folder), file=name, kind=kind)
    present = set(files)
    for f in found:
        if f.name not in present:
            raise PackageError("a weight file the summary lists is missing", folder=str(folder),
                               file=f.name)
    others = tuple(sorted(present - {f.name for f in found}))
    return PackagePlan(*head, weight_files=tuple(found), other_files=others, kinds=kinds)


def companion_files(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every companion file the package holds, by its path in the package, with its
    summary entry (``path``, ``size``, ``digest``, ``kind``): the package's own at their
    paths, and each device's that has bytes of its own (an override, listed in
    ``contents``) at ``devices/<device>/<path>``. Empty for a summary before companions.
    A malformed summary raises KeyError, TypeError or ValueError."""
    out: dict[str, Mapping[str, Any]] = {str(c["path"]): c
                                         for c in summary.get("companions") or ()}
    listed = {str(c["path"]) for c in summary.get("contents") or ()}
    for device in summary.get("devices") or ():
        for c in device.get("companions") or ():
            name = device_path(str(device["name"]), str(c["path"]))
            if name in listed:
                out[name] = c
    return out


def list_files(folder: Path) -> list[str]:
    """Every regular file below ``folder`` ('/'-separated); hidden names are build
    leftovers and locks, never part of a package. Symlinks are refused, to folders too
    (``os.walk`` would neither follow nor show them)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise PackageError("package folders hold only regular files",
                                   file=str(Path(dirpath) / name))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                raise PackageError("package folders hold only regular files", file=str(path))
            out.append(path.relative_to(folder).as_posix())
    return out


# -- documents --------------------------------------------------------------------------


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def created_at(environ: Mapping[str, str] | None = None) -> str:
    """RFC 3339 time from ``SOURCE_DATE_EPOCH`` (reproducible builds), else the fixed
    epoch: the same package always gives the same artifact."""
    env = os.environ if environ is None else environ
    text = env.get("SOURCE_DATE_EPOCH", "").strip()
    try:
        seconds = int(text) if text else FIXED_EPOCH
    except ValueError:
        raise RegistryError("SOURCE_DATE_EPOCH must be an integer", value=text) from None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Artifact:
    """Descriptors and documents of one push; ``blobs`` are every layer plus config."""

    manifest: bytes
    config: bytes
    layers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def manifest_digest(self) -> str:
        return sha256_digest(self.manifest)


def assembly_record(plan: PackagePlan, sha256: Mapping[str, str]) -> bytes:
    """The assembly record of format 1 artifacts (which format 2 no longer pushes: its
    content is the summary's); kept to describe and test the artifacts still read."""
    return canonical({
        "format_version": ASSEMBLY_VERSION,
        "package": plan.package, "version": plan.version, "layout": plan.layout,
        "hash": plan.hash,
        "files": [{"name": f.name, "size": f.size,
                   "pieces": [{"key": p.key, "digest": sha256[p.key], "offset": p.offset,
                               "size": p.size} for p in f.pieces]}
                  for f in plan.weight_files],
    })


def payload_paths(files: Iterable[WeightFile]) -> dict[str, list[str]]:
    """The file paths of each payload's layers, from the weight files alone (so push,
    which names the layers, and ``weightstore assemble``, which finds them in a folder a
    generic client pulled, agree): every whole per-weight file ``weight_<hex>`` holding
    it, in name order, or else ``payloads/weight_<hex>`` (the payload's own file, named
    as GE names per-weight files). Keys in file then offset order."""
    files = list(files)
    out: dict[str, list[str]] = {}
    for f in files:
        if f.is_separate:
            out.setdefault(f.pieces[0].key, []).append(f.name)
    order: dict[str, list[str]] = {}
    for f in files:
        for p in f.pieces:
            order.setdefault(p.key, out.get(p.key)
                             or [f"{PAYLOADS_DIR}/weight_{split_key(p.key)[1]}"])
    return order


def layer_type(name: str) -> str:
    """An ONNX graph is a ``weight`` layer, any other file (records) a ``weight.config``."""
    return WEIGHT_TYPE if name.endswith(GRAPH_SUFFIX) else FILE_TYPE


def _layer(media_type: str, digest: str, size: int, path: str,
           **annotations: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size,
            "annotations": {FILEPATH: path, TITLE: path, **annotations}}


def build_artifact(plan: PackagePlan, payload_sha256: Mapping[str, str],
                   file_digests: Mapping[str, tuple[str, int]], created: str) -> Artifact:
    """Config and manifest for ``plan``; ``file_digests`` are the (sha256, size) of every
    other file. Two layers with one file path (a file of the package where a payload's
    own file would go) are a :class:`PackageError`: a generic client would write one
    over the other."""
    layers: list[dict[str, Any]] = []
    paths = payload_paths(plan.weight_files)
    for key, size in plan.payload_sizes().items():
        layers.extend(_layer(WEIGHT_TYPE, payload_sha256[key], size, path, **{PAYLOAD: key})
                      for path in paths[key])
    for name in plan.other_files:
        digest, size = file_digests[name]
        layers.append(_layer(plan.layer_type(name), digest, size, name))
    seen: set[str] = set()
    for layer in layers:
        path = layer["annotations"][FILEPATH]
        if path in seen:
            raise PackageError("two layers of the artifact would have one file path; "
                               "nothing was pushed", file=path)
        seen.add(path)
    config = canonical({
        "descriptor": {"name": plan.package, "version": plan.version, "createdAt": created},
        "config": {"format": "onnx"},
        "modelfs": {"type": "layers", "diffIds": [layer["digest"] for layer in layers]},
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(config),
                   "size": len(config)},
        "layers": layers,
        "annotations": {"org.opencontainers.image.version": plan.version,
                        "org.weightstore.layout": plan.layout,
                        FINGERPRINT: plan.fingerprint,
                        FORMAT: str(FORMAT_VERSION)},
    })
    return Artifact(manifest=manifest, config=config, layers=layers)


# -- reading an artifact back -------------------------------------------------------------


@dataclass(frozen=True)
class ParsedArtifact:
    """A pulled manifest, checked: what to fetch and how to assemble it."""

    config: dict[str, Any]  # the config descriptor
    assembly: dict[str, Any] | None  # a format 1 artifact's assembly layer descriptor
    files: dict[str, dict[str, Any]]  # filepath -> descriptor of other files
    payloads: dict[str, dict[str, Any]]  # store key -> descriptor
    annotations: dict[str, str]


def parse_manifest(data: bytes, reference: str) -> ParsedArtifact:
    """Check a manifest's shape; every problem is a :class:`RegistryError` naming it."""
    def bad(why: str, **ctx: Any) -> RegistryError:
        return RegistryError(f"malformed model manifest: {why}", reference=reference, **ctx)

    try:
        doc = parse_json(data)
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise bad("not an OCI manifest (schemaVersion 2)")
    if doc.get("artifactType") != ARTIFACT_TYPE:
        raise bad("not a ModelPack artifact", artifactType=doc.get("artifactType"))
    config = doc.get("config")
    if not descriptor_ok(config) or config["mediaType"] != CONFIG_TYPE:
        raise bad("config descriptor missing or of another type")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise bad("no layer list")
    assembly = None
    files: dict[str, dict[str, Any]] = {}
    payloads: dict[str, dict[str, Any]] = {}
    paths: set[str] = set()
    for i, layer in enumerate(layers):
        if not descriptor_ok(layer):
            raise bad("layer descriptor malformed", layer=i)
        notes = layer.get("annotations") or {}
        if not isinstance(notes, dict):
            raise bad("layer annotations are not an object", layer=i)
        if layer["mediaType"] == ASSEMBLY_TYPE:
            assembly = layer
            continue
        name = None
        if FILEPATH in notes:
            name = _safe_path(notes[FILEPATH], reference)
            if name in paths:
                raise bad("two layers for one file path", filepath=name)
            paths.add(name)
        if layer["mediaType"] == WEIGHT_TYPE and PAYLOAD in notes:
            key = notes[PAYLOAD]
            try:
                split_key(key)
            except (ValueError, TypeError):
                raise bad("payload key malformed", layer=i) from None
            first = payloads.setdefault(key, layer)
            if (first["digest"], first["size"]) != (layer["digest"], layer["size"]):
                raise bad("two layers name one payload with other bytes", key=key, layer=i)
        elif name is not None:
            files[name] = layer
    annotations = doc.get("annotations") or {}
    return ParsedArtifact(config, assembly, files, payloads,
                          annotations if isinstance(annotations, dict) else {})


def descriptor_ok(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("mediaType"), str)
            and isinstance(d.get("digest"), str) and bool(DIGEST.fullmatch(d["digest"]))
            and type(d.get("size")) is int and d["size"] >= 0)


def _safe_path(name: Any, reference: str) -> str:
    """A layer's file path must stay inside the package folder."""
    if not is_relative_inside(name, hidden=False):
        raise RegistryError("malformed model manifest: unsafe file path", reference=reference,
                            filepath=name)
    return name


def parse_assembly(data: bytes, parsed: ParsedArtifact, reference: str) -> list[WeightFile]:
    """The weight files of a format 1 artifact's assembly record, each piece's payload in
    the manifest."""
    def bad(why: str, **ctx: Any) -> RegistryError:
        return RegistryError(f"malformed assembly record: {why}", reference=reference, **ctx)

    try:
        doc = parse_json(data)
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format_version") != ASSEMBLY_VERSION:
        raise RegistryError("unsupported assembly record version", reference=reference,
                            version=doc.get("format_version") if isinstance(doc, dict)
                            else None)
    out = []
    try:
        for i, f in enumerate(doc["files"]):
            name = _safe_path(f["name"], reference)
            found = {(_count(p["offset"], bad, file=name, entry=i),
                      _count(p["size"], bad, file=name, entry=i), str(p["key"]))
                     for p in f["pieces"]}
            wf = _weight_file(name, _count(f["size"], bad, file=name, entry=i), found)
            out.append(_with_payloads(wf, parsed, reference, bad))
    except (KeyError, TypeError, AttributeError) as exc:
        raise bad(f"{type(exc).__name__}: {exc}") from None
    except PackageError as exc:  # pieces that overlap or leave their file, a bad key
        raise bad(exc.message, **exc.context) from None
    return out


def summary_assembly(summary: Mapping[str, Any], parsed: ParsedArtifact,
                     reference: str) -> list[WeightFile]:
    """The weight files the artifact's ``summary.json`` lists (its models place each
    payload at an offset of a file: the assembly record of format 2), each piece's
    payload in the manifest, as :func:`parse_assembly` checks a format 1 record."""
    def bad(why: str, **ctx: Any) -> RegistryError:
        return RegistryError(f"malformed model artifact: {why}", reference=reference, **ctx)

    try:
        found = summary_weight_files(summary)
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"the summary's weight files are malformed ({type(exc).__name__})",
                  file=SUMMARY_NAME) from None
    except PackageError as exc:  # pieces that overlap or leave their file, a bad key
        raise bad(exc.message, summary=SUMMARY_NAME, **exc.context) from None
    return [_with_payloads(f, parsed, reference, bad) for f in found]


def _with_payloads(wf: WeightFile, parsed: ParsedArtifact, reference: str,
                   bad: Callable[..., RegistryError]) -> WeightFile:
    """``wf``, once every piece has a payload layer of its size and no run of zeros
    between pieces is longer than any alignment pads (a size out of proportion)."""
    for p in wf.pieces:
        layer = parsed.payloads.get(p.key)
        if layer is None or layer["size"] != p.size:
            raise RegistryError("malformed model manifest: assembly names a payload "
                                "without its layer", reference=reference, key=p.key,
                                size=p.size,
                                layer_size=None if layer is None else layer["size"])
    for offset, length in wf.gaps():
        if length > MAX_ALIGNMENT:
            raise bad("a weight file's size is out of proportion to its pieces: "
                      "more zero bytes in a row than any alignment pads",
                      file=wf.name, size=wf.size, offset=offset, zeros=length,
                      limit=MAX_ALIGNMENT)
    return wf


def _count(value: Any, bad: Callable[..., RegistryError], **ctx: Any) -> int:
    """An offset or size: an integer, never negative (not a float, a string or a bool)."""
    if type(value) is not int or value < 0:
        raise bad("an offset or size is not a non-negative integer", value=repr(value)[:40],
                  **ctx)
    return value
