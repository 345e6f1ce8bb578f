"""Graph paths: a stable way to name a nested graph or a function from the model's root.

A path is a sequence of hops. The root graph is the empty path. ``"<node>:<attribute>"``
enters the graph attribute of the node at that position; ``"<node>:<attribute>:<k>"`` the
k-th graph of a GRAPHS attribute; a first hop ``"function:<domain>:<name>"`` enters a
model-local function. Positions are those of the graph at the time the path is used, which
is what sequential replay needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ScenarioError
from ..io.onnx_proto import AttributeProto, FunctionProto, GraphProto, ModelProto

Container = GraphProto | FunctionProto

FUNCTION_PREFIX = "function:"


def function_hop(function: FunctionProto) -> str:
    return f"{FUNCTION_PREFIX}{function.domain}:{function.name}"


def node_hop(node_index: int, attribute: str, k: int | None = None) -> str:
    return f"{node_index}:{attribute}" if k is None else f"{node_index}:{attribute}:{k}"


def parse_hop(hop: str) -> tuple[int, str, int | None]:
    """``"12:then_branch"`` -> (12, "then_branch", None)."""
    parts = hop.split(":")
    try:
        if len(parts) == 2:
            return int(parts[0]), parts[1], None
        if len(parts) == 3:
            return int(parts[0]), parts[1], int(parts[2])
    except ValueError:
        pass
    raise ScenarioError("malformed graph path element", element=hop)


def resolve(model: ModelProto, path: Sequence[str]) -> Container:
    """The graph or function that ``path`` names in ``model``."""
    container: Container = model.graph
    hops = list(path)
    if hops and hops[0].startswith(FUNCTION_PREFIX):
        first = hops.pop(0)
        matches = [f for f in model.functions if function_hop(f) == first]
        if len(matches) != 1:
            raise ScenarioError("graph path names no single model-local function",
                                graph_path="/".join(path), element=first)
        container = matches[0]
    for hop in hops:
        index, attribute, k = parse_hop(hop)
        if not 0 <= index < len(container.node):
            raise ScenarioError("graph path names a node that does not exist",
                                graph_path="/".join(path), element=hop)
        attrs = [a for a in container.node[index].attribute if a.name == attribute]
        if len(attrs) != 1:
            raise ScenarioError("graph path names an attribute that does not exist",
                                graph_path="/".join(path), element=hop)
        attr = attrs[0]
        if k is None and attr.type == AttributeProto.GRAPH:
            container = attr.g
        elif k is not None and attr.type == AttributeProto.GRAPHS and 0 <= k < len(
                attr.graphs):
            container = attr.graphs[k]
        else:
            raise ScenarioError("graph path names an attribute that holds no such graph",
                                graph_path="/".join(path), element=hop)
    return container
