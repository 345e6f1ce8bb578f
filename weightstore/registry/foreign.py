"""Pulling foreign artifacts: any CNCF ModelPack artifact, and plain ORAS artifacts.

weightstore recognises its own artifacts by the manifest annotation
``org.weightstore.fingerprint``; every other manifest is *foreign* and pulled here, as a
folder of the files its layers hold::

    OUT/
      model.onnx          <- a raw layer, org.cncf.model.filepath "model.onnx"
      model.onnx.data     <- a raw layer (else org.opencontainers.image.title names it)
      weights/            <- a tar layer (.tar, .tar+gzip, .tar+zstd), unpacked here:
        w000.bin             its members carry their own paths, relative to OUT

:func:`~.foreign_plan.plan_foreign` is the pure planner (:mod:`.foreign_plan`): the
manifest in, what goes where out, every path checked before a byte is fetched. A ModelPack
artifact (its ``artifactType`` or config type) may hold only the layer types ModelPack
defines; a plain ORAS artifact (any other ``artifactType``) may hold any, each named by its
title; a layer is unpacked when it is a ModelPack tar type, when it carries ORAS's
``io.deis.oras.content.unpack: true``, or when it is an OCI ``tar+gzip``/``tar+zstd``
layer (oras-py's folders), and is otherwise a file.

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
import shutil
import tarfile
import zlib
from collections.abc import Iterator
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
from ..io.tar import REGULAR, BoundedTarInfo, member_kind, write_new
from ..io.zstd import CorruptStream, FrameReader
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
from .foreign_plan import (
    ForeignLayer,
    check_diff_ids,
    plan_foreign,
    refused,
    relative_path,
)
from .reference import Reference

DISK_RESERVE = 64 << 20  # bytes a tar layer's unpacking leaves free on the disk


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
        return refused(f"a tar layer {why}", reference, layer=layer.index, filepath=layer.path,
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
    name = relative_path(member.name)
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
