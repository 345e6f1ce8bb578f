"""From a model file to scenario records, and from a scenario to a runnable variant.

Passes run on the model's metadata (small constants inline, weights omitted). A runnable
variant needs the base payloads and the derived ones: it is produced by replaying the
records on the fully inlined model and computing every derived initializer from the base
model's values.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx

from ..convert.weights import ModelWeights
from ..errors import ScenarioError
from ..passes.base import SMALL_VALUE_LIMIT, run_passes
from ..passes.cleanup import prune
from ..passes.registry import get_pass
from .api import (
    apply_scenario,
    check_scenarios,
    find_scenario,
    strip_scenarios,
    verify_base,
)
from .derive import base_values, materialize
from .rewriting import LocalRewriting, derivations_of


def scenario_rewrites(mw: ModelWeights, passes: Sequence[str],
                      ) -> tuple[list[LocalRewriting], onnx.ModelProto]:
    """Run the named passes on the model's metadata: their records, and that metadata."""
    if not passes:
        raise ScenarioError("a scenario needs at least one pass")
    base = strip_scenarios(mw.metadata_model(SMALL_VALUE_LIMIT))
    return run_passes(base, [get_pass(name) for name in passes]).rewrites, base


def runnable_variant(path: str | os.PathLike[str], scenario: str | None) -> onnx.ModelProto:
    """The model (or one of its scenarios) with every payload inline, derived ones computed.

    The scenario is verified against the model as stored (its tensors' checksums are part
    of the base graph digest), then replayed on the inlined model.
    """
    with ModelWeights.open(path) as mw:
        if scenario is not None:
            check_scenarios(mw.catalogue.model)
            record = find_scenario(mw.catalogue.model, scenario)
            verify_base(mw.catalogue.model, record)
        full = mw.materialize({}, "external-data")
    if scenario is None:
        return strip_scenarios(full)
    variant = apply_scenario(full, record)
    prune(variant)
    derivations = {}
    for rewrite in record.rewrites:
        derivations.update(derivations_of(rewrite))
    materialize(variant, derivations, base_values(full), strict=False)
    return variant
