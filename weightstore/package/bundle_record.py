"""The bundle record (``devices/<device>/bundle.json``): which models a device runs, which
package weight files they need, and (format 2) the store key of each live external weight
of each model, which the models' external data does not carry (see
docs/reference/formats/device-bundles.md).

``weightstore bundle`` and ``pull --device``/``--scenario`` write the record into the
folder they make, beside its models: a model file opened on its own takes its payloads'
keys from the record beside it (:func:`weightstore.resolve.source.open_source`).

Its own module so that reading a record (checking a package, resolving or pulling a
device) needs neither the bundle writer nor onnx, and :mod:`.check` and :mod:`.bundles`
depend on it rather than on each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import IntegrityError, PackageError
from ..io.digests import split_key
from ..io.files import parse_json, read_regular

BUNDLE_NAME = "bundle.json"
FORMAT_VERSION = 2  # what this code writes for a device without companion files
COMPANIONS_SINCE = 3  # ``companions``: the device's companion files
READABLE = (1, 2, 3)  # 1: no external_weights (its models' external data carried the keys)
DEVICES = "devices"


def device_path(device: str, path: str) -> str:
    """Where a device's own file (a model, its record, a companion file of its own) is in
    the package."""
    return f"{DEVICES}/{device}/{path}"


def device_record(device: str | None, capabilities: Mapping[str, Any], rule: str | None,
                  models: list[dict[str, Any]], files: Mapping[str, int],
                  companions: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A bundle record: ``models`` as :func:`model_entry` makes them, ``files`` the weight
    files they need (name -> size), ``companions`` the device's companion files (summary
    entries; format 3, only when there are some)."""
    out = {"format_version": COMPANIONS_SINCE if companions else FORMAT_VERSION,
           "device": device, "capabilities": dict(capabilities), "scenario_rule": rule,
           "models": models, "files": [{"name": n, "size": files[n]} for n in sorted(files)]}
    if companions:
        out["companions"] = [dict(c) for c in companions]
    return out


def render_record(record: Mapping[str, Any]) -> bytes:
    """A bundle record's bytes, as every writer writes them."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def model_entry(name: str, file: str, scenario: str | None, model_bytes: int,
                live: list[Any], keys: Mapping[tuple[str, int], str],
                digest: str | None = None) -> dict[str, Any]:
    """A model's entry in a bundle record: ``live`` its live external payloads
    (:class:`weightstore.scenarios.resolve.LivePayload`), each with its store key from
    ``keys`` (by location and offset, as the package summary has them) or its own;
    ``digest`` (``"algo:hex"``), the model file's, which a load of the device folder
    checks its bytes against (inline tensors included)."""
    weights = []
    for p in live:
        key = keys.get((p.location, p.offset)) or p.checksum
        if key is None:
            raise PackageError("a live weight of a device model has no store key",
                               model=file, weight=p.name, location=p.location,
                               offset=p.offset)
        weights.append({"id": key, "name": p.name, "location": p.location,
                        "offset": p.offset, "size": p.length})
    out = {"name": name, "file": file, "scenario": scenario, "model_bytes": model_bytes,
           "live_weights": len(live), "live_bytes": sum(p.length for p in live),
           "external_weights": sorted(weights, key=lambda w: (w["location"], w["offset"]))}
    if digest is not None:
        out["digest"] = digest
    return out


def read_bundle(package: Path, device: str,
                summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``device``'s bundle record in ``package``, its names checked to stay inside.

    With the package's ``summary``, the two must agree: the summary lists the device
    (when it lists devices), and each model of the record runs the device's scenario or,
    lacking it, its default graph, as the builder chose them.
    """
    path = package / DEVICES / device / BUNDLE_NAME
    try:
        record = read_record(path, package)
    except FileNotFoundError:
        known = sorted(p.name for p in (package / DEVICES).glob("*")) if (
            package / DEVICES).is_dir() else []
        raise PackageError("no such device in the package", device=device,
                           package=str(package), known=", ".join(known) or "none") from None
    if summary is not None:
        models = [(str(m["file"]), m.get("scenario")) for m in record["models"]]
        check_agreement(summary, device, models, str(path))
    return record


def read_record(path: Path, files_root: Path | None = None) -> dict[str, Any]:
    """The bundle record at ``path``, checked: a known format, its models and files well
    formed and (format 2) each model's ``external_weights`` as the package summary lists
    them, every name inside its folder (the models' beside the record, the files' in
    ``files_root``: the package, or the record's own folder when None). A missing file
    raises :class:`FileNotFoundError`; anything else wrong, a :class:`PackageError`
    naming the file."""
    from .summary import check_companion_list, check_weight

    try:
        record = parse_json(read_regular(path))
    except FileNotFoundError:
        raise  # the caller says what a missing record means
    except (OSError, ValueError) as exc:
        raise PackageError(f"unreadable bundle record: {exc}", file=str(path)) from None
    version = record.get("format_version") if isinstance(record, dict) else None
    if type(version) is not int or version not in READABLE:
        raise PackageError("unsupported bundle format version", file=str(path),
                           version=version)
    try:
        models = [(str(m["file"]), m.get("scenario")) for m in record["models"]]
        files = [(str(f["name"]), int(f["size"])) for f in record["files"]]
        weights = [(i, j, w) for i, m in enumerate(record["models"])
                   for j, w in enumerate(m["external_weights"] if version > 1 else ())]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PackageError("malformed bundle record", file=str(path)) from None
    for i, j, w in weights:
        check_weight(w, str(path), f"models[{i}].external_weights[{j}]",
                     what="bundle record")
    for i, m in enumerate(record["models"]):
        if "digest" in m and not _is_key(m["digest"]):
            raise PackageError("malformed bundle record: a model's digest is no "
                               "'algo:hex' key", file=str(path), key=f"models[{i}].digest")
    if "companions" in record:
        check_companion_list(record["companions"], version >= COMPANIONS_SINCE, str(path),
                             "companions", what="bundle record")
    for name, _ in models:  # names stay inside their folders, whoever wrote the record
        resolve_location(path.parent, name, where=str(path))
    for name, _ in files:
        resolve_location(files_root or path.parent, name, where=str(path))
    return record


def _is_key(value: Any) -> bool:
    try:
        split_key(value)
    except (IntegrityError, AttributeError, TypeError):
        return False
    return True


def check_agreement(summary: Mapping[str, Any], device: str,
                    models: list[tuple[str, Any]], where: str) -> None:
    """A device's record (``models``: its models' files and scenarios) must agree with the
    package summary: the summary lists the device (when it lists devices), and each model
    runs the device's scenario or, lacking it, its default graph."""
    if not isinstance(summary.get("devices"), list):
        return
    scenarios = {d["name"]: d.get("scenario") for d in summary["devices"]}
    if device not in scenarios:
        raise PackageError("the package summary lists no such device", device=device,
                           file=where)
    for file, scenario in models:
        if scenario not in (scenarios[device], None):
            raise PackageError("the device's bundle record and the package summary name "
                               "different scenarios", device=device, model=file,
                               record=scenario, summary=scenarios[device], file=where)
