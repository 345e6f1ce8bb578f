"""The passes a scenario may name, by name."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ScenarioError
from .base import RewritePass
from .cast_fp16 import CastFP16
from .cleanup import Cleanup
from .fold_batchnorm import FoldBatchNorm
from .fold_constant_if import FoldConstantIf
from .fuse_qkv import FuseQKV
from .gemm_transpose_b import GemmTransposeB

PASSES: dict[str, Callable[[], RewritePass]] = {
    "fuse-qkv": FuseQKV,
    "cast-fp16": CastFP16,
    "gemm-transpose-b": GemmTransposeB,
    "fold-batchnorm": FoldBatchNorm,
    "fold-constant-if": FoldConstantIf,
    "cleanup": Cleanup,
}


def get_pass(name: str) -> RewritePass:
    """A fresh instance of the pass called ``name``."""
    try:
        factory = PASSES[name]
    except KeyError:
        raise ScenarioError("unknown pass", name=name, known=", ".join(PASSES)) from None
    return factory()
