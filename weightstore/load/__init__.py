"""Loading a resolved model: exactly its manifest's payloads, verified, into onnxruntime.

The package is callable: ``weightstore.load(resolved)`` is :func:`.ready.load`. Its
names load on first use, so the command line's parsers (:mod:`.commands`) import neither
numpy nor onnx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports, make_callable

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "CHUNK": ("plan", "CHUNK"), "ReadPlan": ("plan", "ReadPlan"),
    "plan_reads": ("plan", "plan_reads"), "WEIGHTS": ("manager", "WEIGHTS"),
    "WeightManager": ("manager", "WeightManager"), "FileReader": ("reader", "FileReader"),
    "Reader": ("reader", "Reader"), "RecordingReader": ("reader", "RecordingReader"),
    "LoadReport": ("runtime", "LoadReport"), "load": ("ready", "load"),
}
__all__ = ["CHUNK", "WEIGHTS", "FileReader", "LoadReport", "ReadPlan", "Reader",
           "RecordingReader", "WeightManager", "load", "plan_reads"]

if TYPE_CHECKING:
    from .manager import WEIGHTS, WeightManager
    from .plan import CHUNK, ReadPlan, plan_reads
    from .reader import FileReader, Reader, RecordingReader
    from .ready import load
    from .runtime import LoadReport

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
make_callable(__name__, "load")
