"""Conversions between inline, ONNX external-data and GE FileConstant forms.

``convert_to_external`` and ``convert_to_inline`` load on first use (PEP 562): the build
imports this package's building blocks without the command-line conversions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["ConvertReport", "convert_to_external", "convert_to_inline"]

if TYPE_CHECKING:
    from .api import ConvertReport, convert_to_external, convert_to_inline


__getattr__, __dir__ = lazy_exports(__name__, {name: ("api", name) for name in __all__},
                                     __all__)
