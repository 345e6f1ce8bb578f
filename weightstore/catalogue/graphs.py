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


def subgraph_chain(chain: str, node: NodeProto, attribute: str, index: int | None) -> str:
    """The scope chain of a subgraph of ``node`` (in the scope ``chain``): each step names
    the node by its first output (unique where the node stands) and the attribute, so a
    chain survives rewrites that renumber nodes. ``""`` is the main graph's."""
    who = node.output[0] if node.output and node.output[0] else node.name
    return f"{chain}{who}.{attribute}" + (f"[{index}]" if index is not None else "") + "/"


def iter_scoped_containers(model: ModelProto) -> Iterator[tuple[Container, str, str]]:
    """:func:`iter_containers`, each container with its scope chain (``TensorSite.chain``):
    ``""`` for the main graph, ``"<function>/"`` for a model-local function, extended by
    :func:`subgraph_chain` in subgraphs."""
    stack: list[tuple[Container, str, str]] = [
        (model.graph, f"graph '{model.graph.name}'", "")]
    for info in model.training_info:
        stack += [(info.initialization, "training initialization",
                   f"training {info.initialization.name or 'graph'}/"),
                  (info.algorithm, "training algorithm",
                   f"training {info.algorithm.name or 'graph'}/")]
    stack += [(f, f"function {function_label(f)}", f"{function_label(f)}/")
              for f in model.functions]
    while stack:
        container, where, chain = stack.pop()
        yield container, where, chain
        for node in container.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append((attr.g, f"graph '{attr.g.name}'",
                                  subgraph_chain(chain, node, attr.name, None)))
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend((g, f"graph '{g.name}'",
                                  subgraph_chain(chain, node, attr.name, i))
                                 for i, g in enumerate(attr.graphs))


def iter_nodes(model: ModelProto) -> Iterator[NodeProto]:
    for container, _ in iter_containers(model):
        yield from container.node
