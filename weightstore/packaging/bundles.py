"""Device bundles: which scenario a device runs, and only the files it needs.

A package folder holds, per device, ``devices/<device>/``: each model as the device runs it
(its scenario replayed and cleaned up: an ordinary ONNX file) and ``bundle.json``, which
lists the package weight files those models reference. Weight files are not copied
there: onnx and onnxruntime refuse external data outside a model's folder, through ``..``,
symlinks or hard links, so a folder that shared the package's files could not load, and
copies would store every common file once per device. ``weightstore bundle`` assembles a
device's self-contained folder on request instead, its weight files holding only the live
payloads of the files it lists (:mod:`.variant_files`, as ``pull --device`` writes it).

Scenario selection is metadata only: an explicit scenario, null (the default graph), or
``auto``: the first scenario, in recipe order, whose ``requires`` the capabilities satisfy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, PackageError
from ..io.digests import digest_bytes, digest_file, make_key
from ..io.files import (
    atomic_write_bytes,
    copy_range,
    discard_temp_dir,
    make_temp_dir,
    publish_dir,
    read_regular,
)
from ..io.models import save_model
from ..io.onnx_proto import ModelProto, parse_model
from ..package.bundle_record import (
    BUNDLE_NAME,
    DEVICES,
    device_path,
    device_record,
    model_entry,
    read_bundle,
    render_record,
)
from ..package.summary import read_summary_file
from ..resolve.files import file_problems
from .check import variant_of

if TYPE_CHECKING:  # reading bundle records needs no recipe machinery
    from ..recipe.schema import Device

def satisfies(capabilities: Mapping[str, Any], requires: Mapping[str, Any]) -> bool:
    """Does a device with ``capabilities`` meet every requirement?"""
    for key, wanted in requires.items():
        if key not in capabilities:
            return False
        have = capabilities[key]
        offered = have if isinstance(have, list) else [have]
        accepted = wanted if isinstance(wanted, list) else [wanted]
        if not any(value in accepted for value in offered):  # a list means "any of"
            return False
    return True


def select_scenario(device: Device, scenarios: Sequence[tuple[str, Mapping[str, Any]]],
                    ) -> str | None:
    """The scenario ``device`` runs among ``(name, requires)`` in recipe order, or None."""
    if device.scenario != "auto":
        return device.scenario
    for name, requires in scenarios:
        if satisfies(device.capabilities, requires):
            return name
    return None


def write_device(folder: Path, device: Device,
                 models: Sequence[tuple[str, str, ModelProto, str | None,
                                        Mapping[tuple[str, int], str]]],
                 algo: str, companions: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Write ``devices/<device>/`` in a package being built; returns its bundle record,
    which lists the device's ``companions`` (summary entries: the files its runtime
    folder holds at its root; the package writer puts them in the package).

    ``models`` are ``(model name, file name, packaged model, scenario, store keys)``, the
    keys of its
    external weights by location and offset (the summary's); a model without that
    scenario runs its default graph. Each is resolved as a load resolves it
    (:func:`weightstore.resolve.variant.variant_graph`): the device's model is the final
    graph, and its files are those its live weights need, whose keys the record lists,
    with each model file's digest (``algo``).
    """
    from ..resolve.variant import variant_graph
    from ..scenarios.resolve import live_payloads

    out = folder / DEVICES / device.name
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    files: dict[str, int] = {}
    for name, file, model, scenario, keys in models:
        resolved = variant_graph(model, scenario)
        live = live_payloads(resolved, scenario)
        size = save_model(resolved, out / file)
        files.update((p.location, (folder / p.location).stat().st_size) for p in live)
        digest = make_key(algo, digest_file(algo, out / file))
        entries.append(model_entry(name, file, scenario, size, live, keys, digest))
    record = device_record(device.name, device.capabilities, device.scenario, entries, files,
                           companions)
    atomic_write_bytes(out / BUNDLE_NAME, render_record(record))
    return record


def assemble(package: str | os.PathLike[str], device: str,
             output: str | os.PathLike[str], *, verify: bool = True,
             progress: bool | None = False) -> dict[str, Any]:
    """Write ``device``'s models and only their live payloads into ``output``; returns the
    folder's bundle record.

    The weight files keep the package's names but hold only the live payloads, laid out
    again at the layout's alignment (:mod:`.variant_files`), each piece re-hashed against
    its key as it is written. The result loads directly in onnxruntime. With ``verify``,
    the folder is then resolved from its own record and every live payload re-hashed
    again. ``output`` is written as a temp folder and renamed. ``progress``: bars with
    rate and ETA for copying and verifying (None: only on a terminal).
    """
    from ..layout.writer import FileRange
    from ..package.assembly import write_files
    from ..package.summary import layout_alignment
    from ..progress import Progress
    from ..resolve.source import store_keys_of
    from .companion_files import companion_files
    from .variant_files import VariantModel, write_models

    package, output = Path(package), Path(output)
    summary = read_summary_file(package)[1]
    record = read_bundle(package, device, summary)
    # the record (its keys, its companions' digests) and the models the folder is made
    # from are the package's: their bytes are those the summary lists
    sources = _listed_bytes(package, summary, [device_path(device, BUNDLE_NAME), *(
        device_path(device, entry["file"]) for entry in record["models"])])
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.exists() and any(output.iterdir()):
        raise PackageError("output folder is not empty", folder=str(output))
    for f in record["files"]:
        _check_source(package / f["name"], f["size"])
    tmp: Path | None = make_temp_dir(output.parent, f".{output.name}.")
    try:
        models = [VariantModel(entry.get("name"), entry["file"], parse_model(
                               sources[device_path(device, entry["file"])]),
                               entry["scenario"], store_keys_of(entry))
                  for entry in record["models"]]
        written = write_models(tmp, models, layout_alignment(summary), _digest_algo(
            record, summary))
        companions = record.get("companions", [])
        # which package file holds each: as the summary lists the device's own versions
        files = {c.path: c.file for c in companion_files(summary, device_sets=True)
                 if c.device == device}
        # the folder's own record: the device's, its models' payloads at their new places
        record = device_record(record["device"], record.get("capabilities") or {},
                               record.get("scenario_rule"), written.entries,
                               {f.name: f.size for f in written.files}, companions)
        atomic_write_bytes(tmp / BUNDLE_NAME, render_record(record), sync_dir=False)

        def locate(key: str) -> FileRange:
            name, offset = written.sources[key]
            return FileRange(package / name, offset)

        with Progress("copying", sum(f.size for f in written.files) + sum(
                c["size"] for c in companions), enabled=progress) as bar:
            write_files(tmp, written.files, locate)
            bar.advance(sum(f.size for f in written.files))
            for c in companions:  # the device's own file, or else the package's
                _copy_companion(package / files.get(c["path"], c["path"]),
                                tmp / c["path"], c)
                bar.advance(c["size"])
        if verify:
            resolved = [(entry, variant_of(tmp / entry["file"], entry["scenario"], final=True))
                        for entry in record["models"]]
            total = sum(e.source.length for _, v in resolved for e in v.external)
            with Progress("verifying", total, enabled=progress) as bar:
                for entry, v in resolved:
                    file_problems(tmp, v.external, entry["scenario"], verify=True,
                                  strict=True, progress=bar.advance)
        publish_dir(tmp, output, over_empty=True)
        tmp = None
    finally:
        discard_temp_dir(tmp)
    return record


def _listed_bytes(package: Path, summary: Mapping[str, Any],
                  names: Sequence[str]) -> dict[str, bytes]:
    """The bytes of package files ``names``, each the bytes the summary's ``contents``
    lists for it (a summary of a format without ``contents`` lists none to check): an
    edited file is an :class:`IntegrityError` naming it, as ``verify`` refuses it."""
    listed = {c["path"]: c for c in summary.get("contents", [])}
    out = {}
    for name in names:
        try:
            data = read_regular(package / name)
        except OSError as exc:
            raise PackageError(f"cannot read a file the device needs: {exc.strerror or exc}",
                               file=name, package=str(package)) from None
        entry = listed.get(name)
        if listed and entry is None:
            raise IntegrityError("a file the device needs is not listed in the summary",
                                 file=name, package=str(package))
        if entry is not None:
            algo = str(entry["digest"]).partition(":")[0]
            actual = make_key(algo, digest_bytes(algo, data))
            if len(data) != entry["size"] or actual != entry["digest"]:
                raise IntegrityError("package file differs from its summary", file=name,
                                     package=str(package), expected=entry["digest"],
                                     actual=actual)
        out[name] = data
    return out


def _digest_algo(record: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The algorithm of a device folder's model digests: the package record's, else the
    package's hash."""
    for entry in record["models"]:
        if "digest" in entry:
            return str(entry["digest"]).partition(":")[0]
    return str(summary.get("hash") or "blake3")


def _copy_companion(src: Path, dst: Path, entry: Mapping[str, Any]) -> None:
    """Copy a companion file into the runtime folder being made, its bytes checked
    against the record's digest (a runtime reads them whole: they are never trusted
    unverified)."""
    if src.is_symlink():
        raise PackageError("a companion file the device needs is a link",
                           file=entry["path"])
    _copy_file(src, dst, entry["size"], what="companion")
    algo = entry["digest"].partition(":")[0]
    if make_key(algo, digest_file(algo, dst)) != entry["digest"]:
        raise IntegrityError("a companion file the device needs differs from its digest",
                             file=entry["path"], package=str(src.parent))


def _check_source(src: Path, size: int, what: str = "weight") -> None:
    """A package file the device needs is there, with the size its record lists."""
    try:
        actual = src.stat().st_size
    except FileNotFoundError:
        raise PackageError(f"a {what} file the device needs is missing",
                           file=src.name, package=str(src.parent)) from None
    if actual != size:
        raise PackageError(f"a {what} file the device needs has another size than "
                           "recorded", file=src.name, size=actual, expected=size)


def _copy_file(src: Path, dst: Path, size: int, what: str = "weight") -> None:
    _check_source(src, size, what)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        copy_range(fin.fileno(), 0, fout.fileno(), 0, size)
        os.fsync(fout.fileno())


def check_live(model_path: Path, scenario: str | None, *, verify: bool) -> list[str]:
    """Problems with the files a device model (a resolved variant: ``scenario`` names it
    in messages) needs; the first one raises (see
    :func:`weightstore.resolve.files.file_problems`). ``verify`` re-hashes the live
    payloads against the keys of the record beside the model, or the digests the model
    itself declares (an earlier version's package)."""
    variant = variant_of(model_path, scenario, final=True)
    return file_problems(model_path.parent, variant.external, scenario, verify=verify,
                         strict=True)
