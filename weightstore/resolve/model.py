"""The frozen ResolvedModel: the final graph, its analyses and its payload manifest.

Frozen twice over: the dataclass refuses attribute assignment, and the graph is held as
serialized bytes with their digest, so no caller can change the graph the manifest was
computed for. :attr:`ResolvedModel.metadata_model` hands out a copy; the loader builds its
session from the frozen bytes and checks their digest first. The resolved model owns the
source it opened (the model file's catalogue) until :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ResolutionError

if TYPE_CHECKING:
    import onnx

    from .manifest import RequiredPayloadManifest
    from .model_source import ModelSource
    from .prepared import PreparedBinding, PreparedRequirement


@dataclass(frozen=True)
class PhaseReport:
    name: str
    seconds: float
    changed_topology: bool
    stale: tuple[str, ...] = ()  # analyses this phase made stale
    rerun_of: str | None = None  # set when this run re-ran an analysis made stale by it

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.name, "seconds": round(self.seconds, 6),
                               "changed_topology": self.changed_topology}
        if self.stale:
            out["stale"] = list(self.stale)
        if self.rerun_of:
            out["rerun_after"] = self.rerun_of
        return out


def graph_digest(data: bytes) -> str:
    """The digest of a resolved (transformed) graph's serialized bytes."""
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TransformationReport:
    """What each phase did, in order, and which analyses went stale and were re-run."""

    phases: tuple[PhaseReport, ...]
    rewrites: int  # records applied (scenario replay and transformations)

    @property
    def reruns(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.phases if p.rerun_of)

    def seconds(self, name: str) -> float:
        return sum(p.seconds for p in self.phases if p.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"rewrites": self.rewrites, "phases": [p.to_dict() for p in self.phases]}


@dataclass(frozen=True)
class ResolvedModel:
    """A model resolved from metadata alone, before any payload byte is read.

    What :func:`weightstore.resolve` returns: the transformed graph (``model_bytes``, its
    ``graph_digest``), the scenario and device it was resolved for with the device's
    capabilities, the constant-result counts, the kernel ``placement``, the prepared
    (pre-packed) weights required and bound, and the frozen ``payload_manifest``: exactly
    the live payloads a load will read, each with its file, range and checksum.
    ``to_dict()`` gives ``weightstore resolve --json``; :func:`weightstore.load` executes it.
    """

    model_bytes: bytes = field(repr=False)  # the transformed metadata model, serialized
    graph_digest: str
    selected_scenario: str | None
    device: str
    capabilities: Mapping[str, Any]
    constant_counts: Mapping[str, int]  # dynamic / constant / known value counts
    placement: Mapping[str, str]
    prepared_requirements: tuple[PreparedRequirement, ...]
    bindings: tuple[PreparedBinding, ...]
    payload_manifest: RequiredPayloadManifest
    transformations: TransformationReport
    source: ModelSource = field(repr=False, compare=False)
    prepared_graph: bytes | None = field(default=None, repr=False)  # prepared companion
    # the digest of what this resolution is a function of (:mod:`.cache`); None when it
    # has none (a model file, a selector callback, ...): loads then keep no session record
    key: str | None = field(default=None, compare=False)

    @property
    def tolerated_failures(self) -> frozenset[str]:
        """Active entries whose checksum failure falls back rather than fails: the payloads
        only a prepared companion needs (packed forms, values the runtime made); the load
        then gives the companion up for the resolved graph and its portable weights."""
        if self.prepared_graph is None:
            return frozenset()
        from .manifest import STORE_ONLY

        return frozenset(e.id for e in self.payload_manifest.active
                         if e.origin in STORE_ONLY)

    @property
    def metadata_model(self) -> onnx.ModelProto:
        """A copy of the resolved graph (payloads omitted): editing it changes nothing."""
        from ..io.onnx_proto import parse_model

        return parse_model(self.model_bytes)

    def frozen_model(self) -> onnx.ModelProto:
        """The resolved graph, after checking it is still the one the manifest is for."""
        if graph_digest(self.model_bytes) != self.graph_digest:
            raise ResolutionError("the resolved graph changed after it was frozen",
                                  scenario=self.selected_scenario or "(default)")
        from ..io.onnx_proto import parse_model

        return parse_model(self.model_bytes)

    def without_prepared(self) -> ResolvedModel:
        """This resolution with its prepared objects given up: packed and runtime-made
        entries dropped, their dormant portable fallbacks activated (what a load does when
        a packed payload fails its checksum)."""
        from dataclasses import replace

        from .manifest import ACTIVE, STORE_ONLY

        entries = tuple(replace(e, status=ACTIVE, fallback_for=None)
                        for e in self.payload_manifest.entries if e.origin not in STORE_ONLY)
        manifest = replace(self.payload_manifest, entries=entries)
        return replace(self, prepared_graph=None, payload_manifest=manifest, bindings=(),
                       key=None)

    def close(self) -> None:
        """Release the source model file (also on leaving a ``with`` block)."""
        self.source.close()

    def __enter__(self) -> ResolvedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_dict(self) -> dict[str, Any]:
        """What ``resolve --json`` prints: the scenario, decisions and payload manifest."""
        return {
            "model": self.source.name,
            "scenario": self.selected_scenario,
            "device": self.device,
            "graph_digest": self.graph_digest,
            "constant_values": dict(self.constant_counts),
            "prepared_requirements": [r.to_dict() for r in self.prepared_requirements],
            "bindings": [b.to_dict() for b in self.bindings],
            "transformations": self.transformations.to_dict(),
            "manifest": self.payload_manifest.to_dict(),
            "record": self._record(),
        }

    def _record(self) -> dict[str, Any] | None:
        """None: resolved by this process (the phases' seconds are its own)."""
        return None
