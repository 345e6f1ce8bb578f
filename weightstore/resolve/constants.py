"""Constant-result analysis: which values are constant, and which small ones are known.

Distinct from constant folding (the seed's Step 3): a value is classified as

* ``dynamic``: it depends on a graph input, randomness, state or unknown control flow;
* ``constant``: it is constant but its bytes are not materialized (a large weight, or an
  op over weights: proving it constant never reads the weight);
* ``known``: a small value computed from metadata alone (shapes from onnx's shape
  inference, small inline constants) by the evaluators of :data:`EVALUATORS`.

An ``If`` whose condition is ``known`` can then be replaced by its live branch, so the
dead branch's weights never enter the payload manifest. Nothing here reads a payload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np
import onnx
from onnx import helper

from ..catalogue.payload import SMALL_VALUE_LIMIT
from ..passes.analysis import (
    STANDARD_DOMAINS,
    Scope,
    attribute,
    constant_node_value,
    initializers,
    input_names,
    is_constant,
    iter_scopes,
    node_subgraphs,
)
from ..passes.base import small_value


class ValueKind(str, Enum):
    DYNAMIC = "dynamic"
    CONSTANT = "constant"  # constant, bytes not materialized
    KNOWN = "known"  # constant, small value known


@dataclass(frozen=True, eq=False)
class ValueResult:
    kind: ValueKind
    value: np.ndarray | None = None  # only for KNOWN


DYNAMIC = ValueResult(ValueKind.DYNAMIC)
CONSTANT = ValueResult(ValueKind.CONSTANT)

# ops whose outputs are never constant even over constant inputs
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"}

Shapes = dict[str, tuple[int, ...] | None]
Evaluator = Callable[[onnx.NodeProto, list[ValueResult], list[tuple[int, ...] | None]],
                     np.ndarray | None]


def _vals(results: list[ValueResult]) -> list[np.ndarray] | None:
    if any(r.kind != ValueKind.KNOWN for r in results):
        return None
    return [r.value for r in results]  # type: ignore[misc]


def _shape(node, results, shapes):
    dims = shapes[0] if shapes else None
    if dims is None:
        return None
    start = int(attribute(node, "start", 0))  # type: ignore[arg-type]
    end = attribute(node, "end", None)
    return np.array(dims, dtype=np.int64)[start:None if end is None else int(end)]


def _size(node, results, shapes):
    dims = shapes[0] if shapes else None
    return None if dims is None else np.array(int(np.prod(dims)), dtype=np.int64)


def _opt(values: list[np.ndarray], i: int) -> np.ndarray | None:
    return values[i] if len(values) > i else None


def _gather(node, results, shapes):
    v = _vals(results)
    if v is None:
        return None
    return np.take(v[0], v[1], axis=int(attribute(node, "axis", 0)))  # type: ignore[arg-type]


def _slice(node, results, shapes):
    v = _vals(results)
    if v is None:
        return None
    data, starts, ends = v[0], v[1], v[2]
    axes = _opt(v, 3)
    steps = _opt(v, 4)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        index[a] = slice(int(s), int(e), st)
    return data[tuple(index)]


def _concat(node, results, shapes):
    v = _vals(results)
    return None if v is None else np.concatenate(v, axis=int(attribute(node, "axis", 0)))  # type: ignore[arg-type]


def _axes(node, v: list[np.ndarray]) -> list[int] | None:
    axes = attribute(node, "axes", None)
    if axes is None and len(v) > 1:
        axes = v[1].tolist()
    return None if axes is None else [int(a) for a in axes]  # type: ignore[union-attr]


def _unsqueeze(node, results, shapes):
    v = _vals(results)
    if v is None:
        return None
    out = v[0]
    rank = out.ndim + len(_axes(node, v) or [])
    for a in sorted(a % rank for a in _axes(node, v) or []):
        out = np.expand_dims(out, a)
    return out


def _squeeze(node, results, shapes):
    v = _vals(results)
    if v is None:
        return None
    axes = _axes(node, v)
    return np.squeeze(v[0]) if axes is None else np.squeeze(v[0], axis=tuple(axes))


def _cast(node, results, shapes):
    v = _vals(results)
    if v is None:
        return None
    return v[0].astype(helper.tensor_dtype_to_np_dtype(int(attribute(node, "to"))))  # type: ignore[arg-type]


def _elementwise(fn: Callable[..., np.ndarray]) -> Evaluator:
    def evaluate(node, results, shapes):
        v = _vals(results)
        return None if v is None else np.asarray(fn(*v))
    return evaluate


def _identity(node, results, shapes):
    v = _vals(results)
    return None if v is None else v[0]


EVALUATORS: dict[str, Evaluator] = {
    "Shape": _shape, "Size": _size, "Gather": _gather, "Slice": _slice, "Concat": _concat,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Cast": _cast, "Identity": _identity,
    "Equal": _elementwise(np.equal), "Not": _elementwise(np.logical_not),
    "And": _elementwise(np.logical_and), "Or": _elementwise(np.logical_or),
    "Greater": _elementwise(np.greater), "Less": _elementwise(np.less),
    "Add": _elementwise(np.add), "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply),
}
SHAPE_OPS = ("Shape", "Size")  # need only their input's static shape, not its value


class ConstantResults:
    """The classification of every value of every graph of a model, by graph path
    (functions' values stay dynamic: their inputs come from each call site)."""

    def __init__(self, tables: dict[tuple[str, ...], dict[str, ValueResult]]) -> None:
        self._tables = tables

    def result(self, scope: Scope | None, name: str) -> ValueResult:
        """What ``name`` is as seen from ``scope`` (innermost definition wins)."""
        while scope is not None:
            table = self._tables.get(scope.path)
            if table is not None and name in table:
                return table[name]
            scope = scope.parent
        return DYNAMIC

    def known(self, scope: Scope | None, name: str) -> np.ndarray | None:
        """The small known value of ``name``, or None (the passes' ``known`` hook)."""
        r = self.result(scope, name)
        return r.value if r.kind == ValueKind.KNOWN else None

    def counts(self) -> dict[str, int]:
        out = {k.value: 0 for k in ValueKind}
        for table in self._tables.values():
            for r in table.values():
                out[r.kind.value] += 1
        return out


def static_shapes(model: onnx.ModelProto) -> dict[tuple[str, ...], Shapes]:
    """Value name -> fully static dims (or None), per graph path, from onnx's shape
    inference over the metadata model (types and dims only: payloads are not needed)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        inferred = model
    out: dict[tuple[str, ...], Shapes] = {}
    for scope in iter_scopes(inferred, functions=False):
        g = scope.container
        table: Shapes = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            table[vi.name] = _dims(vi)
        for t in g.initializer:
            table[t.name] = tuple(int(d) for d in t.dims)
        out[scope.path] = table
    return out


def _dims(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def analyze(model: onnx.ModelProto, limit: int = SMALL_VALUE_LIMIT) -> ConstantResults:
    """Classify every value of ``model``'s graphs, outer graphs before their subgraphs."""
    shapes = static_shapes(model)
    tables: dict[tuple[str, ...], dict[str, ValueResult]] = {}
    results = ConstantResults(tables)
    for scope in iter_scopes(model, functions=False):
        g = scope.container
        table: dict[str, ValueResult] = {}
        tables[scope.path] = table
        dims = shapes.get(scope.path, {})
        for name in input_names(g):
            table[name] = DYNAMIC
        for name, t in initializers(g).items():
            if name not in table:
                value = small_value(t)
                table[name] = CONSTANT if value is None else ValueResult(ValueKind.KNOWN, value)
        for node in g.node:
            outcome = _node_result(scope, node, results, dims, limit)
            for o in node.output:
                if o:
                    table[o] = outcome
    return results


def _node_result(scope: Scope, node: onnx.NodeProto, results: ConstantResults,
                 dims: Shapes, limit: int) -> ValueResult:
    standard = node.domain in STANDARD_DOMAINS
    if is_constant(node):
        value = constant_node_value(node)
        return CONSTANT if value is None else ValueResult(ValueKind.KNOWN, value)
    inputs = [results.result(scope, name) if name else ValueResult(ValueKind.KNOWN, None)
              for name in node.input]
    evaluator = EVALUATORS.get(node.op_type) if standard and len(node.output) == 1 else None
    if evaluator is not None:
        try:
            with np.errstate(all="ignore"):  # NaN, overflow: IEEE results, as a runtime's
                value = evaluator(node, [r for r in inputs],
                                  [dims.get(n) for n in node.input])
        except (ValueError, IndexError, TypeError, KeyError):
            value = None
        if value is not None and value.nbytes <= limit:
            return ValueResult(ValueKind.KNOWN, np.asarray(value))
    if (standard and node.input and node.op_type not in NONDETERMINISTIC
            and node.op_type not in SHAPE_OPS and not node_subgraphs(node)
            and all(r.kind != ValueKind.DYNAMIC for r in inputs)):
        return CONSTANT
    if standard and node.op_type in SHAPE_OPS and inputs and inputs[0].kind != ValueKind.DYNAMIC:
        return CONSTANT
    return DYNAMIC
