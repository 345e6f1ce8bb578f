"""Action records: a built package, described as store objects at offsets.

A package's bytes are determined by its fingerprint (recipe settings, models, the content
of every source, weightstore's version: see :mod:`weightstore.package.fingerprint`), never
by paths, thread counts or the store's state. After a build, every file of the package is
either store payloads at known offsets with zeros between (weight files) or one store
object (model files, ``summary.json``, device folders' files, which the build puts into
the store too). The record says which, so a later build of the same fingerprint whose
folder is missing materializes the package from the store
(:mod:`weightstore.packaging.materialize`) instead of converting: no onnx, numpy or
pydantic, no hashing of sources::

    <store>/build-actions/<hex of the action key>.json
        {"format_version", "generator", "key", "fingerprint", "hash", "layout",
         "files": [{"name", "size", "pieces": [{"key", "offset", "size"}]}],
         "mac"}                                  keyed blake3 over all the rest

The action key is the blake3 digest of the fingerprint with this format's version, the
weightstore version and the summary and store format versions. A record is a cache, never
an authority: it is used only when its MAC (under the user's own secret,
:mod:`weightstore.store.mac`) holds, and every byte it leads to is re-hashed against its
store key as it is copied. A record another user wrote, edited, truncated or swapped, or
one naming an object the store no longer holds, costs a real build, never a wrong package.

The record is also the proof that a package folder is the build (:mod:`weightstore.package.
proof`): its ``summary.json`` key names the very summary the fingerprint produced. An
``embedded`` layout, whose weights are all inside its model files, gets a record naming only
``summary.json`` (its object is not stored): it proves such a folder, and materializes
nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, PackageError, StoreError
from ..io.digests import digest_bytes, make_key, split_key
from ..io.files import (
    atomic_write_bytes,
    is_relative_inside,
    parse_json,
    read_record_bytes,
    read_regular,
)
from ..package.assembly import WeightFile, summary_weight_files, weight_file
from ..package.summary import FORMAT_VERSION as SUMMARY_FORMAT_VERSION
from ..package.summary import SUMMARY_NAME
from ..store.mac import entry_mac, verify_mac
from ..version import __version__

if TYPE_CHECKING:
    from ..store import WeightStore

FORMAT_VERSION = 2  # 2: embedded layouts get a record too, naming only summary.json
FOLDER = "build-actions"
KEY_ALGO = "blake3"
STORE_FORMAT_VERSION = 2  # weightstore.store.index.FORMAT_VERSION (not imported: sqlite3)


@dataclass(frozen=True)
class ActionRecord:
    """A package as files of store objects; ``hash``: the package's digest algorithm."""

    fingerprint: str
    hash: str
    layout: str
    files: tuple[WeightFile, ...]


def action_key(fingerprint: str) -> str:
    """Everything the package's bytes depend on: the fingerprint and the formats."""
    doc = [FORMAT_VERSION, __version__, SUMMARY_FORMAT_VERSION, STORE_FORMAT_VERSION,
           fingerprint]
    text = json.dumps(doc, separators=(",", ":")).encode()
    return make_key(KEY_ALGO, digest_bytes(KEY_ALGO, text))


def record_path(store_root: Path, fingerprint: str) -> Path:
    return store_root / FOLDER / f"{split_key(action_key(fingerprint))[1]}.json"


def load(store_root: Path, fingerprint: str) -> ActionRecord | None:
    """The record of ``fingerprint`` in this store when it is sound (well formed, its MAC
    holds, it describes this fingerprint under this weightstore); None otherwise."""
    try:
        doc = parse_json(read_record_bytes(record_path(store_root, fingerprint)))
        mac = doc.pop("mac")
        if (doc.get("format_version") != FORMAT_VERSION or doc.get("generator") != __version__
                or doc.get("key") != action_key(fingerprint)
                or doc.get("fingerprint") != fingerprint or not verify_mac(doc, mac)):
            return None
        files = tuple(_file(f) for f in doc["files"])
        names = [f.name for f in files]
        if SUMMARY_NAME not in names or len(set(names)) != len(names):
            return None
        split_key(f"{doc['hash']}:{'0' * 64}")
        return ActionRecord(fingerprint, str(doc["hash"]), str(doc["layout"]), files)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError,
            PackageError):
        return None


def _file(doc: Mapping[str, Any]) -> WeightFile:
    name = doc["name"]
    if not is_relative_inside(name, hidden=False):
        raise ValueError("unsafe file name in an action record")
    if type(doc["size"]) is not int or doc["size"] < 0:
        raise ValueError("bad file size in an action record")
    return weight_file(name, doc["size"], [(int(p["offset"]), int(p["size"]), str(p["key"]))
                                           for p in doc["pieces"]])


def whole_files(summary: Mapping[str, Any], summary_bytes: bytes,
                weights: list[WeightFile] | None = None) -> list[WeightFile]:
    """The package's files that are not weight files (models, device files,
    ``summary.json``), each one store object keyed by its digest."""
    algo = str(summary["hash"])
    names = {f.name for f in (summary_weight_files(summary) if weights is None else weights)}
    out = [weight_file(str(c["path"]), int(c["size"]), [(0, int(c["size"]), str(c["digest"]))])
           for c in summary["contents"] if str(c["path"]) not in names]
    key = make_key(algo, digest_bytes(algo, summary_bytes))
    out.append(weight_file(SUMMARY_NAME, len(summary_bytes), [(0, len(summary_bytes), key)]))
    return out


def _rewrite_damaged(store: WeightStore, payloads: Sequence[Any]) -> None:
    """A package file whose store object is damaged is rewritten from the folder's bytes
    (checked against the key first; see :meth:`WeightStore.heal`): ``put`` keeps an
    indexed key as it is, so the record would otherwise point at the damage and every
    later build would fall back to a conversion."""
    found = store.locate([p.key for p in payloads])
    for payload in payloads:
        obj = found.get(payload.key)
        if obj is None:
            continue
        try:
            store.read(obj)
        except IntegrityError:
            try:
                store.heal(payload, obj)
            except (OSError, StoreError):  # a store this user may only read: left as is
                return

def record(store: WeightStore, folder: Path, summary: Mapping[str, Any], *,
           jobs: int = 4) -> dict[str, int]:
    """Put the package's files that are not weight files into the store (each re-hashed
    against the digest its summary lists, as every put is) and write the record of the
    package at ``folder``. Returns what the put did (``PutReport.to_dict()``, or nothing).

    Best effort: without a private key, or when the folder no longer holds what its
    summary says, nothing is recorded (a record is only a shortcut).
    """
    from ..store import BytesPayload

    embedded = summary.get("layout", {}).get("external_weight") == "embedded"
    try:
        summary_bytes = read_regular(folder / SUMMARY_NAME)
        if parse_json(summary_bytes) != summary:
            return {}  # replaced since it was written: not this build's summary
        weights = [] if embedded else summary_weight_files(summary)
        whole = whole_files(summary, summary_bytes, weights)
        if embedded:
            # every weight is in the model, nothing of it in the store: the record holds
            # only the summary's key, the proof that a folder is this build
            # (packaging.proof); it materializes nothing (its object is not stored)
            whole = [f for f in whole if f.name == SUMMARY_NAME]
        payloads = [BytesPayload(f.pieces[0].key, read_regular(folder / f.name),
                                 str(folder / f.name)) for f in whole if not embedded]
        fingerprint = str(summary["fingerprint"])
    except (OSError, ValueError, TypeError, KeyError, PackageError):
        return {}
    if payloads and any(p.size != f.size for p, f in zip(payloads, whole, strict=True)):
        return {}
    if entry_mac([]) is None:
        return {}  # no private key: no record would be trusted, so store nothing for one
    report: dict[str, int] = {}
    try:
        if payloads:
            _rewrite_damaged(store, payloads)
            report = store.put(payloads, kind="separate", jobs=jobs).to_dict()
    except IntegrityError:  # changed since it was published: record nothing
        return {}
    files = sorted([*weights, *whole], key=lambda f: f.name)
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "generator": __version__,
        "key": action_key(fingerprint), "fingerprint": fingerprint,
        "hash": str(summary["hash"]), "layout": str(summary["layout"]["name"]),
        "files": [{"name": f.name, "size": f.size,
                   "pieces": [{"key": p.key, "offset": p.offset, "size": p.size}
                              for p in f.pieces]} for f in files],
    }
    mac = entry_mac(doc)
    if mac is not None:
        path = record_path(store.root, fingerprint)
        with contextlib.suppress(OSError):
            path.parent.mkdir(exist_ok=True)
            atomic_write_bytes(path, json.dumps({**doc, "mac": mac},
                                                sort_keys=True).encode())
    return report
