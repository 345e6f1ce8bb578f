"""The passes a scenario may name, by name, each with the model of its parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..recipe.pass_params import validate_params
from .base import RewritePass
from .cast_fp16 import CastFP16
from .cleanup import Cleanup
from .fold_batchnorm import FoldBatchNorm
from .fold_constant_if import FoldConstantIf
from .fuse_qkv import FuseQKV
from .gemm_transpose_b import GemmTransposeB
from .quantize_dynamic import QuantizeDynamic
from .quantize_weights import QuantizeWeights

# a class that takes parameters has ``Params``, its entry in
# weightstore.recipe.pass_params.PASS_PARAMS, and takes them validated; the others take none
PASSES: dict[str, type] = {
    "fuse-qkv": FuseQKV,
    "cast-fp16": CastFP16,
    "gemm-transpose-b": GemmTransposeB,
    "fold-batchnorm": FoldBatchNorm,
    "fold-constant-if": FoldConstantIf,
    "cleanup": Cleanup,
    "quantize-dynamic": QuantizeDynamic,
    "quantize-weights": QuantizeWeights,
}


def get_pass(name: str, params: Mapping[str, Any] | None = None) -> RewritePass:
    """A fresh instance of the pass called ``name`` with ``params`` validated (unknown
    names, keys and bad values are one :class:`~weightstore.errors.ScenarioError`)."""
    valid = validate_params(name, params)
    factory = PASSES[name]
    return factory(valid) if hasattr(factory, "Params") else factory()
