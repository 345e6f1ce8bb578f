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

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..io import onnx_native
from ..io.onnx_arrays import np_dtype
from ..io.onnx_proto import GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto
from ..passes import graphpath
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
Evaluator = Callable[[NodeProto, list[ValueResult], list[tuple[int, ...] | None]],
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
    return v[0].astype(np_dtype(int(attribute(node, "to"))))  # type: ignore[arg-type]


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


@dataclass(frozen=True)
class _Graph:
    """What one graph defines, for lookups: value name -> its definition, where node
    outputs hide inputs and inputs hide initializers (an overridable initializer)."""

    nodes: dict[str, NodeProto]
    inputs: frozenset[str]
    initializers: dict[str, TensorProto]
    declared: Shapes  # fully static dims the graph itself declares

    def defines(self, name: str) -> bool:
        return name in self.nodes or name in self.inputs or name in self.initializers


class ConstantResults:
    """The classification of the values of a model's graphs, by graph path (functions'
    values stay dynamic: their inputs come from each call site).

    Demand-driven: a value is classified when asked, from the values it depends on, each
    once (memoized), so folding an ``If`` costs the cone of its condition, not the graph.
    A ``Shape`` or ``Size`` whose input's dims the graph declares needs nothing else;
    onnx's shape inference runs at most once, and only when one needs dims it does not.
    The model must not change while the results are in use.
    """

    def __init__(self, model: ModelProto, limit: int = SMALL_VALUE_LIMIT) -> None:
        self._model = model
        self._limit = limit
        self._graphs: dict[tuple[str, ...], _Graph | None] = {}
        self._memo: dict[tuple[tuple[str, ...], str], ValueResult] = {}
        self._unknown: set[tuple[tuple[str, ...], str]] = set()  # known not to be known
        self._inferred: ModelProto | None = None  # onnx's shape inference, once
        self._inferred_dims: dict[tuple[str, ...], Shapes] = {}

    def result(self, scope: Scope | None, name: str) -> ValueResult:
        """What ``name`` is as seen from ``scope`` (innermost definition wins)."""
        found = self._defining(scope, name)
        out = DYNAMIC if found is None else self._evaluate(found, name)
        assert out is not None
        return out

    def known(self, scope: Scope | None, name: str) -> np.ndarray | None:
        """The small known value of ``name``, or None (the passes' ``known`` hook)."""
        found = self._defining(scope, name)
        r = None if found is None else self._evaluate(found, name, known_only=True)
        return r.value if r is not None and r.kind == ValueKind.KNOWN else None

    def counts(self) -> dict[str, int]:
        """How many values of each kind the model's graphs hold (classifies them all)."""
        out = {k.value: 0 for k in ValueKind}
        for scope in iter_scopes(self._model, functions=False):
            g = self._graph(scope)
            assert g is not None
            names = dict.fromkeys([*g.inputs, *g.initializers, *g.nodes])
            for name in names:  # nodes in graph order: dependencies are already known
                out[self._evaluate(scope, name).kind.value] += 1
        return out

    # -- lookups ---------------------------------------------------------------------

    def _graph(self, scope: Scope) -> _Graph | None:
        """The index of ``scope``'s graph, made on first use; None inside a function."""
        if scope.path in self._graphs:
            return self._graphs[scope.path]
        root = scope
        while root.parent is not None:
            root = root.parent
        g = None
        if not root.is_function:
            c = scope.container
            declared: Shapes = {}
            for vi in [*c.input, *c.value_info, *c.output]:
                dims = _dims(vi)
                if dims is not None:
                    declared[vi.name] = dims
            inits = initializers(c)
            declared.update((n, tuple(int(d) for d in t.dims)) for n, t in inits.items())
            g = _Graph({o: node for node in c.node for o in node.output if o},
                       frozenset(input_names(c)), inits, declared)
        self._graphs[scope.path] = g
        return g

    def _defining(self, scope: Scope | None, name: str) -> Scope | None:
        """The innermost scope from ``scope`` outwards that defines ``name``."""
        while scope is not None:
            g = self._graph(scope)
            if g is None:
                return None
            if g.defines(name):
                return scope
            scope = scope.parent
        return None

    def _dims(self, scope: Scope, name: str) -> tuple[int, ...] | None:
        """Static dims of ``name`` in ``scope``'s own graph: declared, else inferred."""
        g = self._graph(scope)
        if g is not None and name in g.declared:
            return g.declared[name]
        table = self._inferred_dims.get(scope.path)
        if table is None:
            if self._inferred is None:
                self._inferred = inferred_model(self._model)
            table = self._inferred_dims[scope.path] = _static_dims(
                graphpath.resolve(self._inferred, scope.path))
        return table.get(name)

    # -- evaluation ------------------------------------------------------------------

    def _evaluate(self, scope: Scope, name: str, known_only: bool = False,
                  ) -> ValueResult | None:
        """The result of ``name`` defined in ``scope``; the values it depends on first,
        by an explicit stack (a long chain is no deep recursion).

        With ``known_only`` only whether the value is *known* is decided (None: it is
        not, constant or dynamic alike): a value is known only through evaluators over
        known values, so the walk follows evaluators and stops at any other node, where
        a full classification would follow every input back to the graph's inputs.
        """
        key = (scope.path, name)
        if key in self._memo:
            return self._memo[key]
        if known_only and key in self._unknown:
            return None
        stack = [(scope, name)]
        open_: set[tuple[tuple[str, ...], str]] = {key}
        while stack:
            s, n = stack[-1]
            g = self._graph(s)
            assert g is not None
            node = g.nodes.get(n)
            wanted = [] if node is None else (
                _known_inputs(node) if known_only else _inputs_needed(node, self, s))
            needed = [(d, i) for i in wanted for d in [self._defining(s, i)]
                      if d is not None and (d.path, i) not in self._memo
                      and not (known_only and (d.path, i) in self._unknown)]
            fresh = [(d, i) for d, i in needed if (d.path, i) not in open_]
            if fresh:
                for d, i in fresh:
                    open_.add((d.path, i))
                stack.extend(fresh)
                continue
            for d, i in needed:  # a cycle (not a valid graph): nothing is known of it
                self._memo[(d.path, i)] = DYNAMIC
            outcome: ValueResult | None
            if node is not None:
                outcome = (_known_result(s, node, self, self._limit) if known_only
                           else _node_result(s, node, self, self._limit))
            elif n in g.inputs:
                outcome = DYNAMIC
            else:
                value = small_value(g.initializers[n])
                outcome = CONSTANT if value is None else ValueResult(ValueKind.KNOWN, value)
            if outcome is None:
                self._unknown.add((s.path, n))
            else:
                self._memo[(s.path, n)] = outcome
            stack.pop()
        return self._memo.get(key)

    def _settled(self, scope: Scope, name: str) -> ValueResult | None:
        """The result already decided for ``name`` as seen from ``scope``, if any."""
        found = self._defining(scope, name)
        return DYNAMIC if found is None else self._memo.get((found.path, name))


class ValueCounts(Mapping[str, int]):
    """:meth:`ConstantResults.counts`, taken on first read: classifying every value costs
    the whole graph, which a report of the resolution wants and a load does not."""

    def __init__(self, results: ConstantResults | None) -> None:
        self._results = results
        self._counts: dict[str, int] | None = None

    def _get(self) -> dict[str, int]:
        if self._counts is None:
            self._counts = {} if self._results is None else self._results.counts()
            self._results = None
        return self._counts

    def __getitem__(self, key: str) -> int:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def inferred_model(model: ModelProto) -> ModelProto:
    """``model`` with onnx's shape inference applied (types and dims only: payloads are
    not needed); the model itself when inference fails."""
    try:
        return onnx_native.infer_shapes(model, data_prop=True)
    except Exception:
        return model


def _static_dims(g: GraphProto) -> Shapes:
    """Value name -> fully static dims (or None) of what one graph declares."""
    table: Shapes = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        table[vi.name] = _dims(vi)
    for t in g.initializer:
        table[t.name] = tuple(int(d) for d in t.dims)
    return table


def _dims(vi: ValueInfoProto) -> tuple[int, ...] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def analyze(model: ModelProto, limit: int = SMALL_VALUE_LIMIT) -> ConstantResults:
    """The constant results of ``model``'s graphs, each value classified when asked."""
    return ConstantResults(model, limit)


def _decided(node: NodeProto) -> ValueResult | None:
    """A node's result when it does not depend on its inputs' results."""
    if is_constant(node):
        value = constant_node_value(node)
        return CONSTANT if value is None else ValueResult(ValueKind.KNOWN, value)
    if (node.domain not in STANDARD_DOMAINS or not node.input
            or node.op_type in NONDETERMINISTIC or node_subgraphs(node)):
        return DYNAMIC  # unknown semantics, effects, randomness or control flow
    return None


def _inputs_needed(node: NodeProto, results: ConstantResults,
                   scope: Scope) -> list[str]:
    """The inputs whose results decide ``node``'s: none for a Shape or Size whose input
    has static dims, nor for a node decided by itself."""
    if _decided(node) is not None:
        return []
    if node.op_type in SHAPE_OPS:
        if results._dims(scope, node.input[0]) is not None:
            return []
        return [node.input[0]] if node.input[0] else []
    return [name for name in node.input if name]


def _known_inputs(node: NodeProto) -> list[str]:
    """The inputs whose values an evaluator needs: none for any other node (its value is
    never known but by itself), nor for a Shape or Size (their input's dims suffice)."""
    if (_decided(node) is not None or node.op_type in SHAPE_OPS or len(node.output) != 1
            or node.op_type not in EVALUATORS):
        return []
    return [name for name in node.input if name]


def _known_result(scope: Scope, node: NodeProto, results: ConstantResults,
                  limit: int) -> ValueResult | None:
    """``node``'s result when it is known (or decided by the node alone); None when its
    value is not known (its inputs' results as :func:`_known_inputs` asked are settled)."""
    decided = _decided(node)
    if decided is not None:
        return decided
    evaluator = EVALUATORS.get(node.op_type) if len(node.output) == 1 else None
    if evaluator is None:
        return None
    inputs: list[ValueResult] = []
    dims: list[tuple[int, ...] | None] = []
    if node.op_type in SHAPE_OPS:
        dims = [results._dims(scope, node.input[0])]
        if dims[0] is None:
            return None
    else:
        for name in node.input:
            r = results._settled(scope, name) if name else ValueResult(ValueKind.KNOWN, None)
            if r is None or r.kind != ValueKind.KNOWN:
                return None
            inputs.append(r)
    try:
        with np.errstate(all="ignore"):  # NaN, overflow: IEEE results, as a runtime's
            value = evaluator(node, inputs, dims)
    except (ValueError, IndexError, TypeError, KeyError):
        value = None
    if value is not None and value.nbytes <= limit:
        return ValueResult(ValueKind.KNOWN, np.asarray(value))
    return None


def _node_result(scope: Scope, node: NodeProto, results: ConstantResults,
                 limit: int) -> ValueResult:
    decided = _decided(node)
    if decided is not None:
        return decided
    if node.op_type in SHAPE_OPS:
        dims = results._dims(scope, node.input[0])
        if dims is not None and len(node.output) == 1:
            try:
                value = EVALUATORS[node.op_type](node, [], [dims])
            except (ValueError, IndexError, TypeError, KeyError):
                value = None
            if value is not None and value.nbytes <= limit:
                return ValueResult(ValueKind.KNOWN, np.asarray(value))
        first = results.result(scope, node.input[0]) if node.input[0] else CONSTANT
        return CONSTANT if first.kind != ValueKind.DYNAMIC else DYNAMIC
    inputs = [results.result(scope, name) if name else ValueResult(ValueKind.KNOWN, None)
              for name in node.input]
    evaluator = EVALUATORS.get(node.op_type) if len(node.output) == 1 else None
    if evaluator is not None:
        try:
            with np.errstate(all="ignore"):  # NaN, overflow: IEEE results, as a runtime's
                value = evaluator(node, inputs, [])
        except (ValueError, IndexError, TypeError, KeyError):
            value = None
        if value is not None and value.nbytes <= limit:
            return ValueResult(ValueKind.KNOWN, np.asarray(value))
    if all(r.kind != ValueKind.DYNAMIC for r in inputs):
        return CONSTANT
    return DYNAMIC
