"""Device bundles: which scenario a device runs, and only the files it needs.

A package folder holds, per device, ``devices/<device>/``: each model as the device runs it
(its scenario replayed and cleaned up: an ordinary ONNX file) and ``bundle.json``, which
lists the package weight files those models reference. Weight files are not copied
there: onnx and onnxruntime refuse external data outside a model's folder, through ``..``,
symlinks or hard links, so a folder that shared the package's files could not load, and
copies would store every common file once per device. ``weightstore bundle`` assembles a
device's self-contained folder on request instead, copying only the files it lists.

Scenario selection is metadata only: an explicit scenario, null (the default graph), or
``auto``: the first scenario, in recipe order, whose ``requires`` the capabilities satisfy.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from ..errors import PackageError
from ..io.files import atomic_write_bytes, copy_range, discard_temp_dir, make_temp_dir, publish_dir
from ..io.models import save_model
from ..resolve.files import file_problems
from ..resolve.source import store_keys_of
from .bundle_record import BUNDLE_NAME, DEVICES, FORMAT_VERSION, read_bundle
from .check import variant_of
from .summary import read_summary_file

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


def write_device(folder: Path, device: Device, models: Sequence[tuple[str, onnx.ModelProto,
                                                                       str | None]],
                 ) -> dict[str, Any]:
    """Write ``devices/<device>/`` in a package being built; returns its bundle record.

    ``models`` are ``(model name, packaged model, scenario)``; a model without that
    scenario runs its default graph. Each is resolved as a load resolves it
    (:func:`weightstore.resolve.variant.variant_graph`): the device's model is the final
    graph, and its files are those its live weights need.
    """
    from ..resolve.variant import variant_graph
    from ..scenarios.resolve import live_payloads

    out = folder / DEVICES / device.name
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    files: dict[str, int] = {}
    for name, model, scenario in models:
        resolved = variant_graph(model, scenario)
        live = live_payloads(resolved, scenario)
        size = save_model(resolved, out / f"{name}.onnx")
        for p in live:
            files[p.location] = max(files.get(p.location, 0), p.offset + p.length)
        entries.append({"name": name, "file": f"{name}.onnx", "scenario": scenario,
                        "model_bytes": size, "live_weights": len(live),
                        "live_bytes": sum(p.length for p in live)})
    record = {
        "format_version": FORMAT_VERSION,
        "device": device.name,
        "capabilities": device.capabilities,
        "scenario_rule": device.scenario,
        "models": entries,
        "files": [{"name": n, "size": (folder / n).stat().st_size}
                  for n in sorted(files)],
    }
    atomic_write_bytes(out / BUNDLE_NAME,
                       (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return record


def assemble(package: str | os.PathLike[str], device: str,
             output: str | os.PathLike[str], *, verify: bool = True,
             progress: bool | None = False) -> dict[str, Any]:
    """Copy ``device``'s models and only the weight files they need into ``output``.

    The result loads directly in onnxruntime. With ``verify``, every live payload is
    re-hashed against its checksum. ``output`` is written as a temp folder and renamed.
    ``progress``: bars with rate and ETA for copying and verifying (None: only on a
    terminal).
    """
    from ..progress import Progress

    package, output = Path(package), Path(output)
    summary = read_summary_file(package)[1]
    record = read_bundle(package, device, summary)
    keys = {m["name"]: store_keys_of(m) for m in summary["models"]}
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.exists() and any(output.iterdir()):
        raise PackageError("output folder is not empty", folder=str(output))
    tmp: Path | None = make_temp_dir(output.parent, f".{output.name}.")
    try:
        source = package / DEVICES / device
        for entry in record["models"]:
            shutil.copyfile(source / entry["file"], tmp / entry["file"])
        with Progress("copying", sum(f["size"] for f in record["files"]),
                      enabled=progress) as bar:
            for f in record["files"]:
                _copy_file(package / f["name"], tmp / f["name"], f["size"])
                bar.advance(f["size"])
        if verify:
            resolved = [(entry, variant_of(tmp / entry["file"], entry["scenario"],
                                           final=True, store_keys=keys.get(entry["name"])))
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


def _copy_file(src: Path, dst: Path, size: int) -> None:
    try:
        actual = src.stat().st_size
    except FileNotFoundError:
        raise PackageError("a weight file the device needs is missing",
                           file=src.name, package=str(src.parent)) from None
    if actual != size:
        raise PackageError("a weight file the device needs has another size than recorded",
                           file=src.name, size=actual, expected=size)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        copy_range(fin.fileno(), 0, fout.fileno(), 0, size)
        os.fsync(fout.fileno())


def check_live(model_path: Path, scenario: str | None, *, verify: bool,
               store_keys: Mapping[tuple[str, int], str] | None = None) -> list[str]:
    """Problems with the files a device model (a resolved variant: ``scenario`` names it
    in messages) needs; the first one raises (see
    :func:`weightstore.resolve.files.file_problems`). ``verify`` re-hashes the live
    payloads against ``store_keys`` (its package summary's) or the digests the model
    itself declares (an earlier version's package)."""
    variant = variant_of(model_path, scenario, final=True, store_keys=store_keys)
    return file_problems(model_path.parent, variant.external, scenario, verify=verify,
                         strict=True)
