"""The package summary (``summary.json``): GE's ExternalWeightDesc list plus totals.

Everything in it derives from the recipe and the source bytes (no time, no absolute path,
no store state), so it is byte-identical across rebuilds and is part of the package.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, PackageError
from ..io.digests import split_key
from ..io.files import is_relative_inside, parse_json, read_regular
from ..recipe.companions import KINDS, colliding, path_problem
from ..recipe.formats import LAYOUT_KEYS_SINCE
from ..version import __version__

if TYPE_CHECKING:  # readers of summaries (verify, release, unpack) need neither
    from ..layout.plan import LayoutPlan
    from ..recipe.schema import Layout

SUMMARY_NAME = "summary.json"
FORMAT_VERSION = 6  # the newest this code writes and reads
CONTENTS_SINCE = 3  # ``contents``: every file of the package with its size and digest
# external data as onnx.proto defines it: no payload digest in ``checksum`` (the digests
# are the summary's ``external_weights[].id``); earlier packages wrote one there
STANDARD_EXTERNAL_DATA_SINCE = 4
# ``companions``: the package's companion files (weightstore.recipe.companions)
COMPANIONS_SINCE = 5
# ``accuracy``: each scenario's figures on the recipe's samples (the accuracy gate)
ACCURACY_SINCE = 6


@dataclass(frozen=True)
class ExternalWeightDesc:
    """One external tensor of a packaged model (GE's ``ExternalWeightDesc``)."""

    id: str  # payload digest key
    name: str
    where: str
    location: str
    offset: int
    size: int
    dtype: str
    shape: tuple[int, ...]
    scenario: str | None = None  # added by this scenario's records, not in the base graph

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "name": self.name, "where": self.where,
               "location": self.location, "offset": self.offset, "size": self.size,
               "dtype": self.dtype, "shape": list(self.shape)}
        if self.scenario is not None:
            out["scenario"] = self.scenario
        return out


@dataclass(frozen=True)
class CompanionEntry:
    """One companion file of a package as ``summary.json`` lists it."""

    path: str
    size: int
    digest: str  # "<algo>:<hex>" of its bytes: the store key of its object
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "digest": self.digest,
                "kind": self.kind}


@dataclass(frozen=True)
class ModelSummary:
    name: str
    file: str
    model_bytes: int
    source_digest: str
    external_sources: dict[str, str]  # external data location in the source -> digest
    inline_tensors: int
    inline_bytes: int
    external: tuple[ExternalWeightDesc, ...]
    scenarios: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "model_bytes": self.model_bytes,
            "source_digest": self.source_digest,
            "external_sources": dict(sorted(self.external_sources.items())),
            "inline_tensors": self.inline_tensors,
            "inline_bytes": self.inline_bytes,
            "external_weights": [w.to_dict() for w in self.external],
            "scenarios": list(self.scenarios),
        }


def package_summary(*, package: str, version: str, layout: Layout, hash_algo: str,
                    fingerprint: str, models: Sequence[ModelSummary],
                    plan: LayoutPlan, devices: Sequence[dict[str, Any]] = (),
                    contents: Sequence[dict[str, Any]] = (),
                    companions: Sequence[CompanionEntry] = (),
                    accuracy: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """``contents``: every file of the package but the summary itself, from
    :func:`weightstore.packaging.inventory.package_contents`; ``companions``: its
    companion files (listed only when there are some, in format 5); ``accuracy``: each
    scenario's figures on the recipe's samples (only when there are some, format 6)."""
    referenced = sum(w.size for m in models for w in m.external)
    unique = {p.key: p.size for f in plan.files for p in f.payloads}
    stored = sum(p.size for f in plan.files for p in f.payloads)
    settings = layout.record()
    with_companions = bool(companions) or any("companions" in d for d in devices)
    out = {
        "format_version": package_format_version(settings, with_companions,
                                                 bool(accuracy)),
        "generator": f"weightstore {__version__}",
        "package": package,
        "version": version,
        "layout": settings,
        "hash": hash_algo,
        "fingerprint": fingerprint,
        "models": [m.to_dict() for m in models],
        "files": [{"name": f.name, "size": f.size, "payloads": len(f.payloads),
                   "padding": f.padding} for f in plan.files],
        "devices": list(devices),
        "contents": list(contents),
        "totals": {
            "models": len(models),
            "external_weights": sum(len(m.external) for m in models),
            "referenced_bytes": referenced,
            "unique_payloads": len(unique),
            "unique_payload_bytes": sum(unique.values()),
            "stored_payload_bytes": stored,
            "dedup_saved_bytes": referenced - stored,
            "padding_bytes": plan.padding,
            "weight_files": len(plan.files),
            "weight_file_bytes": sum(f.size for f in plan.files),
            "model_bytes": sum(m.model_bytes for m in models),
            "inline_tensors": sum(m.inline_tensors for m in models),
        },
    }
    if companions:
        out["companions"] = [c.to_dict() for c in sorted(companions, key=lambda c: c.path)]
    if accuracy:
        out["accuracy"] = list(accuracy)
    return out


def package_format_version(settings: dict[str, Any], companions: bool = False,
                           accuracy: bool = False) -> int:
    """The oldest package format that holds these layout settings, ``contents`` (which
    every summary now lists: a reader of an older format could not check it), models
    whose external data carries no payload digest in ``checksum`` and, when the package
    has some, companion files and accuracy figures."""
    return max([CONTENTS_SINCE, STANDARD_EXTERNAL_DATA_SINCE,
                *([COMPANIONS_SINCE] if companions else []),
                *([ACCURACY_SINCE] if accuracy else []),
                *(LAYOUT_KEYS_SINCE[k] for k in settings if k in LAYOUT_KEYS_SINCE)])


def written_format_version(summary: dict[str, Any]) -> int:
    """The format this weightstore writes the package of ``summary`` in (a malformed
    summary raises KeyError, TypeError or AttributeError)."""
    devices = summary.get("devices", [])
    return package_format_version(summary["layout"], bool(summary.get("companions")) or any(
        isinstance(d, dict) and d.get("companions") for d in devices),
        bool(summary.get("accuracy")))


def render(summary: dict[str, Any]) -> bytes:
    return (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode()


def layout_alignment(summary: Mapping[str, Any]) -> int:
    """The alignment a package's layout gives its weights, which the folders made from
    it (``bundle``, ``pull --device`` / ``--scenario``) keep; a summary that records none
    (not a layout's setting) gives 1."""
    layout = summary.get("layout")
    value = layout.get("alignment") if isinstance(layout, Mapping) else None
    return value if type(value) is int and value > 0 else 1


def read_summary_file(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """The summary of the package in ``folder``: its exact bytes and its content, whose
    structure :func:`check_structure` has checked. Every reader of a package folder's
    summary goes through here, so a malformed one is one :class:`PackageError`."""
    path = folder / SUMMARY_NAME
    try:
        data = read_regular(path)
        summary = parse_json(data)
    except FileNotFoundError:
        raise PackageError("not a package folder: no summary.json",
                           folder=str(folder)) from None
    except NotADirectoryError:
        raise PackageError("not a package folder: a file (a package is the folder holding "
                           "summary.json)", path=str(folder)) from None
    except (OSError, ValueError) as exc:
        raise PackageError(f"cannot read the package summary: {exc}",
                           file=str(path)) from None
    check_structure(summary, str(path))
    return data, summary


def _is_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# key -> (required, check); what the readers (check, resolve, diff, release, assembly) use
_MODEL_KEYS = {"name": (True, _is_str), "file": (True, _is_str),
               "external_weights": (True, lambda v: isinstance(v, list)),
               "scenarios": (False, _is_str_list),
               "external_sources": (False, lambda v: isinstance(v, dict) and all(
                   isinstance(k, str) and isinstance(d, str) for k, d in v.items())),
               "model_bytes": (False, _is_int), "inline_tensors": (False, _is_int),
               "inline_bytes": (False, _is_int), "source_digest": (False, _is_str)}
WEIGHT_KEYS = {"id": (True, _is_str), "name": (True, _is_str),
                "location": (True, _is_str), "offset": (True, _is_int),
                "size": (True, _is_int), "where": (False, _is_str),
                "dtype": (False, _is_str),
                "shape": (False, lambda v: isinstance(v, list) and all(map(_is_int, v))),
                "scenario": (False, lambda v: v is None or isinstance(v, str))}
_FILE_KEYS = {"name": (True, _is_str), "size": (True, _is_int),
              "payloads": (False, _is_int), "padding": (False, _is_int)}
_COMPANION_KEYS = {"path": (True, _is_str), "size": (True, _is_int),
                   "digest": (True, _is_str), "kind": (True, lambda v: v in KINDS)}
_DEVICE_KEYS = {"name": (True, _is_str), "scenario": (False, lambda v: v is None or
                                                      isinstance(v, str)),
                "files": (False, _is_str_list)}


def check_entry(entry: Any, keys: dict[str, Any], where: str, at: str, *,
                what: str = "package summary") -> None:
    """Refuse an entry (``at`` in the file ``where``, a ``what``) that is not an object,
    lacks a required key of ``keys`` or holds one of the wrong type."""
    if not isinstance(entry, dict):
        raise PackageError(f"malformed {what}: not a JSON object", file=where, key=at)
    for key, (required, check) in keys.items():
        if key not in entry:
            if required:
                raise PackageError(f"malformed {what}: a key is missing",
                                   file=where, key=f"{at}.{key}")
        elif not check(entry[key]):
            raise PackageError(f"malformed {what}: a key has the wrong type",
                               file=where, key=f"{at}.{key}")


def check_weight(weight: Any, where: str, at: str, *,
                 what: str = "package summary") -> None:
    """Refuse an external weight's entry (``at`` in the file ``where``, a ``what``) that
    is malformed or whose ``id`` is not a store key of a known algorithm and length:
    that id is what the weight's payload is verified against, and one no reader can
    check would leave the weight unverified."""
    check_entry(weight, WEIGHT_KEYS, where, at, what=what)
    try:
        split_key(weight["id"])
    except IntegrityError:
        raise PackageError(f"malformed {what}: an id is not a store key", file=where,
                           key=f"{at}.id", value=weight["id"]) from None


def check_structure(summary: Any, where: str) -> None:
    """Refuse a summary of a format this code does not know (newer, or not an integer),
    and one whose models, external weights, files or devices lack a key or hold one of the
    wrong type, naming the file and the key (``models[0].file``)."""
    if not isinstance(summary, dict):
        raise PackageError("package summary is not a JSON object", file=where)
    version = summary.get("format_version")
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:
        raise PackageError("package summary has a format_version this weightstore does not "
                           "know", file=where, format_version=repr(version))
    models = summary.get("models")
    if not isinstance(models, list) or not models:
        raise PackageError("malformed package summary: no list of models", file=where,
                           key="models")
    for i, model in enumerate(models):
        check_entry(model, _MODEL_KEYS, where, f"models[{i}]")
        for j, weight in enumerate(model["external_weights"]):
            check_weight(weight, where, f"models[{i}].external_weights[{j}]")
    for key, keys in (("files", _FILE_KEYS), ("devices", _DEVICE_KEYS)):
        if key not in summary:
            continue
        if not isinstance(summary[key], list):
            raise PackageError("malformed package summary: a key has the wrong type",
                               file=where, key=key)
        for i, entry in enumerate(summary[key]):
            check_entry(entry, keys, where, f"{key}[{i}]")
    _check_companions(summary, where)
    _check_accuracy(summary, where)
    _check_paths(summary, where)


def _is_figure(value: Any) -> bool:
    """A recorded figure: a finite number, or None (an output that was not finite)."""
    return value is None or (type(value) in (int, float) and math.isfinite(value))


_ACCURACY_KEYS = {"model": (True, _is_str), "scenario": (True, _is_str),
                  "samples": (True, _is_str), "outputs": (True, lambda v: isinstance(v, list)),
                  "bounds": (False, lambda v: isinstance(v, dict) and bool(v) and all(
                      k in ("min_cosine", "max_abs") and _is_figure(b) and b is not None
                      for k, b in v.items()))}
_OUTPUT_KEYS = {"name": (True, _is_str), "cosine": (True, _is_figure),
                "max_abs": (True, _is_figure)}


def _check_accuracy(summary: dict[str, Any], where: str) -> None:
    """``accuracy`` (format 6 and later): each scenario's figures, every output's."""
    if "accuracy" not in summary:
        return
    entries = summary["accuracy"]
    if not isinstance(entries, list) or summary["format_version"] < ACCURACY_SINCE:
        raise PackageError("malformed package summary: a key has the wrong type",
                           file=where, key="accuracy")
    for i, entry in enumerate(entries):
        check_entry(entry, _ACCURACY_KEYS, where, f"accuracy[{i}]")
        for j, output in enumerate(entry["outputs"]):
            check_entry(output, _OUTPUT_KEYS, where, f"accuracy[{i}].outputs[{j}]")


def _check_companions(summary: dict[str, Any], where: str) -> None:
    """``companions`` (format 5 and later), the package's and each device's."""
    known = summary["format_version"] >= COMPANIONS_SINCE
    if "companions" in summary:
        check_companion_list(summary["companions"], known, where, "companions")
    for i, device in enumerate(summary.get("devices", [])):
        if "companions" in device:
            check_companion_list(device["companions"], known, where,
                                 f"devices[{i}].companions")


def check_companion_list(companions: Any, known: bool, where: str, at: str, *,
                         what: str = "package summary") -> None:
    """A list of companion entries (``at`` in the file ``where``, a ``what`` whose format
    has them: ``known``), each with its path, size, store key and kind, paths unique and
    each one a companion may take."""
    if not isinstance(companions, list) or not known:
        raise PackageError(f"malformed {what}: a key has the wrong type", file=where,
                           key=at)
    for i, entry in enumerate(companions):
        key = f"{at}[{i}]"
        check_entry(entry, _COMPANION_KEYS, where, key, what=what)
        try:
            split_key(entry["digest"])
        except IntegrityError:
            raise PackageError(f"malformed {what}: a digest is not a store key",
                               file=where, key=f"{key}.digest", value=entry["digest"]) from None
        if path_problem(entry["path"]) is not None:
            raise PackageError(f"{what} names a companion path a package cannot hold",
                               file=where, key=f"{key}.path", path=entry["path"])
    clash = colliding(entry["path"] for entry in companions)
    if clash is not None:
        i, other = clash
        raise PackageError(f"{what} lists a companion at the path of another (the same "
                           "but for case, or one a folder of the other)", file=where,
                           key=f"{at}[{i}].path", path=companions[i]["path"], other=other)


def _check_paths(summary: dict[str, Any], where: str) -> None:
    """Every name a reader opens relative to the package folder stays inside it."""
    names = [(f"models[{i}].file", m["file"]) for i, m in enumerate(summary["models"])]
    names += [(f"models[{i}].external_weights[{j}].location", w["location"])
              for i, m in enumerate(summary["models"])
              for j, w in enumerate(m["external_weights"])]
    names += [(f"files[{i}].name", f["name"]) for i, f in enumerate(summary.get("files", []))]
    for i, d in enumerate(summary.get("devices", [])):
        names.append((f"devices[{i}].name", d["name"]))
        names += [(f"devices[{i}].files[{j}]", f) for j, f in enumerate(d.get("files", []))]
    for key, name in names:
        if not is_relative_inside(name, hidden=False) or (key.startswith("devices")
                                                            and key.endswith(".name")
                                                            and "/" in name):
            raise PackageError("package summary names a path outside the package folder",
                               file=where, key=key, path=name)
