"""cleanup: dead nodes and unused initializers go, in every graph and function.

After a rewrite, the nodes and weights it bypassed are still in the graph; a weight that
stays would still be packaged and read. Liveness starts from each graph's outputs and
follows what live nodes read, including what their subgraphs capture from outside, where
only the live part of a subgraph counts. It is computed to a fixpoint in one go, so one
run removes chains of dead nodes, dead If branches' captures and the weights they read.

Nodes of domains whose semantics are not known here (neither the standard ones nor a
model-local function) are kept, since they may have effects. An initializer that is also
a graph input (a caller may override it) is kept. Only live nodes' subgraphs are visited:
a dead node goes whole.

:func:`prune` does what records cannot express, after records are applied: it drops
``value_info`` of values that no longer exist and model-local functions no longer called.
"""

from __future__ import annotations

from ..io.onnx_proto import FunctionProto, ModelProto, NodeProto
from .analysis import (
    Scope,
    child_scopes,
    defined_names,
    initializers,
    input_names,
    node_subgraphs,
    output_names,
    producers,
)
from .base import PassContext
from .graphpath import Container, function_hop
from .rewriting import LocalRewriting

PURE_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


class Cleanup:
    """The ``cleanup`` pass."""

    name = "cleanup"
    may_find_nothing = True  # a graph the passes before it left clean

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        self._pure = set(PURE_DOMAINS) | {f.domain for f in model.functions}
        self._cache: dict[tuple[str, ...], tuple[set[int], set[str]]] = {}
        roots = [Scope((), model.graph)]
        roots += [Scope((function_hop(f),), f) for f in model.functions]
        records: list[LocalRewriting] = []
        for root in roots:
            records += self._scope(root)
        return records

    def _scope(self, scope: Scope) -> list[LocalRewriting]:
        c = scope.container
        live, needed = self._liveness(c, scope.path)
        dead = tuple(i for i in range(len(c.node)) if i not in live)
        inputs = set(input_names(c))
        unused = tuple(name for name in initializers(c)
                       if name not in needed and name not in inputs)
        records = []
        if dead or unused:
            records.append(LocalRewriting(operation_name=self.name, graph_path=scope.path,
                                          removed_nodes=dead, removed_initializers=unused))
        for i in sorted(live):
            for child in child_scopes(scope, i):
                records += self._scope(child)
        return records

    def _liveness(self, c: Container, key: tuple[str, ...]) -> tuple[set[int], set[str]]:
        """Live node positions of ``c`` (at graph path ``key``) and the names it needs."""
        if key in self._cache:
            return self._cache[key]
        made = producers(c)
        live: set[int] = set()
        needed: set[str] = set()
        work = list(output_names(c))
        for i, node in enumerate(c.node):
            if node.domain not in self._pure:
                work += self._mark(c, key, i, live)
        while work:
            name = work.pop()
            if name in needed:
                continue
            needed.add(name)
            i = made.get(name)
            if i is not None and i not in live:
                work += self._mark(c, key, i, live)
        self._cache[key] = (live, needed)
        return live, needed

    def _mark(self, c: Container, key: tuple[str, ...], i: int, live: set[int]) -> list[str]:
        """Mark node ``i`` live; the names it reads (only live parts of its subgraphs)."""
        live.add(i)
        node = c.node[i]
        reads = [name for name in node.input if name]
        for hop, g in node_subgraphs(node):
            _, inner = self._liveness(g, (*key, f"{i}:{hop}"))
            reads += sorted(inner - defined_names(g))
        return reads


def prune(model: ModelProto) -> None:
    """Drop value_info of values that no longer exist and functions no longer called."""
    _prune_value_info(model.graph, set())
    for f in model.functions:
        _prune_value_info(f, set())
    if not model.functions:
        return
    called = _called_functions(model)
    kept = [f for f in model.functions if _function_key(f) in called]
    if len(kept) != len(model.functions):
        del model.functions[:]
        model.functions.extend(kept)


def _prune_value_info(c: Container, outer: set[str]) -> None:
    visible = outer | defined_names(c)
    infos = list(getattr(c, "value_info", ()))
    kept = [v for v in infos if v.name in visible]
    if len(kept) != len(infos):
        del c.value_info[:]
        c.value_info.extend(kept)
    for node in c.node:
        for _, g in node_subgraphs(node):
            _prune_value_info(g, visible)


def _function_key(f: FunctionProto) -> tuple[str, str, str]:
    return f.domain, f.name, getattr(f, "overload", "")


def _node_key(node: NodeProto) -> tuple[str, str, str]:
    return node.domain, node.op_type, getattr(node, "overload", "")


def _called_functions(model: ModelProto) -> set[tuple[str, str, str]]:
    """Functions reachable from the main graph, directly or through other functions."""
    by_key = {_function_key(f): f for f in model.functions}
    called: set[tuple[str, str, str]] = set()
    work: list[Container] = [model.graph]
    while work:
        c = work.pop()
        for node in c.node:
            key = _node_key(node)
            if key in by_key and key not in called:
                called.add(key)
                work.append(by_key[key])
            work.extend(g for _, g in node_subgraphs(node))
    return called
