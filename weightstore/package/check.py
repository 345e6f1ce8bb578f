"""``weightstore check``: can this package (or one scenario, or one device) load?

The seed's post-replay validation, in order: parse metadata and verify the selected
scenario; replay it without reading payloads; clean up, analyse constant results and
compute liveness; collect the live payloads' manifest entries; only then look at the files
holding them. Liveness is :func:`weightstore.resolve.variant.resolve_variant`'s, the same
phases a load resolves with, so a weight only a dead ``If`` branch uses is not required. A
missing file that only other scenarios (or only dead weights) use is irrelevant; file
existence is never checked globally before replay.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ..catalogue.locations import resolve_location
from ..errors import (
    ExternalDataError,
    IntegrityError,
    PackageError,
    ResolutionError,
    ScenarioError,
    WeightstoreError,
)
from ..fsio import parse_json
from ..hashing import ALGORITHMS, digest_file
from ..resolve.manifest import ManifestEntry
from ..resolve.source import ModelSource, open_source
from ..resolve.variant import Variant, resolve_variant
from ..scenarios.storage import read_scenarios
from .bundle_record import read_bundle
from .summary import SUMMARY_NAME


@dataclass
class CheckReport:
    package: str
    scenario: str | None
    device: str | None
    models: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"package": self.package, "scenario": self.scenario, "device": self.device,
                "ok": self.ok, "models": self.models, "problems": self.problems}


def file_problems(folder: Path, entries: Sequence[ManifestEntry], scenario: str | None, *,
                  verify: bool, strict: bool, model: str | None = None,
                  progress: Callable[[int], None] | None = None) -> list[str]:
    """Problems with the files holding ``entries``' payloads (empty when all is well).

    Sizes and ranges are checked; with ``verify`` the bytes are re-hashed against their
    checksums too (``progress`` is told each entry's length). With ``strict`` the first
    problem raises instead, naming the scenario, the initializer and the location.
    """
    problems: list[str] = []
    sizes: dict[str, int | None] = {}
    for e in entries:
        s = e.source
        if not s.file:
            continue  # inline in the model file, which was just read
        context = {"model": model, "scenario": scenario or "(default)",
                   "initializer": e.values[0], "location": s.file}
        try:
            path = resolve_location(folder, s.file, where=e.values[0])
            if s.file not in sizes:
                sizes[s.file] = path.stat().st_size if path.is_file() else None
            size = sizes[s.file]
            if size is None:
                raise ExternalDataError("live weight's file is missing or unreadable",
                                        **context)
            if s.offset + s.length > size:
                raise ExternalDataError("live weight's byte range lies outside its file",
                                        offset=s.offset, length=s.length, file_size=size,
                                        **context)
            if verify:
                algo, _, expected = (s.checksum or "").partition(":")
                if algo not in ALGORITHMS:
                    raise IntegrityError("live weight has no checksum this tool can verify",
                                         checksum=s.checksum, **context)
                if digest_file(algo, path, s.offset, s.length) != expected:
                    raise IntegrityError("live weight's bytes do not match their checksum",
                                         checksum=s.checksum, **context)
                if progress is not None:
                    progress(s.length)
        except (ExternalDataError, IntegrityError) as exc:
            if strict:
                raise
            problems.append(str(exc))
    return problems


def variant_of(model_path: Path, scenario: str | None) -> Variant:
    """Resolve ``scenario`` of the model file at ``model_path`` from its metadata (no
    payload read), the file closed afterwards."""
    with contextlib.closing(open_source(model_path)) as source:
        return resolve_variant(source, scenario)


def check_package(package: str | os.PathLike[str], *, scenario: str | None = None,
                  device: str | None = None, verify: bool = False,
                  progress: bool | None = False) -> CheckReport:
    """Resolve every model of a package folder for a scenario or device, then check the
    files its live weights need. ``progress``: with ``verify``, a bar over the bytes to
    re-hash (None: only on an interactive terminal)."""
    from ..progress import Progress

    if scenario is not None and device is not None:
        raise ScenarioError("choose a scenario or a device, not both")
    folder = Path(package)
    try:
        summary = parse_json((folder / SUMMARY_NAME).read_text())
        models = [(str(m["name"]), str(m["file"])) for m in summary["models"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise PackageError("not a package folder (no readable summary.json)",
                           folder=str(folder)) from None
    chosen: dict[str, str | None] = {}
    if device is not None:
        bundle = read_bundle(folder, device)
        chosen = {str(m["file"]): m["scenario"] for m in bundle["models"]}
    report = CheckReport(str(folder), scenario, device)
    with contextlib.ExitStack() as opened:  # each model file opened once
        sources = {file: opened.enter_context(contextlib.closing(
            open_source(folder, model=name))) for name, file in models}
        metadata = {file: source.metadata() for file, source in sources.items()}
        held = {file: {s.scenario for s in read_scenarios(meta)}
                for file, meta in metadata.items()}
        if scenario is not None and not any(scenario in names for names in held.values()):
            raise ScenarioError("unknown scenario", scenario=scenario, package=str(folder))
        # every selection, replay and liveness first; files only after all of them
        resolved = []
        for file, source in sources.items():
            selected = chosen.get(file) if device is not None else (
                scenario if scenario in held[file] else None)
            resolved.append((file, selected,
                             *_live_entries(source, metadata[file], file, selected)))
    total = sum(e.source.length for _, _, entries, _ in resolved for e in entries)
    with Progress("verifying", total, enabled=progress if verify else False) as bar:
        for file, selected, entries, problems in resolved:
            problems += file_problems(folder, entries, selected, verify=verify,
                                      strict=False, model=file, progress=bar.advance)
            report.problems.extend(problems)
            report.models.append({"file": file, "scenario": selected,
                                  "live_weights": sum(len(e.values) for e in entries),
                                  "live_bytes": sum(e.source.length for e in entries),
                                  "files": sorted({e.source.file for e in entries}),
                                  "problems": len(problems)})
    return report


def _live_entries(source: ModelSource, meta: onnx.ModelProto, file: str,
                  scenario: str | None) -> tuple[Sequence[ManifestEntry], list[str]]:
    """The external entries a model needs for ``scenario``; a live weight without an
    eligible payload is a problem to report, not an error."""
    try:
        return resolve_variant(source, scenario, model=meta).external, []
    except ResolutionError as exc:
        if "eligible payload" not in exc.message:
            raise
        return (), [str(_without_phase(exc, file))]


def _without_phase(exc: WeightstoreError, model: str) -> WeightstoreError:
    """A resolution error as a check reports it: the model named, the phase left out."""
    context = {"scenario": exc.context.get("scenario") or "(default)"}
    context.update((k, v) for k, v in exc.context.items() if k not in ("phase", "scenario"))
    context.setdefault("model", model)
    return ScenarioError(exc.message, **context)
