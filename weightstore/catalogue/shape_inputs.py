"""Inputs that onnxruntime needs as inline constants.

onnxruntime refuses to load a model whose shape-like input (Reshape's ``shape``, Slice's
``starts``, ...) is external data, so tensors feeding such inputs stay inline whatever their
size. The table is by op_type (standard domain) -> input positions.

A value also reaches a shape-like input through ``Identity`` nodes (onnxruntime's shape
inference reads through them: an exporter's ``Identity`` of a shared shape constant is
enough to fail the load), and when it is passed to a model-local function whose
body (or a function it calls, or a subgraph inside either) uses that formal input at a
shape-like position; the actual arguments at such positions are collected too.

Shape values stay inline as well: small integer vectors and scalars (see
:func:`shape_value_names`). onnxruntime's shape inference propagates the values of shape
arithmetic (``Shape`` -> ``Gather`` -> ``Add`` / ``Concat`` / ``Mod`` ... -> ``Reshape``) and
reads every constant operand on the way, wherever the result goes; which operands it reads
depends on the op and on onnxruntime's version (an exporter's ``Constant`` of ``[1]``
added to a sliced shape is enough), so every such operand is kept, not only those that
reach a shape-like position.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..io.onnx_proto import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
)
from .graphs import iter_containers

SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Range": (0, 1, 2),
    "OneHot": (1,),
    "Split": (1,),
    "SplitToSequence": (1,),
    "CenterCropPad": (1, 2),
    "NonMaxSuppression": (2, 3, 4),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
    "Trilu": (1,),
    "CumSum": (1,),
    "DFT": (1, 2),
    "STFT": (1, 2, 3),
    "AffineGrid": (1,),
    "Col2Im": (1, 2),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Loop": (0, 1),
    # not shape-like, but onnxruntime's constant folding of an If resolves an external
    # condition against the working directory instead of the model's folder
    "If": (0,),
}


FunctionKey = tuple[str, str, str]  # (domain, name, overload)

# onnxruntime's shape inference reads a shape-like input's value through these, whatever
# the tensor behind them (and refuses external data); through Cast, Concat, Add and the
# like it reads only small integer operands, which stay inline as shape values instead
TRANSPARENT = frozenset({"Identity"})

# a shape value: an integer tensor of rank 0 or 1 with at most this many elements (a
# tensor's rank and dims, a slice's bounds, an axis list); larger ones are data
SHAPE_VALUE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
SHAPE_VALUE_ELEMENTS = 64


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _function_key(f: FunctionProto) -> FunctionKey:
    return _domain(f.domain), f.name, getattr(f, "overload", "")


def _call_key(node: NodeProto) -> FunctionKey:
    return _domain(node.domain), node.op_type, getattr(node, "overload", "")


def _direct(node: NodeProto) -> Iterator[str]:
    """Names a standard node consumes at its shape-like positions."""
    if node.domain in ("", "ai.onnx"):
        for i in SHAPE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i]:
                yield node.input[i]


def _producers(nodes: Iterable[NodeProto]) -> dict[str, str]:
    """Output name -> input name of every standard node the shape inference sees through."""
    return {node.output[0]: node.input[0] for node in nodes
            if node.domain in ("", "ai.onnx") and node.op_type in TRANSPARENT
            and node.input and node.output and node.input[0]}


def _close(names: set[str], producers: dict[str, str]) -> set[str]:
    """Add to ``names`` what reaches them through transparent nodes; returns the added."""
    added: set[str] = set()
    stack = list(names)
    while stack:
        source = producers.get(stack.pop())
        if source is not None and source not in names:
            names.add(source)
            added.add(source)
            stack.append(source)
    return added


def _body_nodes(function: FunctionProto) -> Iterator[NodeProto]:
    """Every node of a function body, including those of its subgraphs at any depth."""
    stack: list[FunctionProto | GraphProto] = [function]
    while stack:
        container = stack.pop()
        for node in container.node:
            yield node
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def function_shape_positions(model: ModelProto) -> dict[FunctionKey, frozenset[int]]:
    """For each model-local function, the formal input positions that reach a shape-like input.

    A position counts when the body uses the formal input at a shape-like position of a
    standard node, in a subgraph of the body included, or passes it to another local
    function at a position that counts (a fixpoint, so recursion terminates). Functions
    sharing a key are merged, a subgraph input shadowing a formal input's name is ignored:
    both only err towards keeping a tensor inline.
    """
    keys = [_function_key(f) for f in model.functions]
    # per function: names of its body reaching a shape-like input, formal name -> positions
    reaching: list[set[str]] = []
    formals: list[dict[str, list[int]]] = []
    # callee key -> (calling function index, actual arguments) for every call in a body
    callers: dict[FunctionKey, list[tuple[int, list[str]]]] = {key: [] for key in keys}
    producers: list[dict[str, str]] = []
    for index, function in enumerate(model.functions):
        names: set[str] = set()
        for node in _body_nodes(function):
            names.update(_direct(node))
            sites = callers.get(_call_key(node))
            if sites is not None:
                sites.append((index, list(node.input)))
        producers.append(_producers(_body_nodes(function)))
        _close(names, producers[-1])
        reaching.append(names)
        positions: dict[str, list[int]] = {}
        for i, name in enumerate(function.input):
            positions.setdefault(name, []).append(i)
        formals.append(positions)

    result: dict[FunctionKey, set[int]] = {key: set() for key in keys}
    work: list[tuple[FunctionKey, int]] = []

    def reach(index: int, name: str) -> None:
        if not name or name in reaching[index]:
            return
        reaching[index].add(name)
        for reached in (name, *_close({name}, producers[index]) - reaching[index]):
            reaching[index].add(reached)
            mark(index, reached)

    def mark(index: int, name: str) -> None:
        for i in formals[index].get(name, ()):
            if i not in result[keys[index]]:
                result[keys[index]].add(i)
                work.append((keys[index], i))

    for index, names in enumerate(reaching):
        for name in names:
            mark(index, name)
    while work:
        key, i = work.pop()
        for index, args in callers[key]:
            if i < len(args):
                reach(index, args[i])
    return {key: frozenset(positions) for key, positions in result.items() if positions}


def shape_input_names(model: ModelProto) -> frozenset[str]:
    """Names of every value consumed at a shape-like input anywhere in the model.

    That is, at a shape-like position of a standard node, or passed to a model-local
    function at a position that reaches one (see :func:`function_shape_positions`). Names
    are collected across all graphs and functions: scoping could only make a name shadowed,
    and keeping one extra tensor inline is the safe side.
    """
    positions = function_shape_positions(model) if len(model.functions) else {}
    names: set[str] = set()
    nodes: list[NodeProto] = []
    for container, _ in iter_containers(model):
        nodes.extend(container.node)
        names.update(shape_value_names(container))
    for node in nodes:
        names.update(_direct(node))
        for i in positions.get(_call_key(node), ()):
            if i < len(node.input) and node.input[i]:
                names.add(node.input[i])
    _close(names, _producers(nodes))
    return frozenset(names)


def _is_shape_value(data_type: int, dims: Sequence[int]) -> bool:
    return (data_type in SHAPE_VALUE_TYPES and len(dims) <= 1
            and (not dims or dims[0] <= SHAPE_VALUE_ELEMENTS))


def shape_value_names(container: GraphProto | FunctionProto) -> Iterator[str]:
    """Initializers and ``Constant`` outputs of ``container`` that hold shape values
    (see ``SHAPE_VALUE_TYPES`` and ``SHAPE_VALUE_ELEMENTS``), whoever consumes them."""
    for tensor in getattr(container, "initializer", ()):
        if _is_shape_value(tensor.data_type, tensor.dims):
            yield tensor.name
    for node in container.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        for attr in node.attribute:
            if ((attr.name == "value" and _is_shape_value(attr.t.data_type, attr.t.dims))
                    or attr.name == "value_int"
                    or (attr.name == "value_ints" and len(attr.ints) <= SHAPE_VALUE_ELEMENTS)):
                yield node.output[0]
