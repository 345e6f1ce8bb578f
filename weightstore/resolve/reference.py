"""Resolving a build by name from a shared store, with no package folder anywhere.

A store reference names one build the store holds::

    PACKAGE[/VERSION[/LAYOUT]][@ROOT_ID | @ALGO:HEX]

The name part matches the store's roots as ``weightstore store ls`` prints them; ``@ROOT_ID``
picks one root by its id, ``@sha256:…``/``@blake3:…`` the build whose ``summary.json``
has that digest. The reference must come down to exactly one build (one fingerprint):
several roots of the same fingerprint are one build.

The build's action record (:mod:`weightstore.caches.build_actions`, its MAC checked as a
warm build checks it) says which store objects are its ``summary.json`` and model files.
Both are read from the store and hashed against their keys; the model file is opened
from its own store file (a model file is always a separate object) and parsed from the
very descriptor that was hashed. No package folder is looked at: every external weight is
then located in the store by its digest, so resolution reads no payload byte and a load
reads exactly the live ones from the store.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import REPAIR_HINT, IntegrityError, ResolutionError, StoreError
from ..io.files import parse_json

if TYPE_CHECKING:
    from ..package.assembly import WeightFile

_NAME = re.compile(r"[^/@\s]+")
_PIN = re.compile(r"0|[1-9][0-9]*|[a-z0-9]+:[0-9a-f]{16,128}")  # a root id, or a digest


class UnknownReference(ResolutionError):
    """The store holds no build the reference names (or there is no store at all)."""


@dataclass(frozen=True)
class StoreReference:
    """``PACKAGE[/VERSION[/LAYOUT]][@ROOT_ID|@ALGO:HEX]``: one build in a store."""

    package: str
    version: str | None = None
    layout: str | None = None
    pin: str | None = None  # a root id or a summary digest

    @classmethod
    def parse(cls, text: str) -> StoreReference:
        """The reference ``text`` spells, or a ResolutionError saying why not."""
        name, at, pin = text.partition("@")
        parts = name.split("/")
        if (not 1 <= len(parts) <= 3 or not all(_NAME.fullmatch(p) for p in parts)
                or (at and not _PIN.fullmatch(pin))):
            raise ResolutionError("not a store reference (PACKAGE[/VERSION[/LAYOUT]]"
                                  "[@ROOT_ID|@ALGO:HEX])", reference=text)
        return cls(*parts, *([None] * (3 - len(parts))), pin=pin or None)  # type: ignore[arg-type]

    def __str__(self) -> str:
        name = "/".join(p for p in (self.package, self.version, self.layout) if p)
        return f"{name}@{self.pin}" if self.pin else name

    @property
    def selector(self) -> str:
        """The name part, as ``store pin``/``rm`` and :func:`roots.find` take it."""
        return "/".join(p for p in (self.package, self.version, self.layout) if p)


@dataclass(frozen=True)
class ReferencedBuild:
    """What a reference came down to: the build's summary, its model files' objects, and
    every file of the package as its action record assembles it from the store."""

    reference: StoreReference
    store: Path
    fingerprint: str
    summary: dict[str, Any]
    model_keys: dict[str, tuple[str, int]]  # package file name -> (store key, size)
    whole_files: dict[str, str]  # every file that is one store object -> its key
    files: tuple[WeightFile, ...] = ()  # the action record's files (payloads at offsets)

    def device_record(self, device: str) -> dict[str, Any]:
        """``device``'s bundle record, read from its store object."""
        from ..package.bundle_record import BUNDLE_NAME, DEVICES, check_agreement
        from ..store import WeightStore

        name = f"{DEVICES}/{device}/{BUNDLE_NAME}"
        context = {"reference": str(self.reference), "device": device}
        if name not in self.whole_files:
            known = sorted(n.split("/")[1] for n in self.whole_files
                           if n.startswith(f"{DEVICES}/") and n.endswith(f"/{BUNDLE_NAME}"))
            raise ResolutionError("no such device in the build", **context,
                                  known=", ".join(known) or "none")
        data = read_object(WeightStore(self.store), self.whole_files[name], context)
        try:
            record = parse_json(data.decode())
            models = [(str(m["file"]), m.get("scenario")) for m in record["models"]]
            models[0]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ResolutionError("malformed bundle record", file=name, **context) from None
        check_agreement(self.summary, device, models, name)
        return record


def find_build(store_root: Path, ref: StoreReference) -> ReferencedBuild:
    """The one build ``ref`` names in the store at ``store_root``, its summary verified."""
    from ..caches import build_actions
    from ..package.summary import SUMMARY_NAME, check_structure
    from ..store import WeightStore
    from ..store.index import INDEX_NAME

    context = {"reference": str(ref), "store": str(store_root)}
    if not (store_root / INDEX_NAME).is_file():
        raise UnknownReference("no weight store here to resolve a store reference in",
                              **context)
    store = WeightStore(store_root)
    pin = ref.pin or ""
    rows, known = store.named_roots(ref.package, ref.version, ref.layout,
                                    root_id=int(pin) if pin.isdigit() else None,
                                    key=pin if pin and not pin.isdigit() else None)
    builds: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows:
        builds.setdefault(r[4], []).append(r)
    if not builds:
        raise UnknownReference("no build in the store matches the reference",
                              known=", ".join(known[:8]) or "none", **context)
    if len(builds) > 1:
        raise ResolutionError(
            "the reference matches several builds: name one with @ROOT_ID or "
            "@SUMMARY_DIGEST", **context, matches=", ".join(
                f"{r[1]}/{r[2]}/{r[3]}@{r[0]}" for rs in builds.values() for r in rs[:1]))
    fingerprint = next(iter(builds))
    record = build_actions.load(store_root, fingerprint)
    if record is None:
        raise ResolutionError("the build has no sound action record in the store (missing, "
                              "written by another user, or its MAC does not hold)",
                              fingerprint=fingerprint, **context)
    files = {f.name: f for f in record.files}
    summary_bytes = read_object(store, files[SUMMARY_NAME].pieces[0].key, context)
    try:
        summary = parse_json(summary_bytes.decode())
        check_structure(summary, f"{SUMMARY_NAME} of {ref}")
        if summary["fingerprint"] != fingerprint:
            raise ValueError("summary of another build")
        named = (summary["package"], summary["version"], summary["layout"]["name"])
        if any(want is not None and want != have for want, have in zip(
                (ref.package, ref.version, ref.layout), named, strict=True)):
            raise ValueError(f"the build is {'/'.join(named)}, not what the store's roots "
                             "say")
        if ref.pin is not None and not ref.pin.isdigit() and ref.pin != files[
                SUMMARY_NAME].pieces[0].key:
            raise ValueError("summary digest differs")
        contents = {str(c["path"]): str(c["digest"]) for c in summary["contents"]}
        models = {str(m["file"]) for m in summary["models"]}
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise ResolutionError(f"the build's summary.json does not agree with its action "
                              f"record: {exc}", fingerprint=fingerprint, **context) from None
    keys: dict[str, tuple[str, int]] = {}
    for name in models:
        f = files.get(name)
        if f is None or len(f.pieces) != 1 or contents.get(name) != f.pieces[0].key:
            raise ResolutionError("the build's action record does not hold its model file "
                                  "as one store object", file=name, **context)
        keys[name] = (f.pieces[0].key, f.size)
    whole = {f.name: f.pieces[0].key for f in record.files
             if len(f.pieces) == 1 and f.pieces[0].offset == 0 and f.pieces[0].size == f.size}
    return ReferencedBuild(ref, store_root, fingerprint, summary, keys, whole,
                           tuple(record.files))


def read_object(store: Any, key: str, context: dict[str, Any]) -> bytes:
    """A store object's bytes, hashed against its key (an IntegrityError otherwise)."""
    obj = _located(store, key, context)
    try:
        return store.read(obj)
    except IntegrityError as exc:
        exc.context.update({k: v for k, v in context.items() if k not in exc.context})
        raise


def open_model_object(build: ReferencedBuild, name: str) -> tuple[Path, int]:
    """The store file of model file ``name`` and a descriptor of it, its bytes hashed
    against their key through that very descriptor (what is parsed is what was checked)."""
    from ..io.digests import digest_fd, split_key
    from ..store import WeightStore

    key, size = build.model_keys[name]
    context = {"reference": str(build.reference), "file": name}
    store = WeightStore(build.store)
    obj = _located(store, key, context)
    path = store.path_of(obj)
    if obj.kind != "separate" or obj.offset != 0 or obj.size != size:
        raise IntegrityError("model file's store object is not a whole file of its size",
                             key=key, path=str(path), offset=obj.offset, size=obj.size,
                             expected=size, **context, hint=REPAIR_HINT)
    try:
        fd = store.open_object(obj)  # never waits on a FIFO: not a regular file is damage
    except IntegrityError as exc:
        raise IntegrityError(f"model file's store object is unreadable: {exc.message}",
                             **{**context, **exc.context, "offset": obj.offset,
                                "hint": REPAIR_HINT}) from None
    except OSError as exc:
        raise IntegrityError(f"model file's store object is unreadable: {exc.strerror}",
                             key=key, path=str(path), **context) from None
    try:
        algo, hex_digest = split_key(key)
        if (os.fstat(fd).st_size != size
                or digest_fd(algo, fd, 0, size, name=str(path)) != hex_digest):
            raise IntegrityError("store object does not match its key", key=key,
                                 path=str(path), offset=obj.offset, size=size, **context,
                                 hint=REPAIR_HINT)
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def _located(store: Any, key: str, context: dict[str, Any]) -> Any:
    try:
        obj = store.lookup(key)
    except (StoreError, ValueError) as exc:
        raise StoreError(f"cannot look the object up: {exc}", key=key, **context) from None
    if obj is None:
        raise IntegrityError("the store no longer holds an object of the build", key=key,
                             hint="a gc dropped it: pin the build's root ('weightstore "
                                  "store pin') to keep it", **context)
    return obj
