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


def _describe(container: Message) -> str:
    if isinstance(container, onnx.FunctionProto):
        return f"function {container.domain}:{container.name}"
    return f"graph '{container.name}'"


def iter_tensor_sites(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Yield every tensor in ``model``, depth first, in file-independent structural order."""
    yield from _walk(model, Kind.MODEL, (), None, None, -1, None)


def _walk(msg: Message, kind: Kind, path: Path, container: Message | None,
          node: onnx.NodeProto | None, index: int, role: Role | None) -> Iterator[TensorSite]:
    if kind is Kind.TENSOR:
        where = _describe(container) if container is not None else "model"
        if role == "initializer":
            where += f" initializer '{msg.name}'"
        elif node is not None:
            where += f" node {index} ({node.op_type} '{node.name}')"
        yield TensorSite(path, msg, role or "attribute", where, container, index, node)
        return
    for number, (child_kind, repeated) in CHILDREN[kind].items():
        fd = msg.DESCRIPTOR.fields_by_number[number]
        if repeated:
            values = list(getattr(msg, fd.name))
        elif msg.HasField(fd.name):
            values = [getattr(msg, fd.name)]
        else:
            values = []
        for i, value in enumerate(values):
            sub = (*path, (number, i))
            if child_kind in (Kind.GRAPH, Kind.FUNCTION):
                yield from _walk(value, child_kind, sub, value, None, -1, None)
            elif child_kind is Kind.NODE:
                yield from _walk(value, child_kind, sub, container, value, i, None)
            elif child_kind is Kind.TENSOR:
                if kind is Kind.GRAPH:
                    sub_role, sub_index = "initializer", i
                elif kind is Kind.SPARSE:
                    sub_role, sub_index = "sparse", index
                elif (kind is Kind.ATTRIBUTE and node is not None and node.op_type == "Constant"
                      and node.domain in ("", "ai.onnx") and msg.name == "value"):
                    sub_role, sub_index = "constant", index
                else:
                    sub_role, sub_index = "attribute", index
                yield from _walk(value, child_kind, sub, container, node, sub_index, sub_role)
            else:
                yield from _walk(value, child_kind, sub, container, node, index, role)
