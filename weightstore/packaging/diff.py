"""``weightstore diff A B``: what changed between two packages (folders or archives).

Each side is first checked as what it compares (:func:`open_view`): a folder as ``verify``
checks it, an archive as ``unpack`` reads it; then only its metadata is compared
(``summary.json`` and the device ``bundle.json`` files). The comparison is pure and
returns frozen :class:`Change` records keyed by kind and name, which the command only
renders. ``fetch`` answers the deployment question: the bytes a device already holding A
must download to hold B, counted by whole files (what a file-by-digest sync moves) and by
payloads (what a weight-level fetch moves: every new payload once, plus every changed file
that is not a weight file).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PackageError
from ..io.files import parse_json, read_regular
from ..io.tar import read_trailer
from ..package.bundle_record import BUNDLE_NAME
from .archive_reader import open_archive
from .companion_files import PackagedCompanion, companion_files, read_companion
from .inventory import read_summary, verified_package
from .unpack import read_archive


@dataclass(frozen=True)
class PackageView:
    """What a diff needs of a package: its summary and its devices' records."""

    source: str
    summary: dict[str, Any]
    bundles: dict[str, dict[str, Any]]  # device name -> bundle.json
    verified: bool = True  # its files were hashed against the summary (not --no-verify)
    # package file -> bytes of the companions asked for (open_view's companion_limit)
    companion_bytes: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    kind: str  # added | removed | changed
    what: str  # model | weight | scenario | device | companion | file
    name: str
    old: str | None = None
    new: str | None = None
    # a companion's: the device whose own file it is (None: the package's), each side's
    # size and kind (None on the side that lacks it)
    device: str | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_kind: str | None = None
    new_kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "what": self.what, "name": self.name, "old": self.old,
               "new": self.new}
        if self.what == "companion":
            out |= {"device": self.device, "old_size": self.old_size,
                    "new_size": self.new_size, "old_kind": self.old_kind,
                    "new_kind": self.new_kind}
        return out

    def __str__(self) -> str:
        sign = {"added": "+", "removed": "-", "changed": "~"}[self.kind]
        if self.what == "companion":
            device = f" on device {self.device}" if self.device is not None else ""
            kinds = " -> ".join(dict.fromkeys(k for k in (self.old_kind, self.new_kind) if k))
            sizes = " -> ".join(str(n) for n in (self.old_size, self.new_size)
                                if n is not None)
            return f"{sign} companion {self.name}{device} ({kinds}, {sizes} bytes)"
        values = " -> ".join(v for v in (self.old, self.new) if v is not None)
        return f"{sign} {self.what} {self.name}" + (f"  {values}" if values else "")


@dataclass(frozen=True)
class PackageDiff:
    a: str
    b: str
    changes: tuple[Change, ...]
    fetch_file_bytes: int
    fetch_payload_bytes: int
    device_fetch_bytes: dict[str, int] = field(default_factory=dict)
    verified: bool = True  # both sides' files were hashed against their summaries

    @property
    def identical(self) -> bool:
        return not self.changes

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "identical": self.identical,
                "verified": self.verified,
                "changes": [c.to_dict() for c in self.changes],
                "fetch": {"file_bytes": self.fetch_file_bytes,
                          "payload_bytes": self.fetch_payload_bytes,
                          "devices": dict(sorted(self.device_fetch_bytes.items()))}}


def open_view(path: str | Path, *, verify: bool = True, jobs: int = 1,
              companion_limit: int = 0) -> PackageView:
    """The package at ``path`` (a folder or a release archive), read only once its files
    are what its summary lists: a folder as ``verify`` checks it, an archive as ``unpack``
    reads it (every member checked and hashed, nothing after the tar's end); anything
    either refuses is refused here. ``verify=False`` hashes nothing: every other check
    (kinds, paths, sizes, unlisted and missing files, the archive's structure) holds.
    ``companion_limit``: also hold the bytes of every companion file up to that size
    (checked against the summary as they are read), for a reader that shows them."""
    path = Path(path)
    if not path.exists():
        raise PackageError("no such package folder or archive", path=str(path))
    if path.is_dir():
        verified_package(path, hashed=verify, jobs=jobs)
        summary = read_summary(path)
        bundles = {}
        for d in summary.get("devices", []):
            record = path / "devices" / d["name"] / BUNDLE_NAME
            try:
                bundles[d["name"]] = parse_json(read_regular(record))
            except (OSError, ValueError) as exc:
                raise PackageError(f"cannot read a device record: {exc}",
                                   file=str(record)) from None
        small = _small_companions(summary, companion_limit)
        return PackageView(str(path), summary, bundles, verify,
                           {c.file: read_companion(path, c, c.size).head for c in small})
    return _archive_view(path, verify, companion_limit)


def _small_companions(summary: Mapping[str, Any], limit: int) -> list[PackagedCompanion]:
    """The companion files of at most ``limit`` bytes, each package file once."""
    return list({c.file: c for c in companion_files(summary) if c.size <= limit}.values())


def _is_bundle(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 3 and parts[0] == "devices" and parts[2] == BUNDLE_NAME


def _archive_view(path: Path, verify: bool, companion_limit: int) -> PackageView:
    read = read_archive(path, keep=_is_bundle, hashed=verify,
                        keep_companions=lambda summary: {
                            c.file for c in _small_companions(summary, companion_limit)})
    bundles: dict[str, dict[str, Any]] = {}
    companions = {rel: read.kept.pop(rel) for rel in read.companions}
    for rel, data in read.kept.items():
        try:
            bundles[rel.split("/")[1]] = parse_json(data)
        except ValueError as exc:
            raise PackageError(f"archive member is not JSON: {exc}", archive=str(path),
                               member=rel) from None
    return PackageView(str(path), read.summary, bundles, verify, companions)


def weights_by_name(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """External weights by the name a diff gives them: ``model/name[@scenario]``."""
    out = {}
    for m in summary["models"]:
        for w in m["external_weights"]:
            scenario = f"@{w['scenario']}" if w.get("scenario") else ""
            out[f"{m['name']}/{w['name']}{scenario}"] = w
    return out


def _pairs(kind: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[Change]:
    out = [Change("removed", kind, k, old[k]) for k in old if k not in new]
    out += [Change("added", kind, k, None, new[k]) for k in new if k not in old]
    out += [Change("changed", kind, k, old[k], new[k]) for k in old
            if k in new and old[k] != new[k]]
    return out


def diff_packages(a: PackageView, b: PackageView) -> PackageDiff:
    """Pure: two views in, the changes and the fetch sizes out."""
    sa, sb = a.summary, b.summary
    changes: list[Change] = []
    models_a = {m["name"]: m for m in sa["models"]}
    models_b = {m["name"]: m for m in sb["models"]}
    changes += _pairs("model", {k: m["file"] for k, m in models_a.items()},
                      {k: m["file"] for k, m in models_b.items()})
    wa, wb = weights_by_name(sa), weights_by_name(sb)
    weight_changes = _pairs("weight", {k: w["id"] for k, w in wa.items()},
                            {k: w["id"] for k, w in wb.items()})
    changes += weight_changes
    touched = {c.name.rpartition("@")[2] for c in weight_changes if "@" in c.name}
    for name in sorted(set(models_a) & set(models_b)):
        old, new = set(models_a[name]["scenarios"]), set(models_b[name]["scenarios"])
        changes += [Change("removed", "scenario", f"{name}@{s}") for s in sorted(old - new)]
        changes += [Change("added", "scenario", f"{name}@{s}") for s in sorted(new - old)]
        changes += [Change("changed", "scenario", f"{name}@{s}") for s in sorted(old & new)
                    if s in touched]
    changes += _pairs("accuracy", accuracy_figures(sa), accuracy_figures(sb))
    files_a = {c["path"]: c for c in sa["contents"]}
    files_b = {c["path"]: c for c in sb["contents"]}
    changes += _device_changes(sa, sb, files_a, files_b)
    changes += companion_changes(sa, sb)
    companions_a = {c.file for c in companion_files(sa)}  # named as companions, not files
    companions_b = {c.file for c in companion_files(sb)}
    changes += _pairs("file", {k: c["digest"] for k, c in files_a.items()
                               if k not in companions_a},
                      {k: c["digest"] for k, c in files_b.items() if k not in companions_b})
    held = {c["digest"] for c in sa["contents"]}
    held_payloads = {w["id"] for w in wa.values()}
    weight_files = _weight_file_paths(sb)
    file_bytes = sum(c["size"] for c in sb["contents"] if c["digest"] not in held)
    new_payloads = {w["id"]: w["size"] for w in wb.values() if w["id"] not in held_payloads}
    payload_bytes = sum(new_payloads.values()) + sum(
        c["size"] for c in sb["contents"]
        if c["digest"] not in held and c["path"] not in weight_files)
    devices = {}
    for name, record in b.bundles.items():
        needed = [c for c in sb["contents"] if c["path"].startswith(f"devices/{name}/")]
        names = {f["name"] for f in record.get("files", [])}
        needed += [c for c in sb["contents"] if c["path"] in names]
        # its runtime folder holds its companions: those of the package root's files too
        needed += [files_b[c.file] for c in companion_files(sb, device_sets=True)
                   if c.device == name and not c.file.startswith("devices/")]
        devices[name] = sum(c["size"] for c in needed if c["digest"] not in held)
    order = {"model": 0, "weight": 1, "scenario": 2, "accuracy": 3, "device": 4,
             "companion": 5, "file": 6}
    changes.sort(key=lambda c: (order[c.what], c.name, c.device or "", c.kind))
    return PackageDiff(a.source, b.source, tuple(changes), file_bytes, payload_bytes, devices,
                       a.verified and b.verified)


def accuracy_figures(summary: Mapping[str, Any]) -> dict[str, str]:
    """The summary's accuracy figures by the name a diff gives them: ``model@scenario
    output figure`` (and ``model@scenario bounds``, ``model@scenario samples``)."""
    out = {}
    for a in summary.get("accuracy", []):
        at = f"{a['model']}@{a['scenario']}"
        out[f"{at} samples"] = a["samples"]
        if a.get("bounds"):
            out[f"{at} bounds"] = ", ".join(f"{k} {v:.6g}"
                                            for k, v in sorted(a["bounds"].items()))
        for o in a["outputs"]:
            for figure in ("cosine", "max_abs"):
                value = o[figure]
                out[f"{at} {o['name']} {figure}"] = ("not finite" if value is None
                                                     else f"{value:.6g}")
    return out


def companion_changes(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[Change]:
    """Companions added, removed and changed (bytes or kind): the package's own set by
    path, then each device's own files (``devices/<device>/<path>``) where either side
    has one, compared with what the device holds on the other side."""
    def keyed(summary: Mapping[str, Any]) -> dict[tuple[str | None, str], PackagedCompanion]:
        return {(c.device, c.path): c for c in companion_files(summary, device_sets=True)}

    old, new = keyed(sa), keyed(sb)
    own = {key for side in (old, new) for key, c in side.items()
           if c.device is None or c.file != c.path}
    out = []
    for key in sorted(own, key=lambda k: (k[1], k[0] or "")):
        a, b = old.get(key), new.get(key)
        if a is not None and b is not None and (a.digest, a.kind) == (b.digest, b.kind):
            continue
        kind = "added" if a is None else "removed" if b is None else "changed"
        out.append(Change(kind, "companion", key[1], *(c.digest if c else None for c in (a, b)),
                          device=key[0], old_size=a.size if a else None,
                          new_size=b.size if b else None, old_kind=a.kind if a else None,
                          new_kind=b.kind if b else None))
    return out


def _weight_file_paths(summary: Mapping[str, Any]) -> set[str]:
    """Contents paths that hold payloads: the weight files, or the files inside weight
    folders (split separate layouts)."""
    names = {f["name"] for f in summary["files"]}
    return {c["path"] for c in summary["contents"]
            if c["path"] in names or c["path"].split("/")[0] in names}


def _device_changes(sa: Mapping[str, Any], sb: Mapping[str, Any], files_a: Mapping[str, Any],
                    files_b: Mapping[str, Any]) -> Iterable[Change]:
    def state(summary: Mapping[str, Any], files: Mapping[str, Any]) -> dict[str, str]:
        out = {}
        for d in summary.get("devices", []):
            digests = sorted((p, c["digest"]) for p, c in files.items()
                             if p.startswith(f"devices/{d['name']}/"))
            out[d["name"]] = json.dumps([d.get("scenario"), digests])
        return out

    old, new = state(sa, files_a), state(sb, files_b)
    scen_a = {d["name"]: str(d.get("scenario")) for d in sa.get("devices", [])}
    scen_b = {d["name"]: str(d.get("scenario")) for d in sb.get("devices", [])}
    out = [Change("removed", "device", k) for k in old if k not in new]
    out += [Change("added", "device", k) for k in new if k not in old]
    out += [Change("changed", "device", k, f"scenario {scen_a[k]}", f"scenario {scen_b[k]}")
            for k in old if k in new and old[k] != new[k]]
    return out


def first_member_difference(a: Path, b: Path) -> str:
    """Where two archives first differ: the first member whose header or data differs, or
    what makes one unreadable (cut short, damaged, bytes after its end)."""
    try:
        return _first_member_difference(a, b)
    except PackageError as exc:
        return str(exc)


def _first_member_difference(a: Path, b: Path) -> str:
    from ..io.digests import new_hasher

    def members(path: Path):
        with open_archive(path) as tf:
            for m in tf:
                h = new_hasher("blake3")
                f = tf.extractfile(m) if m.isfile() else None
                while f is not None and (chunk := f.read(1 << 20)):
                    h.update(chunk)
                yield m, h.hexdigest()
            read_trailer(tf)

    fields = ("name", "type", "mode", "mtime", "uid", "gid", "uname", "gname", "size",
              "pax_headers")
    left, right = members(a), members(b)
    while True:
        x, y = next(left, None), next(right, None)
        if x is None or y is None:
            if x is None and y is None:
                return "same tar members, different compressed bytes"
            extra = (x or y)[0].name  # type: ignore[index]
            return f"member {extra} is only in the {'published' if x else 'rebuilt'} archive"
        (ma, da), (mb, db) = x, y
        for name in fields:
            va, vb = getattr(ma, name), getattr(mb, name)
            if va != vb:
                return f"member {ma.name}: {name} {va!r} != {vb!r}"
        if da != db:
            return f"member {ma.name}: content differs"


__all__ = ["Change", "PackageDiff", "PackageView", "companion_changes", "diff_packages",
           "first_member_difference", "open_view"]
