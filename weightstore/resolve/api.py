"""``weightstore.resolve``: from a package or model to a frozen ResolvedModel, no payload read.

Scenario selection comes first and is exclusive: an explicit ``scenario=`` or a
``selector=`` callback, not both; neither selects the device's scenario (``device=``) or
the default graph. A selector sees a :class:`ScenarioSelectionContext` (scenario names and
metadata, model metadata, capabilities) and nothing that locates a payload. An unknown
scenario fails before any weight file is looked at.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import ResolutionError, WeightstoreError
from . import cache as records

if TYPE_CHECKING:
    from ..passes.base import RewritePass
    from .locator import StoreLocator
    from .model import ResolvedModel
    from .phases import Phase
    from .prepared import PreparedOptions
    from .reference import StoreReference
    from .source import ModelSource


@dataclass(frozen=True)
class ScenarioSelectionContext:
    """What a selector may look at: metadata and capabilities, never payloads."""

    scenarios: tuple[str, ...]
    scenario_metadata: Mapping[str, Mapping[str, str]]
    model_metadata: Mapping[str, str]
    capabilities: Mapping[str, Any]


ScenarioSelector = Callable[[ScenarioSelectionContext], "str | None"]

PARSE = "parse"


def resolve(source: str | os.PathLike[str] | StoreReference, *, model: str | None = None,
            scenario: str | None = None, selector: ScenarioSelector | None = None,
            device: str | None = None, capabilities: Mapping[str, Any] | None = None,
            transformations: Sequence[RewritePass | str] = (),
            prepared: PreparedOptions | None = None,
            store: str | os.PathLike[str] | StoreLocator | None = None,
            phases: Sequence[Phase] | None = None, cache: bool = True,
            ) -> ResolvedModel:
    """Resolve one model of a package folder, a device folder, a model file or a build in
    ``store`` (a :class:`StoreReference`, or its text naming no existing path) from
    metadata alone.

    A package folder's resolution is kept for later processes and taken from there while
    nothing below the folder changed (:mod:`.cache`); ``cache=False`` neither
    reads nor writes such a record."""
    if scenario is not None and selector is not None:
        raise ResolutionError("choose a scenario or a selector, not both", phase=PARSE)
    if device is not None and scenario is not None:
        raise ResolutionError("choose a scenario or a device, not both", phase=PARSE)
    key = None
    start = time.perf_counter()
    if cache and selector is None and phases is None:
        key = records.resolution_key(source, model=model, scenario=scenario, device=device,
                                   capabilities=capabilities,
                                   transformations=transformations, prepared=prepared,
                                   store=store)
    if key is not None:
        hit = records.cached(key, None if store is None else _locator(store))
        if hit is not None:
            object.__setattr__(hit, "record_seconds", time.perf_counter() - start)
            return hit
    from .prepared import PreparedOptions
    from .source import open_source

    root = getattr(store, "root", store) if hasattr(store, "locate") else store
    src = open_source(source, model=model, device=device, store=root)  # type: ignore[arg-type]
    try:
        resolved = _resolve(src, scenario=scenario, selector=selector, device=device,
                            capabilities=capabilities, transformations=transformations,
                            prepared=prepared or PreparedOptions(), store=store,
                            phases=phases)
    except BaseException:
        src.close()
        raise
    if key is None:
        return resolved
    from dataclasses import replace

    resolved = replace(resolved, key=key)
    records.keep(key, resolved)
    return resolved


def _locator(store: str | os.PathLike[str]) -> StoreLocator:
    from .locator import WeightStoreLocator

    return WeightStoreLocator(store)


def _resolve(src: ModelSource, *, scenario: str | None, selector: ScenarioSelector | None,
             device: str | None, capabilities: Mapping[str, Any] | None,
             transformations: Sequence[RewritePass | str], prepared: PreparedOptions,
             store: str | os.PathLike[str] | StoreLocator | None,
             phases: Sequence[Phase] | None) -> ResolvedModel:
    from ..scenarios.storage import read_scenarios
    from .constants import ValueCounts
    from .kernels import catalogue_for
    from .manifest import RequiredPayloadManifest
    from .model import ResolvedModel, graph_digest
    from .phases import DEFAULT_PHASES, PhaseReport, TransformationReport, run_pipeline
    from .state import ResolutionState

    start = time.perf_counter()
    if store is not None:
        src.store = store if hasattr(store, "locate") else _locator(store)  # type: ignore[arg-type]
    caps = dict(src.device_capabilities)
    caps.update(capabilities or {})
    try:
        meta = src.metadata()
        records = read_scenarios(meta)
    except WeightstoreError as exc:
        raise ResolutionError(exc.message, phase=PARSE, **exc.context) from exc
    names = tuple(r.scenario for r in records)
    if device is not None:  # the record's scenario, checked below like any other
        scenario = src.device_scenario
    if selector is not None:
        context = ScenarioSelectionContext(
            names,
            MappingProxyType({r.scenario: MappingProxyType(
                {e.key: e.value for e in r.metadata_props}) for r in records}),
            MappingProxyType({e.key: e.value for e in meta.metadata_props}),
            MappingProxyType(dict(caps)))
        scenario = selector(context)
    if scenario is not None and scenario not in names:
        raise ResolutionError("unknown scenario", phase="select", scenario=scenario,
                              model=str(src.path), known=", ".join(names) or "none")
    parse_seconds = time.perf_counter() - start
    kind, kernels = catalogue_for(caps)
    state = ResolutionState(src, meta, scenario, kind, kernels, transformations, prepared,
                            target=device)
    report = run_pipeline(state, [p() for p in DEFAULT_PHASES] if phases is None
                          else phases)
    report = TransformationReport((PhaseReport(PARSE, parse_seconds, False),
                                   *report.phases), report.rewrites)
    data = state.model.SerializeToString()
    return ResolvedModel(
        model_bytes=data, graph_digest=graph_digest(data), selected_scenario=scenario,
        device=kind, capabilities=MappingProxyType(caps),
        constant_counts=ValueCounts(state.constants),
        placement=MappingProxyType(dict(state.placement)),
        prepared_requirements=state.requirements, bindings=state.bindings,
        payload_manifest=RequiredPayloadManifest(state.entries, state.load_derivations),
        transformations=report, source=src,
        prepared_graph=None if state.companion is None
        else state.companion.companion({b.active.source.store_key for b in state.bindings
                                        if b.active is not None}).SerializeToString())
