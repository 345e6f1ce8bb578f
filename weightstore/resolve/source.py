"""Opening what resolution starts from: a package folder or a model file.

Only the model file is opened, and parsed once: a model whose inline payloads are all
small (a packaged one) is its own metadata model and is parsed whole by protobuf; only
when a phase needs the byte range of an omitted inline payload, or the file holds large
ones, is it read through the wire-level catalogue (structure read, payloads located, none
read). External weight files are not touched here. A package folder
also yields the store key of each external weight from its ``summary.json`` (so the
loader can fetch the same bytes from the shared store by digest) and, per device, the
capabilities and scenario its bundle record names. A store reference
(:mod:`weightstore.resolve.reference`) yields the same from store objects, with no folder:
its weights come from the store by digest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import PackageError, ResolutionError
from .model_source import ModelSource
from .reference import StoreReference, UnknownReference


def _summary(folder: Path) -> dict[str, Any]:
    from ..package.summary import read_summary_file  # only for packages

    return read_summary_file(folder)[1]


def open_source(source: str | os.PathLike[str] | StoreReference, *,
                model: str | None = None, device: str | None = None,
                store: str | os.PathLike[str] | None = None) -> ModelSource:
    """The model ``source`` names: a model file, one model of a package folder or of a
    device folder (``model`` by name, needed when the folder holds several), or one model
    of a build in the store at ``store`` (a :class:`StoreReference`, or its text when no
    such path exists)."""
    if isinstance(source, StoreReference):
        return _open_reference(source, model, device, store)
    path = Path(source)
    if path.exists() or not isinstance(source, str):
        return _open_path(path, model, device)
    try:
        ref = StoreReference.parse(source)
    except ResolutionError:
        raise ResolutionError("no such model file, package folder or store reference",
                              source=str(path)) from None
    try:
        return _open_reference(ref, model, device, store)
    except UnknownReference as exc:  # a mistyped path, as likely as an unknown build
        raise UnknownReference(f"no such model file or package folder, and {exc.message}",
                               **exc.context) from None


def _open_path(path: Path, model: str | None, device: str | None) -> ModelSource:
    if path.is_dir():
        return _open_folder(path, model, device)
    if device is not None:
        raise ResolutionError("a device is chosen in a package folder, not a model file",
                              device=device, model=str(path))
    if not path.is_file():
        raise ResolutionError("no such model file or package folder", source=str(path))
    entry = record_beside(path)
    digest = None
    if entry is not None and (path.parent / "summary.json").exists():
        digest = listed_digest(_summary(path.parent), path.name)
    elif entry is not None:  # a device record's entry
        digest = entry.get("digest")
    return ModelSource.open(path, model or (entry or {}).get("name") or path.stem,
                            store_keys=None if entry is None else store_keys_of(entry),
                            digest=digest)


def is_device_folder(folder: Path) -> bool:
    """A device's self-contained folder (``bundle``, ``pull --device``): its record, no
    package summary."""
    from ..package.bundle_record import BUNDLE_NAME
    from ..package.summary import SUMMARY_NAME

    return not (folder / SUMMARY_NAME).exists() and (folder / BUNDLE_NAME).exists()


def device_folder_record(folder: Path, device: str | None) -> dict[str, Any]:
    """The record of the device folder ``folder``; ``device``, when given, must be the
    one it was made for."""
    from ..package.bundle_record import BUNDLE_NAME, read_record

    record = read_record(folder / BUNDLE_NAME)
    if device is not None and device != record.get("device"):
        raise ResolutionError("this device folder was made for another device",
                              device=device, folder=str(folder),
                              made_for=record.get("device") or "a scenario")
    return record


def _open_folder(folder: Path, model: str | None, device: str | None) -> ModelSource:
    """One model of a package folder, or of a device folder, by the name its
    ``summary.json`` or ``bundle.json`` gives it (the only one when None), its payloads'
    keys from that record. A device folder's models are the device's graphs already, so
    the folder is its own device: ``device``, when given, must be the one it was made
    for; in a package it selects the device's scenario and capabilities."""
    if is_device_folder(folder):
        record, summary, holder = device_folder_record(folder, device), None, "device folder"
    else:
        summary = _summary(folder)
        record, holder = summary, "package"
    where = {"package" if summary is not None else "folder": str(folder)}
    entry = _model_entry(record, model, holder, **where)
    model_path = folder / entry["file"]
    if model_path.resolve() != folder.resolve() / entry["file"]:
        raise PackageError(f"the {holder}'s model file is reached through a symbolic "
                           f"link: a {holder} holds only regular files and folders",
                           file=str(entry["file"]), **where)
    out = ModelSource.open(model_path, entry["name"],
                           package=folder if summary is not None else None,
                           store_keys=store_keys_of(entry),
                           digest=entry.get("digest") if summary is None else listed_digest(
                               summary, entry["file"]))
    if device is not None and summary is not None:
        _apply_device(out, folder, device, summary)
    return out


def _open_reference(ref: StoreReference, model: str | None, device: str | None,
                    store: str | os.PathLike[str] | None) -> ModelSource:
    from ..store.location import resolve_store_path
    from .locator import WeightStoreLocator
    from .reference import find_build, open_model_object

    if store is not None and not isinstance(store, (str, os.PathLike)):
        raise ResolutionError("a store reference is resolved in a store folder, not through "
                              "a locator", reference=str(ref))
    root = resolve_store_path(None if store is None else os.fspath(store), None)
    build = find_build(root, ref)
    entry = _model_entry(build.summary, model, "package", reference=str(ref))
    record = None if device is None else build.device_record(device)
    path, fd = open_model_object(build, str(entry["file"]))
    out = ModelSource.open(path, entry["name"], fd=fd, store_keys=store_keys_of(entry),
                           store=WeightStoreLocator(root), in_store=True)
    if record is not None:
        _apply_record(out, record)
    return out


def _model_entry(summary: dict[str, Any], model: str | None, holder: str,
                 **where: str) -> dict[str, Any]:
    """The entry of ``model`` (the only one when None) in a package summary or a device
    record (``holder`` says which, in messages); ``where`` names the package, the
    reference or the device folder."""
    models = {m["name"]: m for m in summary["models"]}
    if model is None:
        if len(models) != 1:
            raise ResolutionError(f"the {holder} holds several models: name one",
                                  **where, models=", ".join(sorted(models)))
        model = next(iter(models))
    if model not in models:
        raise ResolutionError(f"no such model in the {holder}", model=model, **where,
                              models=", ".join(sorted(models)))
    return models[model]


def record_beside(model_path: Path) -> dict[str, Any] | None:
    """The entry of the model file at ``model_path`` in the record beside it: the folder's
    ``summary.json`` when it lists the file as a model, else the folder's ``bundle.json``
    (a device folder, or a package's ``devices/<device>/``) when it lists it; None when
    neither does (a model of no package: only the digests its external data declares are
    checked). A record that is there but malformed is a :class:`PackageError` naming it."""
    from ..package.bundle_record import BUNDLE_NAME, read_record
    from ..package.summary import SUMMARY_NAME

    folder, name = model_path.parent, model_path.name
    if (folder / SUMMARY_NAME).exists():
        for m in _summary(folder)["models"]:
            if m["file"] == name:
                return m
    try:
        record = read_record(folder / BUNDLE_NAME)
    except FileNotFoundError:
        return None
    return next((m for m in record["models"] if m["file"] == name), None)


def listed_digest(summary: dict[str, Any], file: str) -> str | None:
    """The digest (``"algo:hex"``) a package summary's ``contents`` gives ``file``, which
    the model file's bytes must have: a package's inline tensors are handed to the runtime
    as they are, so they are verified like its weight files. None for a summary of a
    format without ``contents``."""
    for c in summary.get("contents") or ():
        if isinstance(c, dict) and c.get("path") == file and isinstance(c.get("digest"), str):
            return c["digest"]
    return None


def store_keys_of(entry: dict[str, Any]) -> dict[tuple[str, int], str]:
    """Each external weight's store key by (location, offset), from a model's entry in its
    package summary or bundle record: what a packaged model's payloads are verified
    against, their external data carrying no digest (see docs/reference/formats/package.md)."""
    return {(w["location"], int(w["offset"])): w["id"]
            for w in entry.get("external_weights", ())}


def record_key(store_keys: dict[tuple[str, int], str] | None, location: str, offset: int,
               checksum: str | None, **where: object) -> str | None:
    """The store key the model's record (``store_keys``, None when the model has none)
    gives the live external payload at (``location``, ``offset``); None when it gives
    none. A model with a record whose live range has no key there and declares no digest
    (``checksum``) in its external data either is refused, naming ``where``, the location
    and the offset: it would be read unverified."""
    key = (store_keys or {}).get((location, offset))
    if store_keys is not None and key is None and not checksum:
        raise ResolutionError("live weight has no digest in its package record", **where,
                              location=location, offset=offset)
    return key


def _apply_device(out: ModelSource, package: Path, device: str,
                  summary: dict[str, Any]) -> None:
    from ..package.bundle_record import read_bundle

    try:
        record = read_bundle(package, device, summary)
    except PackageError:
        out.close()
        raise
    _apply_record(out, record)


def _apply_record(out: ModelSource, record: dict[str, Any]) -> None:
    """The capabilities and this model's scenario from a device's bundle record."""
    out.device_capabilities = dict(record.get("capabilities") or {})
    for m in record["models"]:
        if m.get("name") == out.name:
            out.device_scenario = m.get("scenario")
