"""Every TensorProto in a parsed model, named by the same structural path the reader uses."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from google.protobuf.message import Message

from ..io import onnx_proto
from ..io.onnx_proto import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
)
from .element_types import expected_nbytes
from .graphs import function_label, iter_scoped_containers, subgraph_chain
from .schema import CHILDREN, SMALL_VALUE_LIMIT, Kind, Path, path_str

Role = str  # "initializer" | "constant" | "attribute" | "sparse"


@dataclass(frozen=True)
class TensorSite:
    """Where one tensor lives: its path, a readable location, and its owner objects."""

    path: Path
    tensor: TensorProto
    role: Role
    where: str  # e.g. "graph 'main' initializer 'W'" or "function local:Gelu node 3 (Constant)"
    container: GraphProto | FunctionProto | None
    index: int  # initializer index or node index in the container
    node: NodeProto | None = None
    scope: tuple[str, ...] = ()  # graphs from the root to the container, readable
    chain: str = ""  # the container's scope chain by value names (graphs.subgraph_chain)

    @property
    def value_name(self) -> str:
        """The graph value the tensor defines: initializer name or Constant output."""
        if self.role == "initializer":
            return self.tensor.name
        if self.role == "constant" and self.node is not None and self.node.output:
            return self.node.output[0]
        return ""

    @property
    def scoped_name(self) -> str:
        """The value's name qualified by the scope that defines it: the name itself in
        the main graph, ``<chain><name>`` in a subgraph or a model-local function."""
        return self.chain + (self.value_name or self.tensor.name)

    def value_key(self, ambiguous: Collection[str]) -> str:
        """The value as resolution keys it (manifest entries, payload lookups): its name,
        unless another scope defines a weight of that name too (``ambiguous``, from
        :func:`ambiguous_names`): sibling subgraphs and functions may reuse names, and
        then each definition outside the main graph is keyed by :attr:`scoped_name`."""
        return value_key(self.chain, self.value_name or self.tensor.name, ambiguous)

    @property
    def key(self) -> str:
        return path_str(self.path)

    @property
    def function(self) -> str | None:
        """``domain:name`` of the model-local function holding the tensor, if any."""
        if isinstance(self.container, FunctionProto):
            return f"{self.container.domain}:{self.container.name}"
        return None


ATTRIBUTE_NAME_PREFIX = "weightstore-attribute:"


def name_attribute_tensors(model: ModelProto) -> ModelProto:
    """Name every unnamed tensor a node attribute holds (other than a Constant's value),
    whose values are not metadata, after its place in ``model``: such a tensor defines no
    value, and exporters leave it
    unnamed (torch's module functions put each layer's weight on the call node), so
    resolution and loading, which key weights by name, could not tell two apart.
    onnxruntime and the checker ignore these names, and a scenario's base graph digest
    leaves them out. Resolution applies it to the base model and to its catalogue before
    anything is rewritten, so a name travels with its tensor; packages and conversions
    never carry it."""
    for site in iter_tensor_sites(model):
        t = site.tensor
        if site.role == "attribute" and not t.HasField("name") and _held_apart(t):
            t.name = ATTRIBUTE_NAME_PREFIX + site.key
    return model


def _held_apart(tensor: TensorProto) -> bool:
    """Are the tensor's values kept out of the metadata model (external, or too large to
    be metadata), so that resolution must find them by name? A small value (a
    ``ConstantOfShape`` fill) travels with the metadata and needs none."""
    if tensor.data_location == TensorProto.EXTERNAL:
        return True
    nbytes = expected_nbytes(tensor.data_type, list(tensor.dims))
    return nbytes is None or nbytes > SMALL_VALUE_LIMIT


def unname_attribute_tensors(model: ModelProto) -> ModelProto:
    """Undo :func:`name_attribute_tensors`, for a model written out (as it was read)."""
    for site in iter_tensor_sites(model):
        if site.role == "attribute" and site.tensor.name.startswith(ATTRIBUTE_NAME_PREFIX):
            site.tensor.ClearField("name")
    return model


def value_key(chain: str, name: str, ambiguous: Collection[str]) -> str:
    """The key of value ``name`` defined in scope ``chain`` (see
    :meth:`TensorSite.value_key`; FileConstant outputs are keyed alike)."""
    return chain + name if chain and name in ambiguous else name


@dataclass(frozen=True)
class _Context:
    container: Message | None = None
    node: NodeProto | None = None
    index: int = -1
    role: Role | None = None
    scope: tuple[str, ...] = ()
    chain: str = ""


def _describe(container: Message) -> str:
    if isinstance(container, FunctionProto):
        return f"function {function_label(container)}"
    return f"graph '{container.name}'"


def iter_tensor_sites(model: ModelProto) -> Iterator[TensorSite]:
    """Yield every tensor in ``model``, depth first, in file-independent structural order."""
    yield from _walk(model, Kind.MODEL, (), _ROOT)


_ROOT = _Context()


class _Step:
    """How the walk goes on from a message of one kind: the fields leading to tensors
    (field name, the child's step, repeated?, a cheap test that a child may lead to one).
    Built once, so the walk neither hashes kinds nor looks up descriptors."""

    __slots__ = ("fields", "holds", "kind")

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.fields: tuple[tuple[int, str, _Step, bool], ...] = ()
        self.holds: Callable[[Message], bool] | None = None


def _attribute_holds(attr: AttributeProto) -> bool:
    """Does an attribute hold a tensor, a graph or a sparse tensor (most hold a number)?"""
    return (attr.HasField("t") or attr.HasField("g") or attr.HasField("sparse_tensor")
            or len(attr.tensors) > 0 or len(attr.graphs) > 0 or len(attr.sparse_tensors) > 0)


def _steps() -> dict[Kind, _Step]:
    steps = {kind: _Step(kind) for kind in Kind}
    for kind, step in steps.items():
        fields = getattr(onnx_proto.messages(), kind.value).DESCRIPTOR.fields_by_number
        step.fields = tuple((number, fields[number].name, steps[child], repeated)
                            for number, (child, repeated) in CHILDREN[kind].items())
    steps[Kind.ATTRIBUTE].holds = _attribute_holds
    steps[Kind.NODE].holds = lambda node: any(_attribute_holds(a) for a in node.attribute)
    return steps


_STEPS = _steps()


def iter_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """The tensors of :func:`iter_tensor_sites`, in its order, without their sites (for
    a question about the tensors alone: no path, context or description is made)."""
    stack: list[tuple[Message, _Step]] = [(model, _STEPS[Kind.MODEL])]
    while stack:
        msg, step = stack.pop()
        if step.kind is Kind.TENSOR:
            yield msg  # type: ignore[misc]
            continue
        stack.extend(reversed([(value, child) for _, _, value, child, _ in _children(msg, step)]))


def _children(msg: Message, step: _Step) -> Iterator[tuple[int, int, Message, _Step, bool]]:
    """(field number, index, value, its step, repeated?) of each child that may lead to a
    tensor, in field then index order."""
    for number, name, child, repeated in step.fields:
        if repeated:
            values = getattr(msg, name)
        elif msg.HasField(name):
            values = (getattr(msg, name),)
        else:
            continue
        holds = child.holds
        for i, value in enumerate(values):
            if holds is None or holds(value):  # else nothing below: no context or path made
                yield number, i, value, child, repeated


def _walk(msg: Message, kind: Kind, path: Path, ctx: _Context) -> Iterator[TensorSite]:
    """Depth first, by an explicit stack: a tensor deep in nested subgraphs is yielded
    once, not passed up through a generator per level."""
    stack = [(msg, _STEPS[kind], path, ctx)]
    while stack:
        msg, step, path, ctx = stack.pop()
        if step.kind is Kind.TENSOR:
            where = _describe(ctx.container) if ctx.container is not None else "model"
            if ctx.role == "initializer":
                where += f" initializer '{msg.name}'"
            elif ctx.node is not None:
                where += f" node {ctx.index} ({ctx.node.op_type} '{ctx.node.name}')"
            yield TensorSite(path, msg, ctx.role or "attribute", where, ctx.container,
                             ctx.index, ctx.node, ctx.scope, ctx.chain)
            continue
        stack.extend(reversed([
            (value, child, (*path, (number, i)),
             _child(ctx, msg, step.kind, child.kind, value, i, repeated))
            for number, i, value, child, repeated in _children(msg, step)]))


def _child(ctx: _Context, msg: Message, kind: Kind, child_kind: Kind, value: Message, i: int,
           repeated: bool) -> _Context:
    """The context of the ``i``-th ``child_kind`` value found in ``msg`` (of ``kind``)."""
    if child_kind in (Kind.GRAPH, Kind.FUNCTION):
        chain = ctx.chain
        if kind is Kind.ATTRIBUTE and ctx.node is not None:
            label = f"{ctx.node.op_type} '{ctx.node.name}' {msg.name}"
            label += f"[{i}]" if repeated else ""
            chain = subgraph_chain(chain, ctx.node, msg.name, i if repeated else None)
        elif kind is Kind.TRAINING:
            label = f"training {value.name or 'graph'}"
            chain = f"{label}/"
        else:
            label = _describe(value)
            if child_kind is Kind.FUNCTION:
                chain = f"{function_label(value)}/"
        return _Context(value, None, -1, None, (*ctx.scope, label), chain)
    if child_kind is Kind.NODE:
        return _Context(ctx.container, value, i, None, ctx.scope, ctx.chain)
    if child_kind is Kind.TENSOR:
        if kind is Kind.GRAPH:
            return _Context(ctx.container, None, i, "initializer", ctx.scope, ctx.chain)
        if kind is Kind.SPARSE:
            return _Context(ctx.container, ctx.node, ctx.index, "sparse", ctx.scope,
                            ctx.chain)
        node = ctx.node
        if (kind is Kind.ATTRIBUTE and node is not None and node.op_type == "Constant"
                and node.domain in ("", "ai.onnx") and msg.name == "value"):
            return _Context(ctx.container, node, ctx.index, "constant", ctx.scope, ctx.chain)
        return _Context(ctx.container, node, ctx.index, "attribute", ctx.scope, ctx.chain)
    return ctx


def ambiguous_names(model: ModelProto, sites: Iterable[TensorSite] | None = None,
                    ) -> frozenset[str]:
    """Names that weights of more than one scope define (initializers, Constant and
    FileConstant outputs): keyed by scope wherever they stand outside the main graph
    (:meth:`TensorSite.value_key`). ``sites``: the model's, when already walked."""
    scopes: dict[str, set[str]] = {}
    for site in iter_tensor_sites(model) if sites is None else sites:
        if site.role in ("initializer", "constant") and site.value_name:
            scopes.setdefault(site.value_name, set()).add(site.chain)
    for container, _, chain in iter_scoped_containers(model):
        for node in container.node:
            if node.op_type == "FileConstant" and node.output:
                scopes.setdefault(node.output[0], set()).add(chain)
    return frozenset(name for name, found in scopes.items() if len(found) > 1)
