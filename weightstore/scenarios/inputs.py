"""The files a model is read from: its own, its external data files, and the files its
scenario records' added weights point at. A command writing a model, a data file or a
variant must not replace any of them (:func:`weightstore.io.files.check_outputs`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..io.onnx_proto import ModelProto


def files_read(src: Path, metadata: ModelProto, data_files: Iterable[Path]) -> set[Path]:
    """Every file reading ``src`` (whose metadata model is given) may open."""
    from ..catalogue.locations import resolve_location

    out = {src.resolve(), *(Path(p).resolve() for p in data_files)}
    for location in scenario_locations(metadata):
        out.add(resolve_location(src.resolve().parent, location, where="scenario weights"))
    return out


def scenario_locations(model: ModelProto) -> set[str]:
    """External locations used by the scenarios' added weights (relative to the model)."""
    from .storage import read_scenarios

    return {e.value for s in read_scenarios(model) for r in s.rewrites
            for t in r.added_initializers for e in t.external_data if e.key == "location"}
