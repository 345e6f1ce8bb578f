"""Where a command may write: never over a file the input model is read from.

A model is read from its own file, the external data files of its tensors, and the
external files that its scenario records' added weights point at. A command writing a
model, a data file or a variant must not replace any of them (the input would be lost or
silently changed), and a model whose weights sit beside it cannot move to another folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx

from .catalogue.locations import resolve_location
from .errors import ConversionError
from .scenarios.storage import read_scenarios


def files_read(src: Path, metadata: onnx.ModelProto, data_files: Iterable[Path]) -> set[Path]:
    """Every file reading ``src`` (whose metadata model is given) may open."""
    out = {src.resolve(), *(Path(p).resolve() for p in data_files)}
    for location in scenario_locations(metadata):
        out.add(resolve_location(src.resolve().parent, location, where="scenario weights"))
    return out


def scenario_locations(model: onnx.ModelProto) -> set[str]:
    """External locations used by the scenarios' added weights (relative to the model)."""
    return {e.value for s in read_scenarios(model) for r in s.rewrites
            for t in r.added_initializers for e in t.external_data if e.key == "location"}


def check_outputs(src: Path, inputs: set[Path], outputs: Iterable[Path], *,
                  keeps_folder: bool = False) -> None:
    """Refuse outputs that would overwrite an input file, or leave the input's folder when
    ``keeps_folder`` (the model's weights are files beside it)."""
    for out in outputs:
        out = Path(out)
        if not out.parent.is_dir():
            raise ConversionError("output folder does not exist", folder=str(out.parent))
        if out.resolve() in inputs:
            raise ConversionError("output would overwrite a file the input model reads",
                                  input=str(src), output=str(out))
        if keeps_folder and out.resolve().parent != src.resolve().parent:
            raise ConversionError("the model's weights are files beside it; write the output "
                                  "in the same folder", input=str(src), output=str(out))
