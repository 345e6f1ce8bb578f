"""Every TensorProto in a parsed model, named by the same structural path the reader uses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx
from google.protobuf.message import Message

from .schema import CHILDREN, Kind, Path, path_str

Role = str  # "initializer" | "constant" | "attribute" | "sparse"


@dataclass(frozen=True)
class TensorSite:
    """Where one tensor lives: its path, a readable location, and its owner objects."""

    path: Path
    tensor: onnx.TensorProto
    role: Role
    where: str  # e.g. "graph 'main' initializer 'W'" or "function local:Gelu node 3 (Constant)"
    container: onnx.GraphProto | onnx.FunctionProto | None
    index: int  # initializer index or node index in the container
    node: onnx.NodeProto | None = None
    scope: tuple[str, ...] = ()  # graphs from the root to the container, readable

    @property
    def value_name(self) -> str:
        """The graph value the tensor defines: initializer name or Constant output."""
        if self.role == "initializer":
            return self.tensor.name
        if self.role == "constant" and self.node is not None and self.node.output:
            return self.node.output[0]
        return ""

    @property
    def key(self) -> str:
        return path_str(self.path)

    @property
    def function(self) -> str | None:
        """``domain:name`` of the model-local function holding the tensor, if any."""
        if isinstance(self.container, onnx.FunctionProto):
            return f"{self.container.domain}:{self.container.name}"
        return None


@dataclass(frozen=True)
class _Context:
    container: Message | None = None
    node: onnx.NodeProto | None = None
    index: int = -1
    role: Role | None = None
    scope: tuple[str, ...] = ()


def _describe(container: Message) -> str:
    if isinstance(container, onnx.FunctionProto):
        return f"function {container.domain}:{container.name}"
    return f"graph '{container.name}'"


def iter_tensor_sites(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Yield every tensor in ``model``, depth first, in file-independent structural order."""
    yield from _walk(model, Kind.MODEL, (), _ROOT)


_ROOT = _Context()
# kind -> (field number, field name, child kind, repeated) for the fields leading to tensors
_FIELDS: dict[Kind, tuple[tuple[int, str, Kind, bool], ...]] = {}


def _fields(msg: Message, kind: Kind) -> tuple[tuple[int, str, Kind, bool], ...]:
    out = _FIELDS.get(kind)
    if out is None:
        by_number = msg.DESCRIPTOR.fields_by_number
        out = _FIELDS[kind] = tuple((number, by_number[number].name, child, repeated)
                                    for number, (child, repeated) in CHILDREN[kind].items())
    return out


def _walk(msg: Message, kind: Kind, path: Path, ctx: _Context) -> Iterator[TensorSite]:
    if kind is Kind.TENSOR:
        where = _describe(ctx.container) if ctx.container is not None else "model"
        if ctx.role == "initializer":
            where += f" initializer '{msg.name}'"
        elif ctx.node is not None:
            where += f" node {ctx.index} ({ctx.node.op_type} '{ctx.node.name}')"
        yield TensorSite(path, msg, ctx.role or "attribute", where, ctx.container, ctx.index,
                         ctx.node, ctx.scope)
        return
    for number, name, child_kind, repeated in _fields(msg, kind):
        if repeated:
            values = getattr(msg, name)
            if not values:
                continue
        elif msg.HasField(name):
            values = (getattr(msg, name),)
        else:
            continue
        holds = _HOLDS.get(child_kind)
        for i, value in enumerate(values):
            if holds is not None and not holds(value):
                continue  # nothing below: no context, path or generator made for it
            yield from _walk(value, child_kind, (*path, (number, i)),
                             _child(ctx, msg, kind, child_kind, value, i, repeated))


def _attribute_holds(attr: onnx.AttributeProto) -> bool:
    """Does an attribute hold a tensor, a graph or a sparse tensor (most hold a number)?"""
    return (attr.HasField("t") or attr.HasField("g") or attr.HasField("sparse_tensor")
            or len(attr.tensors) > 0 or len(attr.graphs) > 0 or len(attr.sparse_tensors) > 0)


# kind -> whether a message of that kind may lead to a tensor, where a cheap test tells
_HOLDS = {
    Kind.ATTRIBUTE: _attribute_holds,
    Kind.NODE: lambda node: any(_attribute_holds(a) for a in node.attribute),
}


def _child(ctx: _Context, msg: Message, kind: Kind, child_kind: Kind, value: Message, i: int,
           repeated: bool) -> _Context:
    """The context of the ``i``-th ``child_kind`` value found in ``msg`` (of ``kind``)."""
    if child_kind in (Kind.GRAPH, Kind.FUNCTION):
        if kind is Kind.ATTRIBUTE and ctx.node is not None:
            label = f"{ctx.node.op_type} '{ctx.node.name}' {msg.name}"
            label += f"[{i}]" if repeated else ""
        elif kind is Kind.TRAINING:
            label = f"training {value.name or 'graph'}"
        else:
            label = _describe(value)
        return _Context(value, None, -1, None, (*ctx.scope, label))
    if child_kind is Kind.NODE:
        return _Context(ctx.container, value, i, None, ctx.scope)
    if child_kind is Kind.TENSOR:
        if kind is Kind.GRAPH:
            return _Context(ctx.container, None, i, "initializer", ctx.scope)
        if kind is Kind.SPARSE:
            return _Context(ctx.container, ctx.node, ctx.index, "sparse", ctx.scope)
        node = ctx.node
        if (kind is Kind.ATTRIBUTE and node is not None and node.op_type == "Constant"
                and node.domain in ("", "ai.onnx") and msg.name == "value"):
            return _Context(ctx.container, node, ctx.index, "constant", ctx.scope)
        return _Context(ctx.container, node, ctx.index, "attribute", ctx.scope)
    return ctx
