"""Artifacts in the shapes other code reads and writes: weightstore's format 1 (the assembly
record layer pushes wrote before format 2)."""

from __future__ import annotations

import json
from pathlib import Path

from weightstore.registry.artifact import (
    ARTIFACT_TYPE,
    ASSEMBLY_TYPE,
    CONFIG_TYPE,
    FILE_TYPE,
    FILEPATH,
    MANIFEST_TYPE,
    PAYLOAD,
    WEIGHT_TYPE,
    assembly_record,
    canonical,
    list_files,
    plan_package,
    sha256_digest,
)
from weightstore.registry.client import RegistryClient
from weightstore.registry.reference import parse_reference


def upload(host: str, ref, data: bytes) -> dict:
    """Put ``data`` in ``ref``'s repository; its digest and size."""
    client = RegistryClient(host, push=True)
    digest = sha256_digest(data)
    if not client.has_blob(ref, digest):
        location = client.start_upload(ref, digest)
        client.put_monolithic(ref, location, digest, len(data), lambda s, e: [data[s:e]])
    return {"digest": digest, "size": len(data)}


def push_format1(host: str, repository: str, tag: str, package: Path,
                 manifest: dict) -> tuple[str, dict]:
    """Push ``package``, already pushed as ``manifest`` (format 2) into ``repository``,
    to ``tag`` in the shape pushes wrote before format 2: payload layers with a file path
    only for per-weight files and no title, an ``…assembly.v1+json`` layer, every other
    file a ``weight.config`` layer, no format annotation. Returns the reference and the
    manifest."""
    ref = parse_reference(f"{host}/{repository}:{tag}")
    summary = json.loads((package / "summary.json").read_bytes())
    plan = plan_package(package, summary, list_files(package))
    notes = [layer.get("annotations") or {} for layer in manifest["layers"]]
    sha = {n[PAYLOAD]: layer["digest"] for n, layer in zip(notes, manifest["layers"],
                                                              strict=True) if PAYLOAD in n}
    separate = {f.pieces[0].key: f.name for f in plan.weight_files if f.is_separate}
    layers = []
    for key, size in plan.payload_sizes().items():
        annotations = {PAYLOAD: key}
        if key in separate:
            annotations[FILEPATH] = separate[key]
        layers.append({"mediaType": WEIGHT_TYPE, "digest": sha[key], "size": size,
                       "annotations": annotations})
    layers.append({"mediaType": ASSEMBLY_TYPE,
                   **upload(host, ref, assembly_record(plan, sha))})
    layers.extend({"mediaType": FILE_TYPE, "digest": layer["digest"], "size": layer["size"],
                   "annotations": {FILEPATH: n[FILEPATH]}}
                  for n, layer in zip(notes, manifest["layers"], strict=True)
                  if PAYLOAD not in n)
    config = canonical({
        "descriptor": {"name": plan.package, "version": plan.version,
                       "createdAt": "1970-01-01T00:00:00Z"},
        "config": {"format": "onnx"},
        "modelfs": {"type": "layers", "diffIds": [layer["digest"] for layer in layers]},
    })
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
           "config": {"mediaType": CONFIG_TYPE, **upload(host, ref, config)},
           "layers": layers,
           "annotations": {"org.opencontainers.image.version": plan.version,
                           "org.weightstore.layout": plan.layout,
                           "org.weightstore.fingerprint": plan.fingerprint}}
    RegistryClient(host, push=True).put_manifest(ref, tag, canonical(doc))
    return str(ref), doc
