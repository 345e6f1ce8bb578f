"""The resolution pipeline: ordered phases, each with requires / run / ensures.

The order is the seed's: replay -> caller transformations -> recursive cleanup -> shape
inference and constant-result analysis -> folding what the analysis proved -> placement
and kernel selection -> prepared-object resolution -> payload closure. It is
configuration (a list of phases), not a fixed-point loop. A phase that changes topology
makes the analyses stale (cleanup, inference, placement); the pipeline re-runs those that
already ran, once, before the next phase, and the transformation report says which went
stale, why and that they were re-run. Failures name the phase and the scenario.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..errors import ResolutionError, WeightstoreError
from ..passes.analysis import name_problem
from ..passes.base import PassContext, RewritePass, run_passes
from ..passes.cleanup import Cleanup, prune
from ..passes.fold_constant_if import FoldConstantIf
from ..passes.rewriting import derivations_of
from ..scenarios.api import apply_scenario, check_scenarios, find_scenario, verify_base
from .closure import payload_closure
from .constants import analyze
from .files import file_problems
from .kernels import select_kernels
from .model import PhaseReport, TransformationReport, graph_digest
from .state import ResolutionState

ANALYSES = ("cleanup", "inference", "placement")


class Phase(Protocol):
    name: str

    def requires(self, state: ResolutionState) -> None: ...

    def run(self, state: ResolutionState) -> bool:
        """Do the work; True when the graph's topology changed."""
        ...

    def ensures(self, state: ResolutionState) -> None: ...


class _Base:
    name = ""

    def requires(self, state: ResolutionState) -> None:
        pass

    def ensures(self, state: ResolutionState) -> None:
        pass


def _apply(state: ResolutionState, passes: Sequence[RewritePass], **known: Any) -> bool:
    result = run_passes(state.model, passes, PassContext(**known))
    if not result.rewrites:
        return False
    for r in result.rewrites:
        state.derivations.update(r.derivations)
    state.rewrites += len(result.rewrites)
    assert result.model is not None
    state.model = result.model
    return True


def _check_names(state: ResolutionState) -> None:
    problem = name_problem(state.model)
    if problem is not None:
        raise ResolutionError(f"the graph is not well formed: {problem[0]}", value=problem[1])


class Replay(_Base):
    """Replay the selected scenario's records (metadata only); base digest verified. The
    graph it leaves (the model's own, without a scenario) must be well formed."""

    name = "replay"

    def ensures(self, state: ResolutionState) -> None:
        _check_names(state)

    def run(self, state: ResolutionState) -> bool:
        if state.scenario is None:
            return False
        check_scenarios(state.model)
        record = find_scenario(state.model, state.scenario)
        verify_base(state.model, record)
        state.model = apply_scenario(state.model, record)
        for rewrite in record.rewrites:
            state.derivations.update(derivations_of(rewrite))
        state.rewrites += len(record.rewrites)
        return bool(record.rewrites)


class Transform(_Base):
    """The caller's transformations (passes, by object or registered name)."""

    name = "transform"

    def ensures(self, state: ResolutionState) -> None:
        if state.transformations:
            _check_names(state)

    def run(self, state: ResolutionState) -> bool:
        from ..passes.registry import get_pass  # every pass module: only when asked for

        passes = [get_pass(p) if isinstance(p, str) else p for p in state.transformations]
        return _apply(state, passes) if passes else False


class CleanupPhase(_Base):
    """Recursive cleanup: dead nodes, weights, value_info and functions go."""

    name = "cleanup"

    changed = False

    def run(self, state: ResolutionState) -> bool:
        self.changed = _apply(state, [Cleanup()])
        prune(state.model)
        state.fresh.add("cleanup")
        return self.changed

    def ensures(self, state: ResolutionState) -> None:
        # a run that found nothing to remove has just proved the graph clean
        if self.changed and run_passes(state.model, [Cleanup()]).rewrites:
            raise ResolutionError("cleanup left dead nodes or weights")


class Inference(_Base):
    """Shape inference and constant-result analysis (no payload read)."""

    name = "inference"

    def requires(self, state: ResolutionState) -> None:
        if "cleanup" not in state.fresh:
            raise ResolutionError("inference needs a cleaned-up graph")

    def run(self, state: ResolutionState) -> bool:
        state.constants = analyze(state.model)
        state.fresh.add("inference")
        return False


class FoldKnown(_Base):
    """Replace each If whose condition the analysis proved by its live branch."""

    name = "fold-known"

    def requires(self, state: ResolutionState) -> None:
        if "inference" not in state.fresh or state.constants is None:
            raise ResolutionError("folding needs a fresh constant-result analysis")

    def run(self, state: ResolutionState) -> bool:
        assert state.constants is not None
        return _apply(state, [FoldConstantIf()], known=state.constants.known)


class Placement(_Base):
    """Device placement and kernel selection: prepared-object requirements."""

    name = "placement"

    def requires(self, state: ResolutionState) -> None:
        if not {"cleanup", "inference"} <= state.fresh:
            raise ResolutionError("placement needs fresh cleanup and inference")

    def run(self, state: ResolutionState) -> bool:
        state.placement, state.requirements = select_kernels(state.model, state.device,
                                                             state.kernels)
        state.fresh.add("placement")
        return False


class PreparedResolution(_Base):
    """Order each requirement's candidates and bind the first eligible one."""

    name = "prepared"

    def requires(self, state: ResolutionState) -> None:
        if not set(ANALYSES) <= state.fresh:
            raise ResolutionError("prepared resolution needs fresh analyses",
                                  stale=", ".join(sorted(set(ANALYSES) - state.fresh)))

    def run(self, state: ResolutionState) -> bool:
        # imported here: checks, bundles and builds resolve liveness without them
        from .binding import COSTLIER, PERSISTED, RESIDENT, bind_prepared
        from .prepared_cache import RecordCache, read_record

        record = None
        if (state.prepared.records and state.prepared.cache is None
                and state.source.package is not None and state.requirements):
            record = read_record(state.source.package, state.target, state.source.name)
            if record is not None and record.graph_digest != graph_digest(
                    state.model.SerializeToString()):
                record = None  # prepared for another graph (scenario, transformations)
            if record is not None and record.unproven is not None:
                # never run what cannot be proven: the portable weights, the source graph
                print(f"weightstore: prepared record {record.path} not used: "
                      f"{record.unproven}", file=sys.stderr, flush=True)
                record = None
            if record is not None:
                state.prepared = replace(state.prepared,
                                         cache=RecordCache(record, state.source.store))
        state.bindings = bind_prepared(state)
        if record is not None and any(b.selected in (PERSISTED, RESIDENT)
                                      or (PERSISTED, COSTLIER) in b.rejected
                                      for b in state.bindings):
            # the companion graph is this graph as the runtime optimizes it: used even
            # when its packed objects are not (the portable weights are packed instead)
            state.companion = record
        return False


class Closure(_Base):
    """Payload dependency closure; then the files of active entries are checked
    (:mod:`.files`), the first problem failing the resolution. ``Closure.located``, for
    callers that judge the files themselves, stops once the entries are located."""

    name = "closure"
    check_files = True

    @classmethod
    def located(cls) -> Closure:
        phase = cls()
        phase.check_files = False
        return phase

    def requires(self, state: ResolutionState) -> None:
        if not {"cleanup", "inference"} <= state.fresh:
            raise ResolutionError("closure needs a fresh liveness")

    def run(self, state: ResolutionState) -> bool:
        runtime = state.companion.runtime_values if state.companion is not None else {}
        state.entries, state.load_derivations = payload_closure(
            state.model, lambda: state.source.catalogue, derivations=state.derivations,
            scenario=state.scenario, store_keys=state.source.store_keys,
            model_file=str(state.source.path), bindings=state.bindings,
            keeps_source=state.kernels.keeps_source,
            runtime_values=runtime)
        if self.check_files:
            file_problems(state.source.folder, state.entries, state.scenario, strict=True,
                          model_file=state.source.path, store=state.source.store,
                          package=state.source.package is not None)
        return False


DEFAULT_PHASES: tuple[Callable[[], Phase], ...] = (
    Replay, Transform, CleanupPhase, Inference, FoldKnown, Placement, PreparedResolution,
    Closure)
ANALYSIS_PHASES: Mapping[str, Callable[[], Phase]] = {
    "cleanup": CleanupPhase, "inference": Inference, "placement": Placement}


def run_pipeline(state: ResolutionState, phases: Sequence[Phase]) -> TransformationReport:
    """Run ``phases`` in order; after a topology change, re-run the analyses that had run."""
    reports: list[PhaseReport] = []
    ran: list[str] = []

    def one(phase: Phase, rerun_of: str | None = None) -> bool:
        start = time.perf_counter()
        try:
            phase.requires(state)
            changed = phase.run(state)
            phase.ensures(state)
        except WeightstoreError as exc:
            if isinstance(exc, ResolutionError) and "phase" in exc.context:
                raise
            raise ResolutionError(exc.message, phase=phase.name,
                                  scenario=state.scenario or "(default)",
                                  **{k: v for k, v in exc.context.items()
                                     if k not in ("phase", "scenario")}) from exc
        stale: tuple[str, ...] = ()
        if changed and phase.name not in ANALYSES:
            stale = tuple(a for a in ANALYSES if a in state.fresh)
            state.fresh -= set(ANALYSES)
        elif changed and phase.name == "cleanup":
            stale = tuple(a for a in ("inference", "placement") if a in state.fresh)
            state.fresh -= set(stale)
        reports.append(PhaseReport(phase.name, time.perf_counter() - start, changed, stale,
                                   rerun_of))
        return bool(stale)

    for phase in phases:
        if one(phase):
            for name in (a for a in ANALYSES if a in ran):
                one(ANALYSIS_PHASES[name](), rerun_of=phase.name)
        if phase.name in ANALYSES and phase.name not in ran:
            ran.append(phase.name)
    return TransformationReport(tuple(reports), state.rewrites)
