"""Resolutions kept for later processes: a resolved model is a pure function of its
package's files and the options it was resolved with.

:func:`resolution_key` digests what a resolution of a package folder depends on:

* every entry below the package folder, by path and identity (device, inode, size, mtime,
  ctime: see :mod:`weightstore.io.identity`), so that any file added, removed, rewritten
  or replaced changes the key;
* the bytes (blake3) of every file resolution reads whole: the model files (``.onnx``)
  and the records (``.json``: the summary, device records). Identity
  cannot prove content (a write through a page already dirty in a shared mapping keeps
  every timestamp), and these files are small enough to hash on every resolution. The
  weight files are not hashed here: each load verifies every range it uses
  (:mod:`weightstore.load.pinned`), and a range that fails sends it back to the phases;
* the options (model, scenario, device, capabilities, named transformations, prepared
  options, store path);
* weightstore's version and this record's format, and the installed onnx and
  onnxruntime (their files' identities: an upgrade changes shape inference and packing)
  and the machine.

A resolution is kept (:func:`keep`) only when every file below the folder is settled
(older than the timestamps' granularity); a resolution through a selector callback,
transformation objects, a store locator object or a prepared cache object has no key
and is never kept. A hit (:func:`cached`) rebuilds the :class:`ResolvedModel` without
opening the model file, parsing it or importing onnx: the record is a pickle, read only
after its signature (:mod:`weightstore.caches.signed_records`) proved that this user's
own process wrote it. Its source opens the model file when something asks for its
metadata, and refuses a file that changed since. Its analyses (the payload manifest,
prepared requirements and bindings, the transformation report) are a pickle of their
own inside the record, unpickled when first asked for (:class:`RecordedResolution`): a
load whose session plan is recorded needs none of them, nor their types' modules.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import blake3

from ..caches.signed_records import SignedRecords
from ..errors import WeightstoreError
from ..io.identity import identity_of, tree_identities
from .model import ResolvedModel

if TYPE_CHECKING:
    from .model_source import ModelSource
    from .prepared import PreparedOptions

FORMAT_VERSION = 3
HASHED_SUFFIXES = (".onnx", ".json")  # the files whose bytes the key digests
RECORDS = SignedRecords("resolved")
ANALYSES = ("prepared_requirements", "bindings", "payload_manifest", "transformations")
ENVIRONMENT_MODULES = ("onnx", "onnxruntime")


def _environment() -> list[Any]:
    """What resolution depends on besides its inputs: weightstore, onnx, onnxruntime
    (each by its files' identity) and the machine."""
    from ..version import __version__

    out: list[Any] = [__version__, list(os.uname())]
    for name in ENVIRONMENT_MODULES:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None)
        try:
            out.append([name, list(identity_of(os.stat(origin)))] if origin else [name])
        except OSError:
            out.append([name])
    return out


def resolution_key(source: object, *, model: str | None, scenario: str | None,
                   device: str | None, capabilities: Mapping[str, Any] | None,
                   transformations: Sequence[object], prepared: PreparedOptions | None,
                   store: object) -> str | None:
    """The key of resolving the package folder ``source`` with these options, or None
    when the resolution is not one to keep (see the module's text)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    if not all(isinstance(t, str) for t in transformations):
        return None
    if store is not None and not isinstance(store, (str, os.PathLike)):
        return None
    if prepared is not None and (prepared.cache is not None or prepared.resident is not None):
        return None
    try:
        folder = Path(source).resolve(strict=True)
        if not folder.is_dir():
            return None
        tree, settled = tree_identities(folder)
        if not settled:
            return None
        contents = _contents(folder, tree)
    except (OSError, WeightstoreError):  # unreadable, or changed while it was hashed
        return None
    doc = {"format_version": FORMAT_VERSION, "environment": _environment(),
           "folder": str(folder), "tree": tree, "contents": contents, "model": model,
           "scenario": scenario, "device": device, "capabilities": capabilities, "transformations":
           list(transformations), "store": None if store is None else os.fspath(store),
           "prepared": None if prepared is None else [  # None: the defaults
               prepared.runtime, prepared.cpu_features, prepared.optimization_level,
               prepared.records, prepared.prefer]}
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # capabilities JSON cannot carry
        return None
    return blake3.blake3(text.encode()).hexdigest()


def _contents(folder: Path, tree: Sequence[tuple[str, int, Sequence[int]]]) -> list[Any]:
    """``[path, blake3 hex]`` of each regular file of ``tree`` that the key hashes (see
    the module's text), read through a descriptor that refuses links and FIFOs."""
    from ..io.digests import digest_fd
    from ..io.files import open_regular

    out: list[Any] = []
    for rel, kind, _ in tree:
        if not stat.S_ISREG(kind) or not rel.endswith(HASHED_SUFFIXES):
            continue
        fd = open_regular(folder / rel, nofollow=True)
        try:
            out.append([rel, digest_fd("blake3", fd, 0, os.fstat(fd).st_size)])
        finally:
            os.close(fd)
    return out


def keep(key: str, resolved: ResolvedModel) -> None:
    """Record ``resolved`` under ``key`` for later processes."""
    src = resolved.source
    fields: dict[str, Any] = {name: getattr(resolved, name) for name in (
        "model_bytes", "graph_digest", "selected_scenario", "device", "prepared_graph")}
    fields.update(capabilities=dict(resolved.capabilities),
                  constant_counts=dict(resolved.constant_counts),
                  placement=dict(resolved.placement))
    try:
        analyses = pickle.dumps({name: getattr(resolved, name) for name in ANALYSES},
                                protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return  # something in it is not plain data: not kept
    record = {"fields": fields, "analyses": analyses, "source": {
        "path": str(src.path), "name": src.name,
        "package": None if src.package is None else str(src.package),
        "store_keys": src.store_keys, "device_scenario": src.device_scenario,
        "device_capabilities": src.device_capabilities, "in_store": src.in_store,
        "stamp": src._stamp, "digest": src.digest}}
    try:
        body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return  # something in it is not plain data: not kept
    RECORDS.put(key, body)


def cached(key: str, locator: object) -> ResolvedModel | None:
    """The resolution recorded under ``key``, its source bound to the store ``locator``
    (None: no store), or None."""
    body = RECORDS.get(key)
    if body is None:
        return None
    try:
        record = pickle.loads(body)  # signed by this user's own key: see the module text
        fields, analyses, src = record["fields"], record["analyses"], record["source"]
    except Exception:  # a record of an older layout: resolved again
        return None
    from .model_source import ModelSource

    source = ModelSource.unopened(
        Path(src["path"]), src["name"], src["stamp"],
        package=None if src["package"] is None else Path(src["package"]),
        store_keys=src["store_keys"], device_scenario=src["device_scenario"],
        device_capabilities=src["device_capabilities"], store=locator,
        in_store=src["in_store"], digest=src.get("digest"))
    for name in ("capabilities", "constant_counts", "placement"):
        fields[name] = MappingProxyType(fields[name])
    return RecordedResolution.rebuilt(fields, analyses, source, key)


class RecordedResolution(ResolvedModel):
    """A :class:`ResolvedModel` rebuilt from its record, whose analyses
    (:data:`ANALYSES`) are unpickled when first asked for."""

    @classmethod
    def rebuilt(cls, fields: dict[str, Any], analyses: bytes, source: ModelSource,
                key: str) -> RecordedResolution:
        out = object.__new__(cls)  # the frozen fields are set once, here
        for name, value in {**fields, "source": source, "key": key,
                            "_analyses": analyses}.items():
            object.__setattr__(out, name, value)
        return out

    record_seconds: float = 0.0  # what taking it from its record cost this process

    def _record(self) -> dict[str, Any] | None:
        """Taken from its record: the phases' seconds are those of the process that
        resolved it; ``seconds``, this process's lookup (file identities, key, record)."""
        return {"key": self.key, "seconds": round(self.record_seconds, 6)}

    def __getattr__(self, name: str) -> Any:  # only for attributes not set yet
        analyses = self.__dict__.get("_analyses")
        if name not in ANALYSES or analyses is None:
            raise AttributeError(name)
        for field_name, value in pickle.loads(analyses).items():
            object.__setattr__(self, field_name, value)
        object.__setattr__(self, "_analyses", None)
        return self.__dict__[name]
