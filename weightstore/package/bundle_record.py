"""The bundle record (``devices/<device>/bundle.json``): which models a device runs and
which package weight files they need.

Its own module so that reading a record (checking a package, resolving or pulling a
device) needs neither the bundle writer nor onnx, and :mod:`.check` and :mod:`.bundles`
depend on it rather than on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import PackageError
from ..io.files import parse_json, read_regular

BUNDLE_NAME = "bundle.json"
FORMAT_VERSION = 1
DEVICES = "devices"


def read_bundle(package: Path, device: str,
                summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``device``'s bundle record in ``package``, its names checked to stay inside.

    With the package's ``summary``, the two must agree: the summary lists the device
    (when it lists devices), and each model of the record runs the device's scenario or,
    lacking it, its default graph, as the builder chose them.
    """
    path = package / DEVICES / device / BUNDLE_NAME
    try:
        record = parse_json(read_regular(path))
    except FileNotFoundError:
        known = sorted(p.name for p in (package / DEVICES).glob("*")) if (
            package / DEVICES).is_dir() else []
        raise PackageError("no such device in the package", device=device,
                           package=str(package), known=", ".join(known) or "none") from None
    except (OSError, ValueError) as exc:
        raise PackageError(f"unreadable bundle record: {exc}", file=str(path)) from None
    if not isinstance(record, dict) or record.get("format_version") != FORMAT_VERSION:
        raise PackageError("unsupported bundle format version", file=str(path),
                           version=record.get("format_version") if isinstance(record, dict)
                           else None)
    try:
        models = [(str(m["file"]), m.get("scenario")) for m in record["models"]]
        files = [(str(f["name"]), int(f["size"])) for f in record["files"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PackageError("malformed bundle record", file=str(path)) from None
    for name, _ in models:  # names stay inside their folders, whoever wrote the record
        resolve_location(path.parent, name, where=str(path))
    for name, _ in files:
        resolve_location(package, name, where=str(path))
    if summary is not None:
        check_agreement(summary, device, models, str(path))
    return record


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
