"""From a model file to scenario records, and from a scenario to a runnable variant.

Passes run on the model's metadata (small constants inline, weights omitted). A runnable
variant needs the base payloads and the derived ones: it is produced by replaying the
records on the fully inlined model and computing every derived initializer from the base
model's values.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from ..catalogue.sites import iter_tensor_sites
from ..convert.weights import ModelWeights
from ..errors import ScenarioError
from ..passes.base import SMALL_VALUE_LIMIT, run_passes
from ..passes.cleanup import prune
from ..passes.registry import get_pass
from .api import find_scenario, replay_modification_scenario, strip_scenarios
from .derive import materialize
from .rewriting import LocalRewriting, derivations_of


def scenario_rewrites(mw: ModelWeights, passes: Sequence[str]) -> list[LocalRewriting]:
    """Run the named passes on the model's metadata; their records, in order."""
    if not passes:
        raise ScenarioError("a scenario needs at least one pass")
    base = strip_scenarios(mw.metadata_model(SMALL_VALUE_LIMIT))
    return run_passes(base, [get_pass(name) for name in passes]).rewrites


def runnable_variant(path: str | os.PathLike[str], scenario: str | None) -> onnx.ModelProto:
    """The model (or one of its scenarios) with every payload inline, derived ones computed."""
    with ModelWeights.open(path) as mw:
        full = mw.materialize({}, "external-data")
    if scenario is None:
        return strip_scenarios(full)
    record = find_scenario(full, scenario)
    variant = replay_modification_scenario(full, record)
    prune(variant)
    derivations = {}
    for rewrite in record.rewrites:
        derivations.update(derivations_of(rewrite))
    values = {site.tensor.name: site.tensor for site in iter_tensor_sites(full)
              if site.role == "initializer"}

    def source_value(name: str) -> np.ndarray:
        if name not in values:
            raise ScenarioError("derived weight source is not an initializer of the base "
                                "model", source=name, scenario=scenario)
        return numpy_helper.to_array(values[name])

    materialize(variant, derivations, source_value)
    return variant
