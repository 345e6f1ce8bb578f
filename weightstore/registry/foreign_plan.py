"""The planner of foreign pulls: a manifest weightstore did not push, checked, and where
each of its layers goes (:func:`plan_foreign`), before a byte is fetched.

Pure: it reads the manifest (and a ModelPack config) alone and imports nothing of the
registry client, so that :mod:`.oci_layout` (``weightstore assemble`` of a local OCI image
layout, offline) uses the very rules a pull uses. The executor is :mod:`.foreign`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RegistryError
from ..io.files import is_relative_inside
from ..io.files import parse_json as _parse_json
from ..package.assembly import Piece, WeightFile
from .reference import DIGEST

FINGERPRINT = "org.weightstore.fingerprint"  # the mark of weightstore's own artifacts
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
MODELPACK_TYPE = "application/vnd.cncf.model.manifest.v1+json"
MODELPACK_CONFIG = "application/vnd.cncf.model.config.v1+json"
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
ORAS_UNPACK = "io.deis.oras.content.unpack"
# every layer type the ModelPack specification defines
MODELPACK_LAYER = re.compile(
    r"application/vnd\.cncf\.model\.(?:weight|weight\.config|doc|code|dataset)\.v1\."
    r"(raw|tar|tar\+gzip|tar\+zstd)")
OCI_ARCHIVES = {"application/vnd.oci.image.layer.v1.tar+gzip",
                "application/vnd.oci.image.layer.v1.tar+zstd"}
EMPTY = "sha256:" + hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class ForeignLayer:
    """One layer: a file written at ``path``, or (``archive`` set: "tar", "gzip" or
    "zstd") a tar unpacked into the folder, ``path`` naming what it holds."""

    index: int
    path: str
    descriptor: dict[str, Any]
    archive: str | None = None
    diff_id: str | None = None  # a compressed tar's: the sha256 of the tar inside


@dataclass(frozen=True)
class ForeignPlan:
    """What a foreign artifact's pull writes."""

    modelpack: bool
    config: dict[str, Any]  # the config descriptor
    layers: tuple[ForeignLayer, ...]

    def files(self) -> list[WeightFile]:
        """The raw layers as files of one piece each (its payload, keyed by its digest);
        an empty one has no piece."""
        return [WeightFile(x.path, x.descriptor["size"],
                           (Piece(x.descriptor["digest"], 0, x.descriptor["size"]),)
                           if x.descriptor["size"] else ())
                for x in self.layers if x.archive is None]

    def payloads(self) -> dict[str, dict[str, Any]]:
        """Store key (the sha256 digest) -> descriptor of every raw layer with bytes."""
        return {x.descriptor["digest"]: x.descriptor for x in self.layers
                if x.archive is None and x.descriptor["size"]}

    def archives(self) -> list[ForeignLayer]:
        return [x for x in self.layers if x.archive is not None]


def is_foreign(manifest: bytes) -> bool:
    """A manifest weightstore did not push: a JSON object without its fingerprint
    annotation (anything else is left to the own artifact's parser to refuse)."""
    try:
        doc = _parse_json(manifest)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    notes = doc.get("annotations")
    return not (isinstance(notes, dict) and FINGERPRINT in notes)


def refused(why: str, reference: str, **ctx: Any) -> RegistryError:
    return RegistryError(f"cannot pull this artifact: {why}", reference=reference, **ctx)


def _descriptor(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("mediaType"), str)
            and isinstance(d.get("digest"), str) and bool(DIGEST.fullmatch(d["digest"]))
            and type(d.get("size")) is int and d["size"] >= 0)


def plan_foreign(manifest: bytes, reference: str) -> ForeignPlan:
    """Check a foreign manifest and say where each layer goes. Refused, each with one
    :class:`RegistryError` naming the layer: a layer without a path, a path that is empty,
    absolute or leaves the folder, two files at one path (or a file where another file's
    folder must be), a ModelPack layer of a type ModelPack does not define, an empty
    file layer whose digest is not the empty blob's."""
    try:
        doc = _parse_json(manifest)
    except ValueError as exc:
        raise refused(f"the manifest is not JSON ({exc})", reference) from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise refused("not an OCI manifest (schemaVersion 2)", reference)
    if doc.get("mediaType", MANIFEST_TYPE) != MANIFEST_TYPE:
        raise refused("not an OCI image manifest", reference, mediaType=doc.get("mediaType"))
    config = doc.get("config")
    if not _descriptor(config):
        raise refused("the config descriptor is missing or malformed", reference)
    modelpack = (doc.get("artifactType") == MODELPACK_TYPE
                 or config["mediaType"] == MODELPACK_CONFIG)
    if modelpack and config["mediaType"] != MODELPACK_CONFIG:
        raise refused("a ModelPack artifact's config is not a ModelPack config", reference,
                   mediaType=config["mediaType"])
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise refused("the manifest lists no layers", reference)
    planned = [_plan_layer(i, layer, modelpack, reference) for i, layer in enumerate(layers)]
    _check_paths(planned, reference)
    return ForeignPlan(modelpack, config, tuple(planned))


def _plan_layer(i: int, layer: Any, modelpack: bool, reference: str) -> ForeignLayer:
    if not _descriptor(layer):
        raise refused("a layer descriptor is malformed", reference, layer=i)
    notes = layer.get("annotations") or {}
    if not isinstance(notes, dict):
        raise refused("a layer's annotations are not an object", reference, layer=i)
    media = layer["mediaType"]
    kind = MODELPACK_LAYER.fullmatch(media)
    if modelpack and kind is None:
        raise refused("a layer of a media type ModelPack does not define", reference, layer=i,
                   mediaType=media)
    path = notes.get(FILEPATH, notes.get(TITLE))
    if path is None:
        raise refused(f"a layer names no file ({FILEPATH} or {TITLE})", reference, layer=i)
    unpack = ((kind is not None and kind.group(1) != "raw") or notes.get(ORAS_UNPACK) == "true"
              or (media in OCI_ARCHIVES and notes.get(ORAS_UNPACK) != "false"))
    if isinstance(path, str):
        path = relative_path(path)
        if unpack:
            path = path.rstrip("/")  # a folder's name
    if not is_relative_inside(path):
        raise refused("unsafe file path (empty, absolute, or leaving the folder)", reference,
                   layer=i, filepath=repr(path))
    if not unpack:
        if layer["size"] == 0 and layer["digest"] != EMPTY:
            raise refused("an empty layer names the digest of other bytes", reference, layer=i,
                       digest=layer["digest"])
        return ForeignLayer(i, path, layer)
    archive = "gzip" if media.endswith("+gzip") else "zstd" if media.endswith("+zstd") else "tar"
    return ForeignLayer(i, path, layer, archive)


def relative_path(path: str) -> str:
    """``./a/b`` is ``a/b`` (tar and modelpack-client accept the prefix); what is left
    must still pass :func:`~weightstore.io.files.is_relative_inside`."""
    while path.startswith("./"):
        path = path[2:]
    return path


def _check_paths(layers: list[ForeignLayer], reference: str) -> None:
    """No two files at one path, and no file where another file's folder must be (tar
    members are checked as they are unpacked)."""
    files: dict[str, int] = {}
    for x in layers:
        if x.archive is None:
            if x.path in files:
                raise refused("two layers for one file path", reference, filepath=x.path,
                           layer=x.index)
            files[x.path] = x.index
    for name, index in files.items():
        parts = name.split("/")
        for n in range(1, len(parts)):
            if "/".join(parts[:n]) in files:
                raise refused("a file path runs through another file", reference,
                           filepath=name, layer=index)


def check_diff_ids(plan: ForeignPlan, config: bytes, reference: str) -> ForeignPlan:
    """A ModelPack config's ``modelfs.diffIds`` must name one digest per layer: the
    layer's own digest for a raw or uncompressed tar layer, the sha256 of the tar inside
    for a compressed one (checked as it is unpacked: the plan returned carries it)."""
    try:
        doc = _parse_json(config)
        diff_ids = doc["modelfs"]["diffIds"]
    except (ValueError, KeyError, TypeError):
        raise refused("the ModelPack config has no modelfs.diffIds", reference) from None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(plan.layers):
        raise refused("the config's modelfs.diffIds do not match the layers", reference,
                   diffIds=len(diff_ids) if isinstance(diff_ids, list) else None,
                   layers=len(plan.layers))
    out = []
    for x, diff_id in zip(plan.layers, diff_ids, strict=True):
        if not isinstance(diff_id, str) or not DIGEST.fullmatch(diff_id):
            raise refused("a diffId is not a sha256 digest", reference, layer=x.index,
                       diffId=repr(diff_id)[:80])
        if x.archive in (None, "tar"):
            if diff_id != x.descriptor["digest"]:
                raise refused("a layer's diffId is not its digest", reference, layer=x.index,
                           digest=x.descriptor["digest"], diffId=diff_id)
            out.append(x)
        else:
            out.append(replace(x, diff_id=diff_id))
    return replace(plan, layers=tuple(out))
