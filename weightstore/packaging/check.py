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
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ResolutionError, ScenarioError, WeightstoreError
from ..io.onnx_proto import ModelProto
from ..package.bundle_record import read_bundle
from ..package.summary import read_summary_file
from ..resolve.files import file_problems
from ..resolve.manifest import ManifestEntry
from ..resolve.source import (
    ModelSource,
    device_folder_record,
    is_device_folder,
    open_source,
)
from ..resolve.variant import Variant, resolve_variant
from ..scenarios.storage import read_scenarios
from .companion_files import companion_files


@dataclass
class CheckReport:
    """The answer of :func:`check_package`: the package folder, the scenario and device it
    was checked for, what was found of each model, and the problems (``ok`` when none)."""

    package: str
    scenario: str | None
    device: str | None
    models: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # each model file's live external entries, as resolution found them (what ``models``
    # counts; the report draws their ranges), not part of ``to_dict``
    live: dict[str, tuple[ManifestEntry, ...]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """What ``check --json`` prints."""
        return {"package": self.package, "scenario": self.scenario, "device": self.device,
                "ok": self.ok, "models": self.models, "problems": self.problems}


def variant_of(model_path: Path, scenario: str | None, *, final: bool = False) -> Variant:
    """Resolve ``scenario`` of the model file at ``model_path`` from its metadata (no
    payload read), the file closed afterwards; ``final``: the file is a resolved variant
    (a device model), ``scenario`` the one it was resolved for. Its live payloads carry
    the store keys of the record beside the file
    (:func:`~weightstore.resolve.source.record_beside`), which they are verified against."""
    with contextlib.closing(open_source(model_path)) as source:
        return resolve_variant(source, scenario, final=final)


def check_package(package: str | os.PathLike[str], *, scenario: str | None = None,
                  device: str | None = None, verify: bool = False,
                  progress: bool | None = False) -> CheckReport:
    """Resolve every model of a package folder (or of a device folder, each model as the
    device's graph; or one model file: a package's, a device folder's or any other, its
    payloads' keys from the record beside it) for a scenario or device, then check the
    files its live weights need. ``progress``: with ``verify``,
    a bar over the bytes to re-hash (None: only on an interactive terminal)."""
    from ..progress import Progress

    if scenario is not None and device is not None:
        raise ScenarioError("choose a scenario or a device, not both")
    folder = Path(package)
    chosen: dict[str, str | None] = {}
    finals: dict[str, str | None] = {}  # a device folder's models: the scenario each ran
    companions: list[dict[str, Any]] = []  # what the runtime opens beside the models
    if folder.is_file():
        if device is not None:
            raise ResolutionError("a device is chosen in a package folder, not a model "
                                  "file", device=device, model=str(folder))
        folder, models = folder.parent, [(None, folder.name)]
    elif is_device_folder(folder):  # its models are the device's graphs, each final
        if scenario is not None:
            raise ScenarioError("a device folder's models are its device's graphs: there "
                                "is no scenario to choose", scenario=scenario,
                                folder=str(folder))
        record = device_folder_record(folder, device)
        models = [(None, str(m["file"])) for m in record["models"]]
        companions = record.get("companions", [])  # at the folder's root
        finals = {str(m["file"]): m.get("scenario") for m in record["models"]}
    else:
        summary = read_summary_file(folder)[1]
        models = [(m["name"], m["file"]) for m in summary["models"]]
        companions = summary.get("companions", [])
        if device is not None:
            bundle = read_bundle(folder, device, summary)
            chosen = {str(m["file"]): m["scenario"] for m in bundle["models"]}
            # the device's set, each where the package holds it (its own files under
            # devices/<device>/)
            companions = [{**c.to_dict(), "path": c.file}
                          for c in companion_files(summary, device_sets=True)
                          if c.device == device]
    report = CheckReport(str(package), scenario, device)
    with contextlib.ExitStack() as opened:  # each model file opened once
        sources = {file: opened.enter_context(contextlib.closing(
            open_source(folder / file) if name is None else open_source(folder, model=name)))
            for name, file in models}
        metadata = {file: source.metadata() for file, source in sources.items()}
        held = {file: {s.scenario for s in read_scenarios(meta)}
                for file, meta in metadata.items()}
        if scenario is not None and not any(scenario in names for names in held.values()):
            known = sorted(set().union(*held.values()))
            raise ScenarioError("unknown scenario", scenario=scenario, package=str(folder),
                                known=", ".join(known) or "none")
        # every selection, replay and liveness first; files only after all of them
        resolved = []
        for file, source in sources.items():
            if file in finals:
                selected = finals[file]
            else:
                selected = chosen.get(file) if device is not None else (
                    scenario if scenario in held[file] else None)
            resolved.append((file, selected, *_live_entries(
                source, metadata[file], file, selected, final=file in finals)))
    total = sum(e.source.length for _, _, entries, _ in resolved for e in entries)
    total += sum(int(c["size"]) for c in companions)
    with Progress("verifying", total, enabled=progress if verify else False) as bar:
        for file, selected, entries, problems in resolved:
            problems += file_problems(folder, entries, selected, verify=verify,
                                      strict=False, model=file, progress=bar.advance)
            report.problems.extend(problems)
            report.live[file] = tuple(entries)
            report.models.append({"file": file, "scenario": selected,
                                  "live_weights": sum(len(e.values) for e in entries),
                                  "live_bytes": sum(e.source.length for e in entries),
                                  "files": sorted({e.source.file for e in entries}),
                                  "problems": len(problems)})
        report.problems += companion_problems(folder, companions, verify=verify,
                                              progress=bar.advance)
    return report


def companion_problems(folder: Path, companions: Sequence[dict[str, Any]], *, verify: bool,
                       progress: Callable[[int], None] | None = None) -> list[str]:
    """What is wrong with the companion files a runtime opens beside the models: each must
    be a regular file of its size and (``verify``) of its digest."""
    from ..io.digests import digest_file, make_key

    problems = []
    for c in companions:
        path, name = folder / c["path"], c["path"]
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"companion file {name} is not a regular file")
            elif st.st_size != c["size"]:
                problems.append(f"companion file {name} has {st.st_size} bytes, the "
                                f"summary says {c['size']}")
            elif verify:
                algo = c["digest"].partition(":")[0]
                if make_key(algo, digest_file(algo, path)) != c["digest"]:
                    problems.append(f"companion file {name} differs from its digest")
                if progress is not None:
                    progress(c["size"])
        except FileNotFoundError:
            problems.append(f"companion file {name} is missing")
        except OSError as exc:
            problems.append(f"companion file {name} cannot be read: {exc.strerror or exc}")
    return problems


def _live_entries(source: ModelSource, meta: ModelProto, file: str,
                  scenario: str | None, *,
                  final: bool = False) -> tuple[Sequence[ManifestEntry], list[str]]:
    """The external entries a model needs for ``scenario`` (``final``: the model is the
    graph of ``scenario`` already, a device's); a live weight without an eligible payload
    is a problem to report, not an error."""
    try:
        return resolve_variant(source, scenario, model=meta, final=final).external, []
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
