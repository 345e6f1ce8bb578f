"""Resolution before load: the final graph, kernels, prepared objects and the exact payload
set of a model, decided from metadata alone and frozen (the seed's ResolveModel).

Names are imported on first use, so the command line can register its parsers without
loading the resolution machinery. The package is also callable: ``weightstore.resolve(...)``
is :func:`.api.resolve` (a package attribute of the same name would be replaced by this
subpackage as soon as it is imported).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ScenarioSelectionContext": "api", "ScenarioSelector": "api", "resolve": "api",
    "ConstantResults": "constants", "ValueKind": "constants", "analyze": "constants",
    "PreparedRequirement": "kernels",
    "Derivation": "manifest", "ManifestEntry": "manifest", "PayloadSource": "manifest",
    "RequiredPayloadManifest": "manifest",
    "ResolvedModel": "model",
    "PhaseReport": "phases", "TransformationReport": "phases",
    "PreparedBinding": "prepared", "PreparedKey": "prepared", "PreparedOptions": "prepared",
}

__all__ = [
    "ConstantResults", "Derivation", "ManifestEntry", "PayloadSource", "PhaseReport",
    "PreparedBinding", "PreparedKey", "PreparedOptions", "PreparedRequirement",
    "RequiredPayloadManifest", "ResolvedModel", "ScenarioSelectionContext",
    "ScenarioSelector", "TransformationReport", "ValueKind", "analyze", "resolve",
]

if TYPE_CHECKING:
    from .api import ScenarioSelectionContext, ScenarioSelector, resolve
    from .constants import ConstantResults, ValueKind, analyze
    from .kernels import PreparedRequirement
    from .manifest import Derivation, ManifestEntry, PayloadSource, RequiredPayloadManifest
    from .model import ResolvedModel
    from .phases import PhaseReport, TransformationReport
    from .prepared import PreparedBinding, PreparedKey, PreparedOptions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


class _Callable(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return __getattr__("resolve")(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
