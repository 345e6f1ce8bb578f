"""Resolution before load: the final graph, kernels, prepared objects and the exact payload
set of a model, decided from metadata alone and frozen (the seed's ResolveModel)."""

from __future__ import annotations

from .api import ScenarioSelectionContext, ScenarioSelector, resolve
from .constants import ConstantResults, ValueKind, analyze
from .kernels import PreparedRequirement
from .manifest import Derivation, ManifestEntry, PayloadSource, RequiredPayloadManifest
from .model import ResolvedModel
from .phases import PhaseReport, TransformationReport
from .prepared import PreparedBinding, PreparedKey, PreparedOptions

__all__ = [
    "ConstantResults", "Derivation", "ManifestEntry", "PayloadSource", "PhaseReport",
    "PreparedBinding", "PreparedKey", "PreparedOptions", "PreparedRequirement",
    "RequiredPayloadManifest", "ResolvedModel", "ScenarioSelectionContext",
    "ScenarioSelector", "TransformationReport", "ValueKind", "analyze", "resolve",
]
