"""weightstore: a declarative build tool with a content-addressed weight store for ONNX models.

``weightstore.resolve(...)`` and ``weightstore.load(resolved)`` are the deploy-side entry
points; both are subpackages that can be called (imported on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load", "resolve"]


def __getattr__(name: str) -> Any:
    if name in ("resolve", "load"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
