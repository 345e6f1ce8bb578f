"""From a model file to scenario records, and from a scenario to a runnable variant.

Passes run on the model's metadata (small values inline, weights omitted). A runnable
variant is resolved from that metadata first (scenario verified and replayed, dead weights
cleaned up) and only then are its *live* payloads read: a weight the scenario removed is
never read, so a missing file that only removed weights use does not matter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..catalogue.metadata import metadata_model
from ..catalogue.payload import SMALL_VALUE_LIMIT, describe, read_payload
from ..catalogue.reader import Catalogue, read_catalogue
from ..catalogue.sites import iter_tensor_sites
from ..convert.encoding import has_payload, set_payload
from ..convert.inline import check_digest
from ..convert.weights import ModelWeights
from ..errors import ScenarioError
from ..passes.base import run_passes
from ..passes.registry import get_pass
from .api import find_scenario, strip_scenarios
from .derive import resolver
from .rewriting import LocalRewriting, derivations_of


def metadata_of(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """A model file's metadata model: structure and small values, weights omitted.

    Opens no external data file: resolution must not depend on files a variant does not
    need.
    """
    with read_catalogue(path) as catalogue:
        return metadata_model(catalogue)


def scenario_rewrites(mw: ModelWeights, passes: Sequence[str],
                      ) -> tuple[list[LocalRewriting], onnx.ModelProto]:
    """Run the named passes on the model's metadata: their records, and that metadata."""
    if not passes:
        raise ScenarioError("a scenario needs at least one pass")
    base = strip_scenarios(mw.metadata_model(SMALL_VALUE_LIMIT))
    return run_passes(base, [get_pass(name) for name in passes]).rewrites, base


def catalogue_values(catalogue: Catalogue, base_dir: Path) -> Callable[[str], np.ndarray]:
    """Base-model values by value name (initializers and Constants), each read when asked
    (and only then is its file, if external, opened)."""
    by_name: dict[str, list] = {}
    for site in iter_tensor_sites(catalogue.model):
        if site.role in ("initializer", "constant") and site.value_name:
            by_name.setdefault(site.value_name, []).append(site)

    def value(name: str) -> np.ndarray:
        sites = by_name.get(name, [])
        if len(sites) != 1:
            raise ScenarioError("a weight must name exactly one tensor of the base model",
                                source=name, found=len(sites))
        site = sites[0]
        desc = describe(site, catalogue, base_dir)
        if desc is None:
            raise ScenarioError("the base model holds no payload for this weight", source=name)
        data = read_payload(desc, catalogue)
        check_digest(data, desc.checksum, where=site.where)
        return numpy_helper.to_array(onnx.TensorProto(
            data_type=site.tensor.data_type, dims=list(site.tensor.dims), raw_data=data))

    return value


def runnable_variant(path: str | os.PathLike[str], scenario: str | None) -> onnx.ModelProto:
    """The model (or one of its scenarios) with every live payload inline.

    Resolution happens on metadata, as a load resolves; then each live tensor without its
    value gets it: from its own external data when the model stores it (checksum verified),
    computed when a record derives it, else from the base model's weight of that name.
    """
    from ..resolve.variant import variant_graph  # resolution is the deploy side's

    path = Path(path)
    with read_catalogue(path) as catalogue:
        meta = metadata_model(catalogue)
        resolved = variant_graph(meta, scenario)
        derivations = {}
        if scenario is not None:
            for rewrite in find_scenario(meta, scenario).rewrites:
                derivations.update(derivations_of(rewrite))
        value = resolver(derivations, catalogue_values(catalogue, path.parent))
        for site in iter_tensor_sites(resolved):
            t = site.tensor
            if has_payload(t) or t.data_type == onnx.TensorProto.STRING:
                continue
            name = site.value_name or t.name
            if t.data_location == onnx.TensorProto.EXTERNAL:
                desc = describe(site, catalogue, path.parent)
                data = read_payload(desc, catalogue)
                check_digest(data, desc.checksum, where=site.where, scenario=scenario)
            else:
                data = numpy_helper.from_array(np.ascontiguousarray(value(name))).raw_data
            set_payload(t, data)
    return resolved
