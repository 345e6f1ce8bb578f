"""Walking every graph and function of a model."""

from __future__ import annotations

from collections.abc import Iterator

from ..io.onnx_proto import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto

Container = GraphProto | FunctionProto


def function_label(function: FunctionProto) -> str:
    """``domain:name``, and ``:overload`` when the function has one (the three identify a
    model-local function)."""
    overload = getattr(function, "overload", "")
    return f"{function.domain}:{function.name}" + (f":{overload}" if overload else "")


def iter_containers(model: ModelProto) -> Iterator[tuple[Container, str]]:
    """Yield ``(graph or function, readable name)`` for the main graph, training graphs,
    functions and every subgraph at any depth.

    A container's subgraphs are looked up only after the caller has resumed the generator,
    so a caller may edit the container's nodes in place while walking.
    """
    for container, where, _ in iter_scoped_containers(model):
        yield container, where


def iter_scoped_containers(model: ModelProto) -> Iterator[tuple[Container, str, str]]:
    """:func:`iter_containers`, each container with the prefix that qualifies its value
    names as resolution keys them: ``""`` in the graphs, ``"<function>/"`` in a
    model-local function and its subgraphs (see ``TensorSite.value_key``)."""
    stack: list[tuple[Container, str, str]] = [
        (model.graph, f"graph '{model.graph.name}'", "")]
    for info in model.training_info:
        stack += [(info.initialization, "training initialization", ""),
                  (info.algorithm, "training algorithm", "")]
    stack += [(f, f"function {function_label(f)}", f"{function_label(f)}/")
              for f in model.functions]
    while stack:
        container, where, prefix = stack.pop()
        yield container, where, prefix
        for node in container.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append((attr.g, f"graph '{attr.g.name}'", prefix))
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend((g, f"graph '{g.name}'", prefix) for g in attr.graphs)


def iter_nodes(model: ModelProto) -> Iterator[NodeProto]:
    for container, _ in iter_containers(model):
        yield from container.node
