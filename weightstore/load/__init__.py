"""Loading a resolved model: exactly its manifest's payloads, verified, into onnxruntime.

The package is callable: ``weightstore.load(resolved)`` is :func:`.session.load`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .manager import WEIGHTS, WeightManager
from .plan import CHUNK, ReadPlan, plan_reads
from .reader import FileReader, Reader, RecordingReader
from .session import LoadReport, load

__all__ = ["CHUNK", "WEIGHTS", "FileReader", "LoadReport", "ReadPlan", "Reader",
           "RecordingReader", "WeightManager", "load", "plan_reads"]


class _Callable(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return load(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
