"""weightstore: a declarative build tool with a content-addressed weight store for ONNX models."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
