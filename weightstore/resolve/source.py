"""Opening what resolution starts from: a package folder or a model file.

Only the model file is opened (through the wire-level catalogue: structure read, payloads
located, none read); external weight files are not touched here. A package folder
also yields the store key of each external weight from its ``summary.json`` (so the
loader can fetch the same bytes from the shared store by digest) and, per device, the
capabilities and scenario its bundle record names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ..catalogue.metadata import metadata_model
from ..catalogue.reader import Catalogue, read_catalogue
from ..errors import PackageError, ResolutionError
from ..fsio import parse_json


@dataclass
class ModelSource:
    """One model file opened for resolution; owned by the ResolvedModel made from it."""

    path: Path  # the model file
    name: str
    catalogue: Catalogue
    package: Path | None = None
    store_keys: dict[tuple[str, int], str] = field(default_factory=dict)  # (location, offset)
    device_scenario: str | None = None
    device_capabilities: dict[str, Any] = field(default_factory=dict)
    store: Any = None  # a locator.StoreLocator, when a store is known

    @property
    def folder(self) -> Path:
        return self.path.parent

    def metadata(self) -> onnx.ModelProto:
        """Structure and small values; large payloads omitted, external files unopened."""
        return metadata_model(self.catalogue)

    def close(self) -> None:
        self.catalogue.close()


def _summary(folder: Path) -> dict[str, Any]:
    from ..package.summary import SUMMARY_NAME  # loads the recipe machinery: only for packages

    try:
        summary = parse_json((folder / SUMMARY_NAME).read_text())
        summary["models"][0]["file"]
        return summary
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise PackageError("not a package folder (no readable summary.json)",
                           folder=str(folder)) from None


def open_source(source: str | os.PathLike[str], *, model: str | None = None,
                device: str | None = None) -> ModelSource:
    """The model ``source`` names: a model file, or one model of a package folder
    (``model`` by name, needed when the package holds several)."""
    path = Path(source)
    if path.is_dir():
        summary = _summary(path)
        models = {m["name"]: m for m in summary["models"]}
        if model is None:
            if len(models) != 1:
                raise ResolutionError("the package holds several models: name one",
                                      package=str(path), models=", ".join(sorted(models)))
            model = next(iter(models))
        if model not in models:
            raise ResolutionError("no such model in the package", model=model,
                                  package=str(path))
        entry = models[model]
        keys = {(w["location"], int(w["offset"])): w["id"]
                for w in entry.get("external_weights", ())}
        out = ModelSource(path / entry["file"], model, read_catalogue(path / entry["file"]),
                          package=path, store_keys=keys)
        if device is not None:
            _apply_device(out, path, device)
        return out
    if device is not None:
        raise ResolutionError("a device is chosen in a package folder, not a model file",
                              device=device, model=str(path))
    if not path.is_file():
        raise ResolutionError("no such model file or package folder", source=str(path))
    return ModelSource(path, model or path.stem, read_catalogue(path))


def _apply_device(out: ModelSource, package: Path, device: str) -> None:
    from ..package.bundle_record import read_bundle

    try:
        record = read_bundle(package, device)
    except PackageError:
        out.close()
        raise
    out.device_capabilities = dict(record.get("capabilities") or {})
    for m in record["models"]:
        if m.get("name") == out.name:
            out.device_scenario = m.get("scenario")
