"""Resolution before load: the final graph, kernels, prepared objects and the exact payload
set of a model, decided from metadata alone and frozen (the seed's ResolveModel).

Names are imported on first use, so the command line can register its parsers without
loading the resolution machinery. The package is also callable: ``weightstore.resolve(...)``
is :func:`.api.resolve` (a package attribute of the same name would be replaced by this
subpackage as soon as it is imported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports, make_callable

_EXPORTS = {
    "ScenarioSelectionContext": "api", "ScenarioSelector": "api", "resolve": "api",
    "ConstantResults": "constants", "ValueKind": "constants", "analyze": "constants",
    "PreparedRequirement": "prepared",
    "Derivation": "manifest", "ManifestEntry": "manifest", "PayloadSource": "manifest",
    "RequiredPayloadManifest": "manifest",
    "ResolvedModel": "model",
    "PhaseReport": "model", "TransformationReport": "model",
    "PreparedBinding": "prepared", "PreparedKey": "prepared", "PreparedOptions": "prepared",
    "StoreReference": "reference",
}

__all__ = [
    "ConstantResults", "Derivation", "ManifestEntry", "PayloadSource", "PhaseReport",
    "PreparedBinding", "PreparedKey", "PreparedOptions", "PreparedRequirement",
    "RequiredPayloadManifest", "ResolvedModel", "ScenarioSelectionContext",
    "ScenarioSelector", "StoreReference", "TransformationReport", "ValueKind", "analyze",
    "resolve",
]

if TYPE_CHECKING:
    from .api import ScenarioSelectionContext, ScenarioSelector, resolve
    from .constants import ConstantResults, ValueKind, analyze
    from .manifest import Derivation, ManifestEntry, PayloadSource, RequiredPayloadManifest
    from .model import PhaseReport, ResolvedModel, TransformationReport
    from .prepared import PreparedBinding, PreparedKey, PreparedOptions, PreparedRequirement
    from .reference import StoreReference


__getattr__, __dir__ = lazy_exports(
    __name__, {name: (module, name) for name, module in _EXPORTS.items()}, __all__)
make_callable(__name__, "resolve")
