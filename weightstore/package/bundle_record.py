"""The bundle record (``devices/<device>/bundle.json``): which models a device runs and
which package weight files they need.

Its own module so that reading a record (checking a package, resolving or pulling a
device) needs neither the bundle writer nor onnx, and :mod:`.check` and :mod:`.bundles`
depend on it rather than on each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import PackageError
from ..io.files import parse_json

BUNDLE_NAME = "bundle.json"
FORMAT_VERSION = 1
DEVICES = "devices"


def read_bundle(package: Path, device: str) -> dict[str, Any]:
    """``device``'s bundle record in ``package``, its names checked to stay inside."""
    path = package / DEVICES / device / BUNDLE_NAME
    try:
        record = parse_json(path.read_text())
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
    return record
