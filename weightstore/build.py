"""``weightstore build``: recipe -> catalogue -> store -> packages, end to end.

Order matters for users' data: everything that can be refused (recipe, models, store path,
existing output) is checked before the store or the output folder is touched; packages are
written into a temp folder and renamed into place only when complete.

Package tree (one folder per layout)::

    <output>/<package>/<version>/<layout>/
        <model>.onnx                 one per model, external data relative to this folder
        weight_<hex>                 separate layout: one file per distinct payload
        <model>_weight_combined      combined layout: payloads at aligned offsets
        summary.json                 ExternalWeightDesc list, totals, fingerprint
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalogue.payload import expected_nbytes
from .convert.placement import Placement
from .convert.weights import ModelWeights, Weight
from .errors import PackageError, StoreError
from .fingerprint import file_digest, layout_fingerprint
from .fsio import publish_dir
from .layout.plan import LayoutPlan, PlannedFile, plan_layout
from .layout.writer import FileRange, write_plan
from .model_io import save_model
from .progress import Progress
from .recipe import Layout, LoadedRecipe, load_recipe
from .store import PayloadSource, WeightStore, resolve_store_path
from .summary import (
    SUMMARY_NAME,
    ExternalWeightDesc,
    ModelSummary,
    dtype_name,
    package_summary,
    render,
)


@dataclass(frozen=True)
class BuildOptions:
    store: str | None = None  # --store flag; highest priority
    jobs: int = min(8, os.cpu_count() or 4)
    force: bool = False  # rebuild and replace packages, even up-to-date or different ones
    progress: bool | None = None  # None: only on an interactive terminal


@dataclass
class PackageResult:
    layout: str
    path: Path
    status: str  # "built" | "up-to-date"
    summary: dict[str, Any]


@dataclass
class BuildResult:
    store: Path
    packages: list[PackageResult] = field(default_factory=list)
    store_report: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "store_report": self.store_report,
            "packages": [{"layout": p.layout, "path": str(p.path), "status": p.status,
                          "summary": p.summary} for p in self.packages],
        }


@dataclass
class _Source:
    """One recipe model, catalogued, with the digests of its source files."""

    name: str
    weights: ModelWeights
    identity: dict[str, Any]


class _WeightPayload:
    """A catalogued weight handed to the store (PayloadSource)."""

    def __init__(self, mw: ModelWeights, weight: Weight) -> None:
        self._mw = mw
        self._w = weight
        self.key = weight.key
        self.size = weight.size

    def read(self) -> bytes:
        return self._mw.read(self._w)

    def file_range(self) -> tuple[str, int] | None:
        p = self._w.payload
        return (str(p.file), p.offset) if p.encoding == "raw" else None


def build(recipe_path: str | os.PathLike[str], options: BuildOptions | None = None,
          ) -> BuildResult:
    options = options or BuildOptions()
    loaded = load_recipe(recipe_path)
    recipe = loaded.recipe
    store_root = resolve_store_path(options.store, loaded.store_path())
    if store_root.exists() and not store_root.is_dir():
        raise StoreError("store path exists and is not a folder", path=str(store_root))
    result = BuildResult(store_root)
    sources = _open_sources(loaded)
    try:
        pending: list[tuple[Layout, Path, str]] = []
        for layout in recipe.layouts:
            target = loaded.output_dir() / recipe.package / recipe.version / layout.name
            fp = layout_fingerprint(package=recipe.package, version=recipe.version,
                                    hash_algo=recipe.store.hash, layout=layout,
                                    models=[s.identity for s in sources])
            existing = _existing_summary(target, fp, options.force)
            if existing is not None:
                result.packages.append(PackageResult(layout.name, target, "up-to-date",
                                                     existing))
            else:
                pending.append((layout, target, fp))
        if not pending:
            return result
        store = WeightStore(store_root)
        _fill_store(store, sources, [layout for layout, _, _ in pending], recipe.store.hash,
                    options, result)
        for layout, target, fp in pending:
            summary = _write_package(loaded, layout, target, fp, sources, store, options)
            result.packages.append(PackageResult(layout.name, target, "built", summary))
        order = {layout.name: i for i, layout in enumerate(recipe.layouts)}
        result.packages.sort(key=lambda p: order[p.layout])
        return result
    finally:
        for s in sources:
            s.weights.close()


def _open_sources(loaded: LoadedRecipe) -> list[_Source]:
    sources: list[_Source] = []
    try:
        for entry in loaded.recipe.models:
            mw = ModelWeights.open(loaded.model_source(entry))
            sources.append(_Source(entry.name, mw, {}))
            externals = sorted({(d.location, d.file) for d in mw.descriptors.values()
                                if d.location is not None})
            sources[-1].identity = {
                "name": entry.name,
                "source_digest": file_digest(mw.catalogue.source),
                "external": {loc: file_digest(path) for loc, path in externals},
            }
    except BaseException:
        for s in sources:
            s.weights.close()
        raise
    return sources


def _existing_summary(target: Path, fingerprint: str, force: bool) -> dict[str, Any] | None:
    """The summary of an intact package built from the same inputs, else None.

    A folder holding anything else is refused; ``force`` rebuilds and replaces whatever
    is there.
    """
    if force or not target.exists():
        return None
    summary_path = target / SUMMARY_NAME
    try:
        summary = json.loads(summary_path.read_text())
        same = summary.get("fingerprint") == fingerprint
    except (OSError, ValueError, AttributeError):
        summary, same = None, False
    if same and _intact(target, summary):
        return summary
    what = "a different build" if summary is not None else "something that is not a package"
    raise PackageError(f"output folder already holds {what}; pass --force to replace it",
                       folder=str(target))


def _intact(target: Path, summary: dict[str, Any]) -> bool:
    try:
        expected = [(m["file"], m["model_bytes"]) for m in summary["models"]]
        expected += [(f["name"], f["size"]) for f in summary["files"]]
        return all((target / name).stat().st_size == size for name, size in expected)
    except (OSError, KeyError, TypeError):
        return False


def _fill_store(store: WeightStore, sources: list[_Source], layouts: list[Layout], algo: str,
                options: BuildOptions, result: BuildResult) -> None:
    """Hash every payload some layout externalizes and put it into the store once."""
    combined = any(layout.external_weight == "combined" for layout in layouts)
    per_model: list[tuple[_Source, list[Weight]]] = []
    total = 0
    for s in sources:
        chosen: dict[Any, Weight] = {}
        for layout in layouts:
            for w in s.weights.select(layout.size_threshold, layout.constants):
                chosen.setdefault(w.site.path, w)
        ordered = [w for site in s.weights.sites if (w := chosen.get(site.path))]
        per_model.append((s, ordered))
        total += sum(w.size for w in ordered)
    report = {"written_objects": 0, "written_bytes": 0, "reused_objects": 0,
              "reused_bytes": 0, "padding_bytes": 0}
    with Progress("hashing", total, enabled=options.progress) as bar:
        hashed = [(s, s.weights.hash(ws, algo, options.jobs, bar.advance))
                  for s, ws in per_model]
    with Progress("storing", total, enabled=options.progress) as bar:
        for s, ws in hashed:
            payloads: list[PayloadSource] = [_WeightPayload(s.weights, w) for w in ws]
            put = store.put(payloads, kind="combined" if combined else "separate",
                            combined_name=s.name if combined else None,
                            alignment=max((lay.alignment for lay in layouts), default=512),
                            jobs=options.jobs)
            for k, v in put.to_dict().items():
                report[k] += v
            bar.advance(sum(w.size for w in ws))
    result.store_report = report


def _layout_plan(layout: Layout, per_model: list[tuple[_Source, list[Weight]]]) -> tuple[
        LayoutPlan, dict[str, dict[str, Any]]]:
    """One plan for the whole package folder, and each model's key -> placement map."""
    mode = layout.external_weight
    if mode == "separate":
        everything = [(w.key, w.size) for _, ws in per_model for w in ws]
        plan = plan_layout("", everything, mode, layout.alignment)
        where = plan.placement()
        return plan, {s.name: where for s, _ in per_model}
    files: list[PlannedFile] = []
    maps: dict[str, dict[str, Any]] = {}
    for s, ws in per_model:
        plan = plan_layout(s.name, [(w.key, w.size) for w in ws], mode, layout.alignment)
        files.extend(plan.files)
        maps[s.name] = plan.placement()
    return LayoutPlan(mode, layout.alignment, tuple(files)), maps


def _write_package(loaded: LoadedRecipe, layout: Layout, target: Path, fingerprint: str,
                   sources: list[_Source], store: WeightStore, options: BuildOptions,
                   ) -> dict[str, Any]:
    recipe = loaded.recipe
    per_model = []
    for s in sources:
        if layout.external_weight == "embedded":
            per_model.append((s, []))
        else:
            ws = s.weights.select(layout.size_threshold, layout.constants)
            per_model.append((s, s.weights.hash(ws, recipe.store.hash, options.jobs)))
    plan, maps = _layout_plan(layout, per_model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{layout.name}.", suffix=".tmp", dir=target.parent))
    try:
        def locate(key: str) -> FileRange:
            obj = store.lookup(key)
            if obj is None:
                raise StoreError("payload vanished from the store", key=key,
                                 store=str(store.root))
            return FileRange(store.path_of(obj), obj.offset)

        total = sum(f.size for f in plan.files)
        with Progress(f"packaging {layout.name}", total, enabled=options.progress) as bar:
            write_plan(plan, tmp, locate, jobs=options.jobs, progress=bar.advance)
        summaries = [_write_model(tmp, s, ws, maps[s.name], layout) for s, ws in per_model]
        summary = package_summary(package=recipe.package, version=recipe.version,
                                  layout=layout, hash_algo=recipe.store.hash,
                                  fingerprint=fingerprint, models=summaries, plan=plan)
        (tmp / SUMMARY_NAME).write_bytes(render(summary))
        for f in tmp.iterdir():
            _fsync_file(f)
        publish_dir(tmp, target)
        tmp = None
        return summary
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_model(folder: Path, source: _Source, weights: list[Weight],
                 where: dict[str, Any], layout: Layout) -> ModelSummary:
    placements = {
        w.site.path: Placement(where[w.key].file, where[w.key].offset, w.size, w.key)
        for w in weights
    }
    model = source.weights.materialize(placements, layout.constants)
    file_name = f"{source.name}.onnx"
    size = save_model(model, folder / file_name)
    inline = [d for p, d in source.weights.descriptors.items() if p not in placements]
    external = tuple(
        ExternalWeightDesc(
            id=w.key, name=w.site.value_name, where=w.site.where,
            location=placements[w.site.path].location,
            offset=placements[w.site.path].offset, size=w.size,
            dtype=dtype_name(w.site.tensor.data_type), shape=tuple(w.site.tensor.dims))
        for w in weights)
    return ModelSummary(
        name=source.name, file=file_name, model_bytes=size,
        source_digest=source.identity["source_digest"],
        inline_tensors=len(inline),
        inline_bytes=sum(expected_nbytes(d.data_type, d.dims) or d.length for d in inline),
        external=external)


__all__ = ["BuildOptions", "BuildResult", "PackageResult", "build"]
