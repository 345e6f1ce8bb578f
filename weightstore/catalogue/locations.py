"""Resolving external-data locations without ever leaving the model's folder."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ExternalDataError, PathEscapeError


def resolve_location(base_dir: Path, location: str, *, where: str) -> Path:
    """Resolve an external-data location, refusing anything that leaves ``base_dir``."""
    if not location:
        raise ExternalDataError("external data has no location", where=where)
    if "\0" in location:  # no file has such a name: the OS would refuse it unnamed
        raise ExternalDataError("external data location holds a NUL byte", where=where,
                                location=location.replace("\0", "\\0"))
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise PathEscapeError("external data location is absolute", where=where,
                              location=location)
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise PathEscapeError("external data location has a '..' component, which is refused",
                              where=where, location=location)
    base = base_dir.resolve()
    target = (base / location).resolve()
    if base != target and base not in target.parents:
        raise PathEscapeError("external data location leaves the model's folder",
                              where=where, location=location)
    return target
