"""Conversions between inline, ONNX external-data and GE FileConstant forms."""

from __future__ import annotations

from .api import ConvertReport, convert_to_external, convert_to_inline

__all__ = ["ConvertReport", "convert_to_external", "convert_to_inline"]
