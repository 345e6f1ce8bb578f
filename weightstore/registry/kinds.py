"""What a manifest is when it is no model package: a container image (OCI or Docker), an
image index or Docker manifest list, a Helm chart.

A registry holds all of these side by side, and a reference names any of them. A pull asks
for every manifest type (:data:`ACCEPT`), so that the registry answers with what the tag
holds rather than "not found" or "invalid", and :func:`refuse_other_kinds` turns what is
not a model package into one line saying what it is. An ORAS or ModelPack artifact (any
manifest whose layers name their files, whatever its config) is left to the pull.
"""

from __future__ import annotations

from typing import Any

from ..errors import RegistryError
from ..io.files import parse_json

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_SCHEMA1 = ("application/vnd.docker.distribution.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v1+prettyjws")
# the Accept header of a manifest GET: ours first, then what else a tag may hold
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
# the layer annotations that name a file (ModelPack's and ORAS's), as in .foreign_plan;
# not imported from there, so that the client (which takes ACCEPT) stays light
FILE_NOTES = ("org.cncf.model.filepath", "org.opencontainers.image.title")
TITLE, VERSION = FILE_NOTES[1], "org.opencontainers.image.version"


def other_kind(manifest: bytes, media_type: str = "") -> str | None:
    """What the manifest is ("a container image", "an OCI image index of 2 manifests
    (linux/amd64, linux/arm64)", "a Helm chart (web 1.2.3)", ...) when it is no model
    package; None when it may be one (its parser judges it then). ``media_type``: the
    registry's Content-Type, for a document that does not name its own."""
    try:
        doc = parse_json(manifest)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    media = doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else media_type
    media = media.partition(";")[0].strip()
    if media in DOCKER_SCHEMA1 or doc.get("schemaVersion") == 1:
        return "a Docker image (schema 1)"
    if media in (OCI_INDEX, DOCKER_LIST) or (not media and "manifests" in doc):
        name = "a Docker manifest list" if media == DOCKER_LIST else "an OCI image index"
        return name + _listed(doc.get("manifests"))
    config = doc.get("config")
    config_type = config.get("mediaType") if isinstance(config, dict) else None
    if config_type == HELM_CONFIG:
        notes = doc.get("annotations") if isinstance(doc.get("annotations"), dict) else {}
        named = " ".join(str(notes[k]) for k in (TITLE, VERSION) if k in notes)
        return "a Helm chart" + (f" ({named})" if named else "")
    layers = doc.get("layers") if isinstance(doc.get("layers"), list) else []
    if any(isinstance(x, dict) and isinstance(x.get("annotations"), dict)
           and any(k in x["annotations"] for k in FILE_NOTES) for x in layers):
        return None  # files by name: an ORAS or ModelPack artifact, whatever its config
    if config_type == DOCKER_CONFIG or media == DOCKER_MANIFEST:
        return "a Docker container image"
    if config_type == IMAGE_CONFIG:
        return "a container image"
    return None


def _listed(entries: Any) -> str:
    """`` of N manifests (os/arch, ...)`` for an index's entries."""
    if not isinstance(entries, list):
        return ""
    platforms = []
    for entry in entries:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if isinstance(p, dict) and p.get("os") and p.get("architecture"):
            platforms.append("/".join(str(p[k]) for k in ("os", "architecture", "variant")
                                      if p.get(k)))
    count = f" of {len(entries)} manifest{'s' if len(entries) != 1 else ''}"
    return count + (f" ({', '.join(platforms[:8])}{', ...' if len(platforms) > 8 else ''})"
                    if platforms else "")


def refuse_other_kinds(manifest: bytes, media_type: str, where: str) -> None:
    """One line saying what ``where`` (a reference, an OCI layout) holds when it is no
    model package; nothing when it may be one."""
    kind = other_kind(manifest, media_type)
    if kind is not None:
        raise RegistryError(f"{where} is {kind}, not a model package")
