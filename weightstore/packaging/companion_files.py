"""A package's companion files as its readers see them: which file of the folder each one
is, for the package or for one device, and its bytes read back checked.

``summary.json`` (format 5) lists the package's companions under ``companions`` and each
device's complete set under ``devices[i].companions``; a device's own version of a file
lives at ``devices/<device>/<path>``, the others are the package root's files. Release
(its provenance subjects), ``diff`` and ``report`` all ask these questions, so they are
answered here once, from the summary alone (:func:`companion_files`) and, for the bytes,
with every byte hashed against the summary's digest (:func:`read_companion`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..io.digests import make_key, new_hasher
from ..io.files import open_regular

CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedCompanion:
    """One companion as a runtime folder holds it: ``path`` in that folder, ``device``
    (None: the package's own set), ``file`` the package file holding its bytes."""

    path: str
    device: str | None
    file: str
    size: int
    digest: str  # "<algo>:<hex>"
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "device": self.device, "file": self.file,
                "size": self.size, "digest": self.digest, "kind": self.kind}


def companion_files(summary: Mapping[str, Any], *,
                    device_sets: bool = False) -> list[PackagedCompanion]:
    """The package's companions, then each device's own files (those at
    ``devices/<device>/<path>``), in the summary's order. ``device_sets``: each device's
    whole set instead of its own files only (what a runtime folder for it holds)."""
    out = [PackagedCompanion(c["path"], None, c["path"], c["size"], c["digest"], c["kind"])
           for c in summary.get("companions", [])]
    listed = {c["path"] for c in summary.get("contents", [])}
    for d in summary.get("devices", []):
        for c in d.get("companions", summary.get("companions", [])):
            own = f"devices/{d['name']}/{c['path']}"
            if own in listed or device_sets:
                out.append(PackagedCompanion(c["path"], d["name"], own if own in listed
                                         else c["path"], c["size"], c["digest"], c["kind"]))
    return out


@dataclass(frozen=True)
class CompanionBytes:
    head: bytes  # the first bytes asked for (all of them when ``whole``)
    whole: bool


def read_companion(folder: Path, companion: PackagedCompanion, limit: int) -> CompanionBytes:
    """The first ``limit`` bytes of a companion in the package ``folder``, read once
    with every byte hashed: a file whose size or digest is not the summary's is an
    :class:`IntegrityError` naming it, so what a reader shows is the package's."""
    algo = companion.digest.partition(":")[0]
    hasher = new_hasher(algo, threads=False)
    head = bytearray()
    size = 0
    path = folder / companion.file
    try:
        fd = open_regular(path, nofollow=True)
    except OSError as exc:
        raise IntegrityError(f"cannot read a companion file: {exc.strerror or exc}",
                             file=companion.file, folder=str(folder)) from None
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
            if len(head) < limit:
                head += chunk[:limit - len(head)]
    actual = make_key(algo, hasher.hexdigest())
    if size != companion.size or actual != companion.digest:
        raise IntegrityError("package file differs from its summary (a companion file)",
                             file=companion.file, folder=str(folder),
                             expected=companion.digest, actual=actual)
    return CompanionBytes(bytes(head), size <= limit)


def as_text(data: bytes, whole: bool) -> str | None:
    """``data`` as text when it is UTF-8 without NUL (a cut at the end of a part may split
    one character: that character is left out), else None (bytes, not text)."""
    if b"\x00" in data:
        return None
    for cut in (0,) if whole else range(4):
        try:
            return data[:len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None
