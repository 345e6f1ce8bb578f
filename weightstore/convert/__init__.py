"""Conversions between inline, ONNX external-data and GE FileConstant forms.

``convert_to_external`` and ``convert_to_inline`` load on first use (PEP 562): the build
imports this package's building blocks without the command-line conversions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["ConvertReport", "convert_to_external", "convert_to_inline"]

if TYPE_CHECKING:
    from .api import ConvertReport, convert_to_external, convert_to_inline


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".api", __name__), name)
    globals()[name] = value
    return value
