"""What the phases of a resolution share while they run (:mod:`.phases`), and what the
prepared-weight binding reads of it (:mod:`.binding`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..io.onnx_proto import ModelProto
from ..passes.base import RewritePass
from .constants import ConstantResults
from .kernels import KernelCatalogue
from .manifest import Derivation, ManifestEntry
from .prepared import PreparedBinding, PreparedOptions, PreparedRequirement
from .source import ModelSource


@dataclass
class ResolutionState:
    """What the phases share while resolving (mutable until frozen)."""

    source: ModelSource
    model: ModelProto  # the metadata model, transformed in place
    scenario: str | None
    device: str
    kernels: KernelCatalogue
    transformations: Sequence[RewritePass | str] = ()
    prepared: PreparedOptions = field(default_factory=PreparedOptions)
    derivations: dict[str, Any] = field(default_factory=dict)
    rewrites: int = 0
    constants: ConstantResults | None = None
    placement: dict[str, str] = field(default_factory=dict)
    requirements: tuple[PreparedRequirement, ...] = ()
    bindings: tuple[PreparedBinding, ...] = ()
    entries: tuple[ManifestEntry, ...] = ()
    load_derivations: tuple[Derivation, ...] = ()
    target: str | None = None  # the device name, for its prepared records
    companion: Any = None  # the prepared record whose companion graph is used
    fresh: set[str] = field(default_factory=set)  # analyses that are up to date
