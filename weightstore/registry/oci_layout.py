"""An OCI image layout (``skopeo copy … oci:DIR``, ``oras copy --to-oci-layout``) read
as a generic client lays an artifact out.

The layout is ``oci-layout`` (``{"imageLayoutVersion": "1.0.0"}``), ``index.json`` (the
manifests it holds) and every blob at ``blobs/sha256/<hex>``. :func:`lay_out` takes the
one manifest the index lists, checks it and its layers with the planner of every foreign
pull (:func:`.foreign_plan.plan_foreign`: a path for every layer, none leaving the folder, no
two at one path), and writes each layer's file at its path
(``org.cncf.model.filepath``, else ``org.opencontainers.image.title``): what
modelpack-client or oras-py would have written from the registry. Every blob read (the
manifest and each layer) is a regular file of the layout whose size and sha256 are the
ones its descriptor names, checked before it is used. A layout holding a container image,
an image index or a Helm chart is one line saying so (:mod:`.kinds`).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, PackageError, RegistryError
from ..io.digests import digest_file
from ..io.files import parse_json, read_regular
from .reference import DIGEST

LAYOUT_FILE = "oci-layout"
INDEX_FILE = "index.json"
REF_NAME = "org.opencontainers.image.ref.name"
MAX_DOCUMENT = 64 << 20  # the largest index or manifest read, as from a registry


def is_oci_layout(folder: Path) -> bool:
    """``folder`` is an OCI image layout (and not already a package)."""
    return (folder / LAYOUT_FILE).is_file() and (folder / INDEX_FILE).is_file() and not (
        folder / "summary.json").exists()


def _document(path: Path, what: str, folder: Path) -> Any:
    try:
        return parse_json(read_regular(path, limit=MAX_DOCUMENT))
    except (OSError, ValueError) as exc:
        raise PackageError(f"not an OCI image layout: {what} does not read as JSON "
                           f"({type(exc).__name__})", folder=str(folder)) from None


def _blob(folder: Path, descriptor: Any) -> Path:
    """The blob a descriptor names, checked: a regular file whose size and sha256 are the
    descriptor's."""
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    size = descriptor.get("size") if isinstance(descriptor, dict) else None
    if not (isinstance(digest, str) and DIGEST.fullmatch(digest)) or type(size) is not int \
            or size < 0:
        raise PackageError("not an OCI image layout: a descriptor without a sha256 digest "
                           "and a size", folder=str(folder), digest=str(digest)[:80])
    path = folder / "blobs" / "sha256" / digest.removeprefix("sha256:")
    try:
        st = os.lstat(path)
    except OSError:
        raise PackageError("a blob of the OCI layout is missing; nothing was written",
                           folder=str(folder), digest=digest) from None
    if not stat.S_ISREG(st.st_mode):
        raise PackageError("a blob of the OCI layout is not a regular file; nothing was "
                           "written", file=str(path))
    if st.st_size != size or digest_file("sha256", path) != path.name:
        raise IntegrityError("a blob of the OCI layout does not match its digest; nothing "
                             "was written", file=str(path), size=st.st_size,
                             expected_size=size)
    return path


def _manifest(folder: Path) -> tuple[bytes, str]:
    """The one manifest the layout's index lists (its bytes, checked, and media type)."""
    version = _document(folder / LAYOUT_FILE, LAYOUT_FILE, folder)
    if not isinstance(version, dict) or not isinstance(version.get("imageLayoutVersion"),
                                                       str):
        raise PackageError("not an OCI image layout: oci-layout has no imageLayoutVersion",
                           folder=str(folder))
    index = _document(folder / INDEX_FILE, INDEX_FILE, folder)
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PackageError("the OCI layout's index.json lists no manifest",
                           folder=str(folder))
    if len(entries) > 1:
        names = [str((e.get("annotations") or {}).get(REF_NAME, "?"))
                 for e in entries if isinstance(e, dict)]
        raise PackageError(f"the OCI layout holds {len(entries)} manifests: copy one "
                           "artifact into a layout of its own (skopeo copy … oci:DIR)",
                           folder=str(folder), tags=", ".join(names[:8]))
    (entry,) = entries
    media = entry.get("mediaType") if isinstance(entry, dict) else None
    path = _blob(folder, entry)
    if (entry.get("size") or 0) > MAX_DOCUMENT:
        raise PackageError("the OCI layout's manifest is too large", folder=str(folder),
                           size=entry.get("size"), limit=MAX_DOCUMENT)
    return path.read_bytes(), media if isinstance(media, str) else ""


def lay_out(folder: Path, into: Path) -> int:
    """Write the files of the artifact the layout ``folder`` holds into the empty folder
    ``into``, each at its layer's path (a hard link to the checked blob where the
    filesystem allows, else a copy); the count of files. See the module docstring."""
    from .foreign_plan import plan_foreign
    from .kinds import refuse_other_kinds

    data, media = _manifest(folder)
    try:
        refuse_other_kinds(data, media, f"the OCI layout {folder}")
        plan = plan_foreign(data, str(folder))
    except RegistryError as exc:
        message = exc.message.replace("cannot pull this artifact: ", "")
        context = {k: v for k, v in exc.context.items() if k != "reference"}
        raise PackageError(f"cannot assemble from this OCI layout: {message}",
                           folder=str(folder), **context) from None
    if not any(x.path == "summary.json" for x in plan.layers):
        raise PackageError("cannot assemble from this OCI layout: not a weightstore package: "
                           "no summary.json among its layers", folder=str(folder))
    if plan.archives():
        raise PackageError("cannot assemble from this OCI layout: it holds tar layers "
                           "(weightstore pull unpacks them)", folder=str(folder),
                           filepath=plan.archives()[0].path)
    for layer in plan.layers:
        blob = _blob(folder, layer.descriptor)
        target = into / layer.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(blob, target)  # the blob's own bytes, checked above; never written to
        except OSError:
            shutil.copyfile(blob, target)
    return len(plan.layers)
