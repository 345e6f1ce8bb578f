"""``weightstore convert``: one model in, one model (plus one aligned data file) out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..catalogue.descriptors import weight_descriptors
from ..catalogue.payload import SMALL_VALUE_LIMIT
from ..catalogue.reader import read_catalogue
from ..errors import ConversionError
from ..layout.plan import plan_layout
from ..layout.writer import FileRange, write_plan
from ..model_io import save_model
from ..outputs import check_outputs, files_read, scenario_locations
from ..scenarios.api import rebase_scenarios
from ..scenarios.storage import read_scenarios
from ..scenarios.variants import metadata_of
from ..store.layout import combined_file_name
from .inline import inline_model
from .placement import Placement
from .weights import ModelWeights, Weight


@dataclass(frozen=True)
class ConvertReport:
    output: Path
    data_file: Path | None
    external_tensors: int
    unique_payloads: int
    payload_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "output": str(self.output),
            "data_file": str(self.data_file) if self.data_file else None,
            "external_tensors": self.external_tensors,
            "unique_payloads": self.unique_payloads,
            "payload_bytes": self.payload_bytes,
        }


def _check_scenarios(model: onnx.ModelProto, src: Path, dst: Path, form: str) -> None:
    """Scenarios survive a change of form, not a change of graph or of folder."""
    if not read_scenarios(model):
        return
    if form == "file-constant":
        raise ConversionError("the model has modification scenarios; FileConstant nodes "
                              "would change the graph their records refer to", file=str(src))
    if scenario_locations(model) and dst.resolve().parent != src.resolve().parent:
        raise ConversionError("scenario weights are external files beside the model; "
                              "convert it within its folder", file=str(src))


def convert_to_external(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                        form: str = "external-data", threshold: int = 1024,
                        algo: str = "blake3", alignment: int = 512,
                        jobs: int = 4) -> ConvertReport:
    """Move payloads of at least ``threshold`` bytes into ``<dst stem>_weight_combined``."""
    src, dst = Path(src), Path(dst)
    with ModelWeights.open(src) as mw:
        data_file = dst.parent / combined_file_name(dst.stem)
        source_meta = mw.metadata_model(SMALL_VALUE_LIMIT)
        inputs = files_read(src, source_meta, {d.file for d in mw.descriptors.values()})
        check_outputs(src, inputs, [dst, data_file])
        _check_scenarios(source_meta, src, dst, form)
        weights = mw.hash(mw.select(threshold, form), algo, jobs)
        plan = plan_layout(dst.stem, [(w.key, w.size) for w in weights], "combined",
                           alignment)
        by_key: dict[str, Weight] = {}
        for w in weights:
            by_key.setdefault(w.key, w)

        def locate(key: str) -> FileRange | bytes:
            w = by_key[key]
            if w.payload.encoding == "raw":
                return FileRange(w.payload.file, w.payload.offset)
            return mw.read(w)

        write_plan(plan, dst.parent, locate, jobs=jobs)
        where = plan.placement()
        placements = {
            w.site.path: Placement(where[w.key].file, where[w.key].offset, w.size, w.key)
            for w in weights
        }
        model = mw.materialize(placements, form)
        rebase_scenarios(source_meta, model)
        save_model(model, dst)
    data = dst.parent / plan.files[0].name if plan.files else None
    return ConvertReport(dst, data, len(weights), len(by_key),
                         sum(p.size for p in where.values()))


def convert_to_inline(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> ConvertReport:
    """Bring every external payload and FileConstant back into the model, verified."""
    src, dst = Path(src), Path(dst)
    with read_catalogue(src) as catalogue:
        files = {w.payload.file for w in weight_descriptors(catalogue) if w.payload}
        source_meta = metadata_of(src)
        check_outputs(src, files_read(src, source_meta, files), [dst])
        _check_scenarios(source_meta, src, dst, "inline")
        model: onnx.ModelProto = inline_model(catalogue)
        rebase_scenarios(source_meta, model)
    save_model(model, dst)
    return ConvertReport(dst, None, 0, 0, 0)
