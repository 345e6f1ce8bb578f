"""One variant of a model and the payloads it needs: the resolution pipeline's liveness
phases, for the callers that ask only "which payloads does this scenario need".

``weightstore check``, device bundles, the build's split planning, ``scenario replay`` and
``pull --device/--scenario`` use this, so "which payloads does a scenario or device need"
has one implementation: the seed's replay -> cleanup -> shape and constant-result analysis
-> folding of proven ``If`` conditions -> payload closure, the same phases
:func:`weightstore.resolve` runs. It stops short of kernels and prepared objects (the
portable payloads are what a package's files hold), and of the file checks: callers decide
whether a missing file is a problem to collect or an error to raise
(:func:`weightstore.resolve.files.file_problems`).

A graph these phases already produced (a device model a build wrote, a pulled variant) is
their fixpoint: resolving it again changes nothing, so for such a *final* graph only the
payload closure is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..io.onnx_proto import ModelProto
from ..scenarios.api import strip_scenarios
from .kernels import catalogue_for
from .manifest import ManifestEntry, RequiredPayloadManifest
from .phases import (
    CleanupPhase,
    Closure,
    FoldKnown,
    Inference,
    Phase,
    Replay,
    TransformationReport,
    run_pipeline,
)
from .source import ModelSource
from .state import ResolutionState

LIVENESS_PHASES: tuple[Callable[[], Phase], ...] = (Replay, CleanupPhase, Inference,
                                                      FoldKnown)
VARIANT_PHASES = (*LIVENESS_PHASES, Closure.located)
FINAL_PHASES = (Closure.located,)


@dataclass(frozen=True)
class Variant:
    """A scenario (or the default graph) of one model, resolved: its final graph and the
    payloads that graph needs."""

    model: ModelProto  # the final graph, without scenario records
    scenario: str | None
    manifest: RequiredPayloadManifest
    transformations: TransformationReport

    @property
    def external(self) -> tuple[ManifestEntry, ...]:
        """Active entries held in files beside the model (not inline in it)."""
        return tuple(e for e in self.manifest.active if e.source.file)


def resolve_variant(source: ModelSource, scenario: str | None, *,
                    model: ModelProto | None = None, final: bool = False) -> Variant:
    """Resolve ``scenario`` (None: the default graph) of the model ``source`` opened.

    ``model`` is that file's graph already in hand (its metadata model, or the file parsed
    in full: a package being built has it); by default the source's metadata model is
    used. ``final``: the file is a graph these phases produced (a device model): its
    payloads are closed over as they are, and ``scenario`` only names it in messages. No
    payload is read. Errors are :class:`~weightstore.errors.ResolutionError` naming the
    phase and the scenario.
    """
    graph = model if model is not None else source.metadata()
    state, report = _run(source, graph, scenario, FINAL_PHASES if final else VARIANT_PHASES,
                         final=final)
    return Variant(state.model, scenario,
                   RequiredPayloadManifest(state.entries, state.load_derivations), report)


def variant_graph(model: ModelProto, scenario: str | None) -> ModelProto:
    """The final graph of ``scenario`` of a model in hand (no file behind it: a package
    model being planned, one just downloaded), by the same phases; its live payloads are
    then the graph's own external data (:func:`weightstore.scenarios.resolve.live_payloads`).
    """
    state, _ = _run(None, model, scenario, LIVENESS_PHASES)
    return state.model


def _run(source: ModelSource | None, graph: ModelProto, scenario: str | None,
         phases: tuple[Callable[[], Phase], ...], *, final: bool = False,
         ) -> tuple[ResolutionState, TransformationReport]:
    if scenario is None and not final:  # a replayed scenario's graph is stripped by replay
        graph = strip_scenarios(graph)
    kind, kernels = catalogue_for({})
    # the liveness phases never look at the source: only the closure locates payloads
    state = ResolutionState(source, graph, scenario, kind, kernels)  # type: ignore[arg-type]
    if final:
        state.fresh |= {"cleanup", "inference"}  # the graph is the phases' fixpoint
    return state, run_pipeline(state, [phase() for phase in phases])
