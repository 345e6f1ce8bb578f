"""``weightstore check``: can this package (or one scenario, or one device) load?

The seed's post-replay validation, in order: parse metadata and verify the selected
scenario; replay it without reading payloads; clean up and compute liveness; collect the
live payloads' descriptors; only then look at the files holding them. A missing file that
only other scenarios (or only dead weights) use is irrelevant; file existence is never
checked globally before replay.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalogue.locations import resolve_location
from ..errors import ExternalDataError, IntegrityError, PackageError, ScenarioError
from ..hashing import ALGORITHMS, digest_file
from ..scenarios.resolve import LivePayload, live_payloads, variant
from ..scenarios.storage import read_scenarios
from ..scenarios.variants import metadata_of
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


def check_files(folder: Path, live: list[LivePayload], scenario: str | None, *,
                verify: bool, strict: bool, model: str | None = None) -> list[str]:
    """Problems with the files holding ``live`` payloads (empty when all is well).

    With ``strict`` the first problem raises instead, naming the scenario, the
    initializer and the expected location.
    """
    problems: list[str] = []
    sizes: dict[str, int | None] = {}
    for p in live:
        context = {"model": model, "scenario": scenario or "(default)",
                   "initializer": p.name, "location": p.location}
        try:
            path = resolve_location(folder, p.location, where=p.where)
            if p.location not in sizes:
                sizes[p.location] = path.stat().st_size if path.is_file() else None
            size = sizes[p.location]
            if size is None:
                raise ExternalDataError("live weight's file is missing or unreadable",
                                        **context)
            if p.offset + p.length > size:
                raise ExternalDataError("live weight's byte range lies outside its file",
                                        offset=p.offset, length=p.length, file_size=size,
                                        **context)
            if verify:
                algo, _, expected = (p.checksum or "").partition(":")
                if algo not in ALGORITHMS:
                    raise IntegrityError("live weight has no checksum this tool can verify",
                                         checksum=p.checksum, **context)
                if digest_file(algo, path, p.offset, p.length) != expected:
                    raise IntegrityError("live weight's bytes do not match their checksum",
                                         checksum=p.checksum, **context)
        except (ExternalDataError, IntegrityError) as exc:
            if strict:
                raise
            problems.append(str(exc))
    return problems


def check_package(package: str | os.PathLike[str], *, scenario: str | None = None,
                  device: str | None = None, verify: bool = False) -> CheckReport:
    """Resolve every model of a package folder for a scenario or device, then check the
    files its live weights need."""
    if scenario is not None and device is not None:
        raise ScenarioError("choose a scenario or a device, not both")
    folder = Path(package)
    try:
        summary = json.loads((folder / SUMMARY_NAME).read_text())
        models = [m["file"] for m in summary["models"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise PackageError("not a package folder (no readable summary.json)",
                           folder=str(folder)) from None
    chosen: dict[str, str | None] = {}
    if device is not None:
        bundle = read_bundle(folder, device)
        chosen = {f"{m['name']}.onnx": m["scenario"] for m in bundle["models"]}
    report = CheckReport(str(folder), scenario, device)
    metadata = []
    for file in models:
        metadata.append((file, metadata_of(folder / file)))
    if scenario is not None and not any(
            any(s.scenario == scenario for s in read_scenarios(m)) for _, m in metadata):
        raise ScenarioError("unknown scenario", scenario=scenario, package=str(folder))
    # every selection, replay and liveness first; files only after all of them
    resolved = []
    for file, model in metadata:
        names = {s.scenario for s in read_scenarios(model)}
        selected = chosen.get(file) if device is not None else (
            scenario if scenario in names else None)
        live: list[LivePayload] = []
        problems: list[str] = []
        try:
            live = live_payloads(variant(model, selected), selected)
        except ScenarioError as exc:
            if "eligible payload" not in exc.message:
                raise
            exc.context.setdefault("model", file)
            problems.append(str(exc))
        resolved.append((file, selected, live, problems))
    for file, selected, live, problems in resolved:
        problems += check_files(folder, live, selected, verify=verify, strict=False,
                                model=file)
        report.problems.extend(problems)
        report.models.append({"file": file, "scenario": selected, "live_weights": len(live),
                              "live_bytes": sum(p.length for p in live),
                              "files": sorted({p.location for p in live}),
                              "problems": len(problems)})
    return report
