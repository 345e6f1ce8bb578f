"""From a model file to scenario records, and the base model's values by name.

Passes run on the model's metadata (small values inline, weights omitted). Turning a
scenario back into a runnable model is the deploy side's
(:mod:`weightstore.resolve.runnable`): it resolves the variant first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..catalogue.metadata import metadata_model
from ..catalogue.payload import describe, read_payload
from ..catalogue.reader import Catalogue, read_catalogue
from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..catalogue.sites import ATTRIBUTE_NAME_PREFIX, iter_tensor_sites
from ..convert.inline import check_digest
from ..convert.weights import ModelWeights
from ..errors import ScenarioError
from ..io.onnx_arrays import to_array
from ..io.onnx_proto import ModelProto, TensorProto
from ..passes.base import run_passes
from ..passes.rewriting import LocalRewriting
from .api import strip_scenarios

if TYPE_CHECKING:
    from ..recipe.pass_params import PassStep


def metadata_of(path: str | os.PathLike[str]) -> ModelProto:
    """A model file's metadata model: structure and small values, weights omitted.

    Opens no external data file: resolution must not depend on files a variant does not
    need.
    """
    with read_catalogue(path) as catalogue:
        return metadata_model(catalogue)


def scenario_rewrites(mw: ModelWeights, passes: Sequence[PassStep],
                      ) -> tuple[list[LocalRewriting], list[str]]:
    """Run the passes (``(name, parameters)`` each) on the model's metadata: their
    records, and the passes that found nothing to rewrite (:attr:`PassResult.idle`)."""
    from ..passes.registry import get_pass  # the passes and their parameters' models

    if not passes:
        raise ScenarioError("a scenario needs at least one pass")
    base = strip_scenarios(mw.metadata_model(SMALL_VALUE_LIMIT))
    result = run_passes(base, [get_pass(name, params) for name, params in passes])
    return result.rewrites, result.idle


def catalogue_values(catalogue: Catalogue, base_dir: Path) -> Callable[[str], np.ndarray]:
    """Base-model values (initializers, Constants, and the tensors other nodes'
    attributes hold under the name resolution gives them) by name, or by name qualified
    by their scope (``TensorSite.scoped_name``, which wins), each read when asked (and
    only then is its file, if external, opened)."""
    by_name: dict[str, list] = {}
    by_scoped: dict[str, list] = {}
    for site in iter_tensor_sites(catalogue.model):
        name = site.value_name
        if site.role == "attribute" and site.tensor.name.startswith(ATTRIBUTE_NAME_PREFIX):
            name = site.tensor.name
        if name:
            by_name.setdefault(name, []).append(site)
            by_scoped.setdefault(site.scoped_name, []).append(site)

    def value(name: str) -> np.ndarray:
        sites = by_scoped.get(name) or by_name.get(name, [])
        if len(sites) != 1:
            raise ScenarioError("a weight must name exactly one tensor of the base model",
                                source=name, found=len(sites))
        site = sites[0]
        desc = describe(site, catalogue, base_dir)
        if desc is None:
            raise ScenarioError("the base model holds no payload for this weight", source=name)
        data = read_payload(desc, catalogue)
        check_digest(data, desc.checksum, where=site.where)
        return to_array(TensorProto(
            data_type=site.tensor.data_type, dims=list(site.tensor.dims), raw_data=data))

    return value
