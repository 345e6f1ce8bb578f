"""Pulling foreign artifacts: any CNCF ModelPack artifact, and plain ORAS artifacts.

weightstore recognises its own artifacts by the manifest annotation
``org.weightstore.fingerprint``; every other manifest is *foreign* and pulled here, as a
folder of the files its layers hold::

    OUT/
      model.onnx          <- a raw layer, org.cncf.model.filepath "model.onnx"
      model.onnx.data     <- a raw layer (else org.opencontainers.image.title names it)
      weights/            <- a tar layer (.tar, .tar+gzip, .tar+zstd), unpacked here:
        w000.bin             its members carry their own paths, relative to OUT

:func:`plan_foreign` is the pure planner: the manifest in, what goes where out, every path
checked before a byte is fetched. A ModelPack artifact (its ``artifactType`` or config
type) may hold only the layer types ModelPack defines; a plain ORAS artifact (any other
``artifactType``) may hold any, each named by its title; a layer is unpacked when it is a
ModelPack tar type, when it carries ORAS's ``io.deis.oras.content.unpack: true``, or when
it is an OCI ``tar+gzip``/``tar+zstd`` layer (oras-py's folders), and is otherwise a file.

:func:`pull_foreign` carries the plan out with the machinery of every pull
(:mod:`.fetch`): raw layers are payloads keyed by their sha256 digest, downloaded into the
store while their sha256 is checked and copied out of it (re-hashed) into a temp folder
beside OUT, which is published in one step; tar layers are downloaded (checked the same
way) and unpacked safely into that folder, their uncompressed bytes checked against the
config's ``modelfs.diffIds``. Any refusal leaves OUT as it was.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import re
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import RegistryError
from ..io.files import (
    WRITE_ERRNOS,
    discard_temp_dir,
    is_relative_inside,
    make_temp_dir,
    publish_dir,
)
from ..io.files import parse_json as _parse_json
from ..io.tar import REGULAR, BoundedTarInfo, member_kind, write_new
from ..io.zstd import CorruptStream, FrameReader
from ..package.assembly import Piece, WeightFile
from ..store import WeightStore
from . import digests
from .artifact import sha256_digest
from .client import CHUNK, RegistryClient
from .fetch import (
    PullReport,
    blob_bytes,
    download,
    fetch_and_assemble,
    output_folder,
    staged_output,
)
from .reference import Reference

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
DISK_RESERVE = 64 << 20  # bytes a tar layer's unpacking leaves free on the disk
OCI_ARCHIVES = {"application/vnd.oci.image.layer.v1.tar+gzip",
                "application/vnd.oci.image.layer.v1.tar+zstd"}
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
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


def _bad(why: str, reference: str, **ctx: Any) -> RegistryError:
    return RegistryError(f"cannot pull this artifact: {why}", reference=reference, **ctx)


def _descriptor(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("mediaType"), str)
            and isinstance(d.get("digest"), str) and bool(_SHA256.fullmatch(d["digest"]))
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
        raise _bad(f"the manifest is not JSON ({exc})", reference) from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise _bad("not an OCI manifest (schemaVersion 2)", reference)
    if doc.get("mediaType", MANIFEST_TYPE) != MANIFEST_TYPE:
        raise _bad("not an OCI image manifest", reference, mediaType=doc.get("mediaType"))
    config = doc.get("config")
    if not _descriptor(config):
        raise _bad("the config descriptor is missing or malformed", reference)
    modelpack = (doc.get("artifactType") == MODELPACK_TYPE
                 or config["mediaType"] == MODELPACK_CONFIG)
    if modelpack and config["mediaType"] != MODELPACK_CONFIG:
        raise _bad("a ModelPack artifact's config is not a ModelPack config", reference,
                   mediaType=config["mediaType"])
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _bad("the manifest lists no layers", reference)
    planned = [_plan_layer(i, layer, modelpack, reference) for i, layer in enumerate(layers)]
    _check_paths(planned, reference)
    return ForeignPlan(modelpack, config, tuple(planned))


def _plan_layer(i: int, layer: Any, modelpack: bool, reference: str) -> ForeignLayer:
    if not _descriptor(layer):
        raise _bad("a layer descriptor is malformed", reference, layer=i)
    notes = layer.get("annotations") or {}
    if not isinstance(notes, dict):
        raise _bad("a layer's annotations are not an object", reference, layer=i)
    media = layer["mediaType"]
    kind = MODELPACK_LAYER.fullmatch(media)
    if modelpack and kind is None:
        raise _bad("a layer of a media type ModelPack does not define", reference, layer=i,
                   mediaType=media)
    path = notes.get(FILEPATH, notes.get(TITLE))
    if path is None:
        raise _bad(f"a layer names no file ({FILEPATH} or {TITLE})", reference, layer=i)
    unpack = ((kind is not None and kind.group(1) != "raw") or notes.get(ORAS_UNPACK) == "true"
              or (media in OCI_ARCHIVES and notes.get(ORAS_UNPACK) != "false"))
    if isinstance(path, str):
        path = _relative(path)
        if unpack:
            path = path.rstrip("/")  # a folder's name
    if not is_relative_inside(path):
        raise _bad("unsafe file path (empty, absolute, or leaving the folder)", reference,
                   layer=i, filepath=repr(path))
    if not unpack:
        if layer["size"] == 0 and layer["digest"] != EMPTY:
            raise _bad("an empty layer names the digest of other bytes", reference, layer=i,
                       digest=layer["digest"])
        return ForeignLayer(i, path, layer)
    archive = "gzip" if media.endswith("+gzip") else "zstd" if media.endswith("+zstd") else "tar"
    return ForeignLayer(i, path, layer, archive)


def _relative(path: str) -> str:
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
                raise _bad("two layers for one file path", reference, filepath=x.path,
                           layer=x.index)
            files[x.path] = x.index
    for name, index in files.items():
        parts = name.split("/")
        for n in range(1, len(parts)):
            if "/".join(parts[:n]) in files:
                raise _bad("a file path runs through another file", reference,
                           filepath=name, layer=index)


def check_diff_ids(plan: ForeignPlan, config: bytes, reference: str) -> ForeignPlan:
    """A ModelPack config's ``modelfs.diffIds`` must name one digest per layer: the
    layer's own digest for a raw or uncompressed tar layer, the sha256 of the tar inside
    for a compressed one (checked as it is unpacked: the plan returned carries it)."""
    try:
        doc = _parse_json(config)
        diff_ids = doc["modelfs"]["diffIds"]
    except (ValueError, KeyError, TypeError):
        raise _bad("the ModelPack config has no modelfs.diffIds", reference) from None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(plan.layers):
        raise _bad("the config's modelfs.diffIds do not match the layers", reference,
                   diffIds=len(diff_ids) if isinstance(diff_ids, list) else None,
                   layers=len(plan.layers))
    out = []
    for x, diff_id in zip(plan.layers, diff_ids, strict=True):
        if not isinstance(diff_id, str) or not _SHA256.fullmatch(diff_id):
            raise _bad("a diffId is not a sha256 digest", reference, layer=x.index,
                       diffId=repr(diff_id)[:80])
        if x.archive in (None, "tar"):
            if diff_id != x.descriptor["digest"]:
                raise _bad("a layer's diffId is not its digest", reference, layer=x.index,
                           digest=x.descriptor["digest"], diffId=diff_id)
            out.append(x)
        else:
            out.append(replace(x, diff_id=diff_id))
    return replace(plan, layers=tuple(out))


# -- the executor -------------------------------------------------------------------------


def pull_foreign(client: RegistryClient, ref: Reference, manifest: bytes,
                 output: str | os.PathLike[str] | None, *, store: WeightStore, jobs: int,
                 force: bool, progress: bool | None) -> PullReport:
    """Pull a foreign artifact into ``output``; see the module docstring. Its report's
    payloads are the raw layers."""
    plan = plan_foreign(manifest, str(ref))
    out = output_folder(ref, output, force)
    report = PullReport(str(ref), sha256_digest(manifest), str(out))
    with staged_output(out, store, force) as stage:
        if plan.modelpack:
            config = blob_bytes(client, ref, plan.config, stage / ".config")
            (stage / ".config").unlink()
            plan = check_diff_ids(plan, config, str(ref))
        payloads = plan.payloads()
        wanted = {k: d["size"] for k, d in payloads.items()}
        report.payloads, report.payload_bytes = len(wanted), sum(wanted.values())
        with store.leased():
            fetch_and_assemble(client, ref, store, payloads, wanted, report, jobs, progress,
                               stage, plan.files())
            if plan.archives():
                downloads = make_temp_dir(out.parent, f".{out.name}.")
                try:
                    for x in plan.archives():
                        blob = downloads / f"layer-{x.index}"
                        received, _ = download(client, ref, x.descriptor, blob)
                        report.file_bytes += received
                        unpack_layer(blob, x, stage, str(ref))
                        blob.unlink()
                finally:
                    discard_temp_dir(downloads)
            # a later push of these files to another repository mounts the blobs
            digests.remember(store, host=ref.host, repository=ref.repository,
                             digests=[x.descriptor["digest"] for x in plan.layers])
            publish_dir(stage, out, replace=force, over_empty=True)
    report.received_bytes = client.received_bytes
    return report


class _Sha256Reader:
    """A read-only stream that hashes what passes through it (a tar's diffId)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.hash.update(data)
        return data

    def drain(self) -> str:
        """Read to the end (the tar's trailing blocks count too); the digest."""
        while self.read(CHUNK):
            pass
        return "sha256:" + self.hash.hexdigest()


def unpack_layer(blob: Path, layer: ForeignLayer, into: Path, reference: str) -> None:
    """Unpack the tar layer downloaded to ``blob`` into ``into``: regular files and folders
    only (links, devices, fifos refused), each path relative and inside (``./`` prefixes
    allowed), each file created new (a path another layer or member wrote is refused), the
    uncompressed tar checked against the layer's diffId."""
    import zstandard

    def bad(why: str, **ctx: Any) -> RegistryError:
        return _bad(f"a tar layer {why}", reference, layer=layer.index, filepath=layer.path,
                    **ctx)

    # a compressed layer can declare far more bytes than it carries (a few kilobytes of
    # gzip unpack to terabytes): a member is refused by the size its header declares,
    # before a byte of it is written, once the layer's members would not fit on the disk
    room = shutil.disk_usage(into).free - DISK_RESERVE
    try:
        with open(blob, "rb") as raw, _decompressed(raw, layer.archive) as stream:
            reader = _Sha256Reader(stream)
            with tarfile.open(fileobj=reader, mode="r|", encoding="utf-8", errors="strict",
                              tarinfo=BoundedTarInfo) as tf:
                for member in tf:
                    if member.isfile():
                        room -= member.size
                        if room < 0:
                            raise bad("would unpack more bytes than the disk has free",
                                      member=member.name, size=member.size)
                    _unpack_member(tf, member, into, bad)
                found = reader.drain()
    except (tarfile.TarError, zstandard.ZstdError, CorruptStream, gzip.BadGzipFile,
            zlib.error, EOFError, UnicodeError) as exc:
        raise bad(f"does not unpack ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:
            raise
        if isinstance(exc, (FileExistsError, NotADirectoryError, IsADirectoryError)):
            raise bad("writes a path twice, or a file where a folder is",
                      path=exc.filename) from None
        raise
    if layer.diff_id is not None and found != layer.diff_id:
        raise bad("holds another tar than its diffId names", diffId=layer.diff_id,
                  found=found)


@contextlib.contextmanager
def _decompressed(raw: BinaryIO, archive: str | None) -> Iterator[BinaryIO]:
    if archive == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield stream  # type: ignore[misc]
    elif archive == "zstd":  # whole frames only: a layer cut short is refused
        with io.BufferedReader(FrameReader(raw), 1 << 20) as s:
            yield s  # type: ignore[misc]
    else:
        yield raw


def _unpack_member(tf: tarfile.TarFile, member: tarfile.TarInfo, into: Path, bad: Any) -> None:
    name = _relative(member.name)
    if member.isdir():
        name = name.rstrip("/")
    elif member.type not in REGULAR:
        raise bad("holds something other than regular files and folders", member=member.name,
                  type=member_kind(member))
    if member.isdir() and name in ("", "."):
        return  # the archive's own root
    if not is_relative_inside(name):
        raise bad("holds an unsafe path (empty, absolute, or leaving the folder)",
                  member=repr(member.name))
    target = into / name
    folders = [into.joinpath(*name.split("/")[:n]) for n in range(1, name.count("/") + 1)]
    if member.isdir():
        folders.append(target)
    elif os.path.lexists(target):
        raise bad("writes a path twice, or a file where a folder is", member=member.name)
    for folder in folders:  # only files and folders are ever written here: no links
        if os.path.lexists(folder) and not folder.is_dir():
            raise bad("writes a path twice, or a file where a folder is", member=member.name)
        folder.mkdir(exist_ok=True)
    if member.isdir():
        return
    source = tf.extractfile(member)
    assert source is not None  # a regular file

    def chunks() -> Iterator[bytes]:
        remaining = member.size
        while remaining:
            data = source.read(min(CHUNK, remaining))
            if not data:
                raise bad("ends inside a member", member=member.name)
            remaining -= len(data)
            yield data

    write_new(target, chunks())
