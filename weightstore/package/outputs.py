"""Where a command may write: never over a file the input model is read from.

A model is read from its own file, the external data files of its tensors, and the
external files that its scenario records' added weights point at. A command writing a
model, a data file or a variant must not replace any of them (the input would be lost or
silently changed), and a model whose weights sit beside it cannot move to another folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConversionError, PackageError

if TYPE_CHECKING:  # build checks its output folder before anything imports onnx
    import onnx


def files_read(src: Path, metadata: onnx.ModelProto, data_files: Iterable[Path]) -> set[Path]:
    """Every file reading ``src`` (whose metadata model is given) may open."""
    from ..catalogue.locations import resolve_location

    out = {src.resolve(), *(Path(p).resolve() for p in data_files)}
    for location in scenario_locations(metadata):
        out.add(resolve_location(src.resolve().parent, location, where="scenario weights"))
    return out


def scenario_locations(model: onnx.ModelProto) -> set[str]:
    """External locations used by the scenarios' added weights (relative to the model)."""
    from ..scenarios.storage import read_scenarios

    return {e.value for s in read_scenarios(model) for r in s.rewrites
            for t in r.added_initializers for e in t.external_data if e.key == "location"}


def check_outputs(src: Path, inputs: set[Path], outputs: Iterable[Path], *,
                  keeps_folder: bool = False) -> None:
    """Refuse outputs that would overwrite an input file, or leave the input's folder when
    ``keeps_folder`` (the model's weights are files beside it)."""
    for out in outputs:
        out = Path(out)
        if "\0" in str(out):
            raise ConversionError("output path contains a NUL byte", output=repr(str(out)))
        if not out.parent.is_dir():
            raise ConversionError("output folder does not exist", folder=str(out.parent))
        if os.path.lexists(out) and not out.is_file():
            raise ConversionError("output path exists and is not a regular file",
                                  output=str(out))
        if out.resolve() in inputs:
            raise ConversionError("output would overwrite a file the input model reads",
                                  input=str(src), output=str(out))
        if keeps_folder and out.resolve().parent != src.resolve().parent:
            raise ConversionError("the model's weights are files beside it; write the output "
                                  "in the same folder", input=str(src), output=str(out))


def check_output_folder(folder: Path) -> None:
    """Can ``folder`` (which may not exist yet) be created and written? Checked before a
    build touches the store, so a bad output path costs nothing and loses nothing."""
    text = str(folder)
    if "\0" in text:
        raise PackageError("output path contains a NUL byte", folder=repr(text))
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise PackageError("output path runs through something that is not a folder",
                           folder=text, blocked_by=str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PackageError("output folder is not writable", folder=text,
                           not_writable=str(existing))
