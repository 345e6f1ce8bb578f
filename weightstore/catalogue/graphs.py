"""Walking every graph and function of a model."""

from __future__ import annotations

from collections.abc import Iterator

from ..io.onnx_proto import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto

Container = GraphProto | FunctionProto


def iter_containers(model: ModelProto) -> Iterator[tuple[Container, str]]:
    """Yield ``(graph or function, readable name)`` for the main graph, training graphs,
    functions and every subgraph at any depth.

    A container's subgraphs are looked up only after the caller has resumed the generator,
    so a caller may edit the container's nodes in place while walking.
    """
    stack: list[tuple[Container, str]] = [(model.graph, f"graph '{model.graph.name}'")]
    for info in model.training_info:
        stack += [(info.initialization, "training initialization"),
                  (info.algorithm, "training algorithm")]
    stack += [(f, f"function {f.domain}:{f.name}") for f in model.functions]
    while stack:
        container, where = stack.pop()
        yield container, where
        for node in container.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append((attr.g, f"graph '{attr.g.name}'"))
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend((g, f"graph '{g.name}'") for g in attr.graphs)


def iter_nodes(model: ModelProto) -> Iterator[NodeProto]:
    for container, _ in iter_containers(model):
        yield from container.node
