"""Graph facts the passes share: scopes, who reads a value, names, small constants.

ONNX subgraphs (If/Loop/Scan bodies) read values of their enclosing graphs by name, so
"who uses this initializer" must count a node whose subgraph captures it, and a name
defined inside a subgraph hides an outer one. These helpers answer such questions once,
for graphs and model-local functions alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..io.onnx_arrays import from_array
from ..io.onnx_proto import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    attribute_value,
)
from .base import small_value
from .graphpath import Container, function_hop, node_hop

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Scope:
    """A graph (or function body) with its graph path and its enclosing scope."""

    path: tuple[str, ...]
    container: Container
    parent: Scope | None = None

    @property
    def is_function(self) -> bool:
        return isinstance(self.container, FunctionProto)


def node_subgraphs(node: NodeProto) -> list[tuple[str, GraphProto]]:
    """(graph-path hop relative to the node's position, graph) for each subgraph; the hop
    is completed with the node's position by :func:`child_scopes`."""
    out: list[tuple[str, GraphProto]] = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.append((a.name, a.g))
        elif a.type == AttributeProto.GRAPHS:
            out.extend((f"{a.name}:{k}", g) for k, g in enumerate(a.graphs))
    return out


def child_scopes(scope: Scope, index: int) -> list[Scope]:
    """The subgraphs of the node at ``index`` of ``scope``."""
    node = scope.container.node[index]
    out = []
    for hop, g in node_subgraphs(node):
        attribute, _, k = hop.partition(":")
        out.append(Scope((*scope.path, node_hop(index, attribute, int(k) if k else None)),
                         g, scope))
    return out


def iter_scopes(model: ModelProto, *, functions: bool = True) -> Iterator[Scope]:
    """Every graph, depth first (each graph before its subgraphs), then every function."""
    roots = [Scope((), model.graph)]
    if functions:
        roots += [Scope((function_hop(f),), f) for f in model.functions]
    for root in roots:
        stack = [root]
        while stack:
            scope = stack.pop()
            yield scope
            children = [c for i in range(len(scope.container.node))
                        for c in child_scopes(scope, i)]
            stack.extend(reversed(children))


# -- names ----------------------------------------------------------------------------------

def input_names(c: Container) -> list[str]:
    return list(c.input) if isinstance(c, FunctionProto) else [i.name for i in c.input]


def output_names(c: Container) -> list[str]:
    return list(c.output) if isinstance(c, FunctionProto) else [o.name for o in c.output]


def initializers(c: Container) -> dict[str, TensorProto]:
    return {t.name: t for t in getattr(c, "initializer", ())}


def declared_names(c: Container) -> set[str]:
    """Names a graph has before any node runs: inputs and initializers (dense and
    sparse)."""
    return (set(input_names(c)) | set(initializers(c))
            | {t.values.name for t in getattr(c, "sparse_initializer", ())})


def defined_names(c: Container) -> set[str]:
    """Names this graph defines itself: inputs, initializers and node outputs."""
    return declared_names(c) | {o for n in c.node for o in n.output if o}


def free_names(g: Container) -> set[str]:
    """Names ``g`` reads from enclosing scopes (its nodes, nested subgraphs and outputs)."""
    used = set(output_names(g))
    for node in g.node:
        used |= node_reads(node)
    return used - defined_names(g)


def node_reads(node: NodeProto) -> set[str]:
    """Names a node reads: its inputs and what its subgraphs capture."""
    out = {i for i in node.input if i}
    for _, g in node_subgraphs(node):
        out |= free_names(g)
    return out


def name_problem(model: ModelProto) -> tuple[str, str] | None:
    """The first way the model's value names are not well formed, as (what, name): a value
    the main graph or a function reads that nothing defines, or a value a graph defines
    twice (two node outputs, or a node output named as an input or initializer). None
    when there is none. onnxruntime refuses such a graph; resolution says so first."""
    for scope in iter_scopes(model):
        c = scope.container
        if scope.parent is None:  # nothing encloses it: every name read is its own
            free = free_names(c)
            if free:
                return "a value is read that nothing defines", min(free)
        seen = declared_names(c)
        for node in c.node:
            for name in node.output:
                if name in seen:
                    return "a value is defined twice", name
                if name:
                    seen.add(name)
    return None


def readers(c: Container) -> dict[str, list[int]]:
    """Value name -> positions of the nodes of ``c`` reading it (directly or by capture)."""
    out: dict[str, list[int]] = {}
    for i, node in enumerate(c.node):
        for name in sorted(node_reads(node)):
            out.setdefault(name, []).append(i)
    return out


def producers(c: Container) -> dict[str, int]:
    """Value name -> position of the node of ``c`` producing it."""
    return {o: i for i, n in enumerate(c.node) for o in n.output if o}


def model_names(model: ModelProto) -> set[str]:
    """Every value name anywhere in the model, for choosing names that collide with none."""
    out: set[str] = set()
    for scope in iter_scopes(model):
        c = scope.container
        out |= set(input_names(c)) | set(output_names(c)) | set(initializers(c))
        for node in c.node:
            out |= set(node.input) | set(node.output)
        out |= {v.name for v in getattr(c, "value_info", ())}
    out.discard("")
    return out


def node_names(model: ModelProto) -> set[str]:
    return {n.name for s in iter_scopes(model) for n in s.container.node if n.name}


def tensor_name_counts(model: ModelProto) -> dict[str, int]:
    """How many initializers and Constant tensors carry each value name, model-wide.

    A derived weight's sources are looked up by name in the base model, so a pass only
    names sources whose name is carried by exactly one tensor.
    """
    counts: dict[str, int] = {}
    for scope in iter_scopes(model):
        for name in initializers(scope.container):
            counts[name] = counts.get(name, 0) + 1
        for node in scope.container.node:
            if is_constant(node) and node.output:
                counts[node.output[0]] = counts.get(node.output[0], 0) + 1
    return counts


class NameAllocator:
    """Fresh names: the wanted one if free, else ``<wanted>.<k>`` for the first free k."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken)

    def fresh(self, wanted: str) -> str:
        name, k = wanted, 0
        while name in self.taken or not name:
            k += 1
            name = f"{wanted}.{k}"
        self.taken.add(name)
        return name


# -- facts about nodes and values -----------------------------------------------------------

def opset_version(model: ModelProto, domain: str = "") -> int:
    """The model's opset for ``domain`` ("" and "ai.onnx" are the same); 0 if absent."""
    wanted = STANDARD_DOMAINS if domain in STANDARD_DOMAINS else (domain,)
    return max((o.version for o in model.opset_import if o.domain in wanted), default=0)


def is_standard(node: NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in STANDARD_DOMAINS


def is_constant(node: NodeProto) -> bool:
    return is_standard(node, "Constant")


def attribute(node: NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            return attribute_value(a)
    return default


def constant_node_value(node: NodeProto) -> np.ndarray | None:
    """The value of a Constant node when it is small and inline; None otherwise."""
    for a in node.attribute:
        if a.name == "value" and a.type == AttributeProto.TENSOR:
            return small_value(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(attribute_value(a)))
    return None


def known_value(scope: Scope | None, name: str) -> np.ndarray | None:
    """The value of ``name`` as seen from ``scope`` when it is a small known constant.

    Looks in the innermost scope defining ``name`` (a local definition hides outer ones): an
    initializer that is not also a graph input (which a caller could override), or the
    output of a Constant node. Anything else is unknown.
    """
    while scope is not None:
        c = scope.container
        if name in input_names(c):
            return None
        inits = initializers(c)
        if name in inits:
            return small_value(inits[name])
        for node in c.node:
            if name in node.output:
                return constant_node_value(node) if is_constant(node) else None
        scope = scope.parent
    return None


def constant_weights(c: Container) -> dict[str, tuple[int, TensorProto]]:
    """Value name -> (position, tensor) of the Constant nodes of ``c`` holding a tensor.

    Several exporters (Paddle2ONNX, older tf2onnx) keep weights in Constant nodes, often in
    typed fields (``float_data``): they are weights exactly as initializers are.
    """
    out: dict[str, tuple[int, TensorProto]] = {}
    for i, node in enumerate(c.node):
        if is_constant(node) and len(node.output) == 1 and node.output[0]:
            for a in node.attribute:
                if a.name == "value" and a.type == AttributeProto.TENSOR:
                    out[node.output[0]] = (i, a.t)
    return out


def graph_weights(c: Container) -> Iterator[tuple[str, TensorProto, int | None]]:
    """(value name, tensor, Constant node position or None) of every fixed weight of ``c``:
    initializers that are not graph inputs, then Constant-node tensors."""
    inputs = set(input_names(c))
    for t in getattr(c, "initializer", ()):
        if t.name not in inputs:
            yield t.name, t, None
    for name, (i, t) in constant_weights(c).items():
        yield name, t, i


def weight(c: Container, name: str) -> TensorProto | None:
    """The fixed weight ``name`` of ``c`` (an initializer that is not an overridable input,
    or a Constant node's tensor), as a declaration named after its value."""
    if name in input_names(c):
        return None
    inits = initializers(c)
    if name in inits:
        return inits[name]
    found = constant_weights(c).get(name)
    return None if found is None else without_payload(found[1], name)


def removable_weights(c: Container, names: Iterable[str], removed: Iterable[int],
                      reads: dict[str, list[int]]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Those of ``names`` that no node but the ``removed`` ones reads, safe to drop together:
    (initializer names, positions of the Constant nodes holding the others).

    Graph outputs and graph inputs are kept. Two records of one batch never both drop a
    weight this way, since each needs every reader among its own removed nodes.
    """
    gone = set(removed)
    keep = set(output_names(c)) | set(input_names(c))
    inits = initializers(c)
    constants = constant_weights(c)
    out: list[str] = []
    nodes: list[int] = []
    for name in names:
        if name in keep or name in out or not set(reads.get(name, ())) <= gone:
            continue
        if name in inits:
            out.append(name)
        elif name in constants and constants[name][0] not in nodes:
            nodes.append(constants[name][0])
    return tuple(out), tuple(nodes)


def without_payload(tensor: TensorProto, name: str | None = None,
                    data_type: int | None = None,
                    dims: Iterable[int] | None = None) -> TensorProto:
    """A declaration of a tensor: name, type and dims only (its bytes come from a recipe)."""
    out = TensorProto(name=tensor.name if name is None else name,
                           data_type=tensor.data_type if data_type is None else data_type)
    out.dims.extend(tensor.dims if dims is None else list(dims))
    return out


def int64_initializer(name: str, values: Iterable[int]) -> TensorProto:
    """A small int64 vector, inline (split sizes and the like)."""
    return from_array(np.array(list(values), dtype=np.int64), name)


def per_graph(model: ModelProto, visit: Callable[..., list], *,
              nodes: bool = False) -> list:
    """Records of ``visit(scope, name counts, value-name allocator)`` over every graph
    (not functions), in model order: the loop every graph-local pass shares. With
    ``nodes``, ``visit`` also gets a node-name allocator, for passes that name nodes."""
    values = NameAllocator(model_names(model))
    counts = tensor_name_counts(model)
    extra = (NameAllocator(node_names(model)),) if nodes else ()
    records: list = []
    for scope in iter_scopes(model, functions=False):
        records += visit(scope, counts, values, *extra)
    return records
