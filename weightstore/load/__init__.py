"""Loading a resolved model: exactly its manifest's payloads, verified, into onnxruntime.

The package is callable: ``weightstore.load(resolved)`` is :func:`.session.load`.
"""

from __future__ import annotations

from ..lazy import make_callable
from .manager import WEIGHTS, WeightManager
from .plan import CHUNK, ReadPlan, plan_reads
from .reader import FileReader, Reader, RecordingReader
from .session import LoadReport, load

__all__ = ["CHUNK", "WEIGHTS", "FileReader", "LoadReport", "ReadPlan", "Reader",
           "RecordingReader", "WeightManager", "load", "plan_reads"]


make_callable(__name__, "load")
