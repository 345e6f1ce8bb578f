"""The pass framework: passes propose records, the engine normalizes and chains them.

A pass sees a *metadata model*: structure, names, types and shapes, with payloads omitted.
Tensors up to :data:`SMALL_VALUE_LIMIT` bytes are inline, so a pass may read small
constants (an If condition, a Reshape shape) with :func:`small_value`, never a large
weight: a payload-dependent result is declared as a
:class:`~weightstore.catalogue.descriptors.DerivedWeightRecipe` over source initializers
and materialized only when a package is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..convert.encoding import has_payload
from ..errors import ScenarioError
from ..io.onnx_arrays import to_array
from ..io.onnx_proto import ModelProto, TensorProto
from .rewriting import LocalRewriting, normalize


def small_value(tensor: TensorProto) -> np.ndarray | None:
    """The value of a small inline tensor; None for an omitted or external payload."""
    if not has_payload(tensor):
        return None
    return to_array(tensor)


@dataclass
class PassContext:
    """What a pass may know besides the model's structure (room for device facts later).

    ``known(scope, name)`` answers a value's small known value from an analysis (the
    resolver's constant-result analysis knows ``Not(Constant)`` or a static dim); without
    it, passes see only Constant nodes and initializers.
    """

    small_value_limit: int = SMALL_VALUE_LIMIT
    known: Callable[[Any, str], np.ndarray | None] | None = None


class RewritePass(Protocol):
    """A pass. One whose class sets ``may_find_nothing`` (cleanup, which removes what
    others leave) is not reported when it returns no record; any other is
    (:attr:`PassResult.idle`): a pass asked for that finds nothing to rewrite is a
    scenario the recipe's author did not get."""

    name: str

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        """Records for one batch, in the coordinates of ``model``."""
        ...


@dataclass
class PassResult:
    """Records of every pass, in order, and the model they produce."""

    rewrites: list[LocalRewriting] = field(default_factory=list)
    model: ModelProto | None = None
    idle: list[str] = field(default_factory=list)  # passes that found nothing to rewrite


def run_passes(model: ModelProto, passes: Sequence[RewritePass],
               ctx: PassContext | None = None) -> PassResult:
    """Run ``passes`` in order, each on the model the previous ones produced."""
    ctx = ctx or PassContext()
    current = model
    result = PassResult()
    for number, rewrite_pass in enumerate(passes):
        records = [_in_batch(r, number) for r in rewrite_pass(current, ctx)]
        if records:
            _, current = normalize(current, records)
        elif not getattr(rewrite_pass, "may_find_nothing", False):
            result.idle.append(rewrite_pass.name)
        result.rewrites.extend(records)
    result.model = current
    return result


def _in_batch(record: LocalRewriting, number: int) -> LocalRewriting:
    if not isinstance(record, LocalRewriting):
        raise ScenarioError("a pass returned something that is not a LocalRewriting")
    return replace(record, batch=number)
