"""fold-constant-if: an If whose condition is a known constant becomes its chosen branch.

Exporters leave Ifs on flags that are fixed for a deployment (a sample rate, a feature
switch); folding one makes the other branch, and every weight only it reads, dead before
any payload is read. The condition must be a small known value (a Constant node or an
initializer that is not a graph input, looked up through enclosing scopes, or whatever
the context's ``known`` analysis proves, such as ``Equal(Gather(Shape(x), 0), 1)``).

The chosen branch's nodes are inlined into the If's graph at the If's position:

* names the branch defines keep their name when no other definition in the model shares
  it, and get a fresh one otherwise (readers inside the inlined nodes and in their
  subgraphs are rewritten, respecting names those subgraphs define themselves);
* each branch output is renamed to the If's output (a node-produced value), or an Identity
  copies it (an initializer, an outer value, or an output listed twice), so the If's output
  names are preserved and nothing outside the record changes;
* branch initializers become initializers of the If's graph (Constant nodes in a function);
* an If inside the chosen branch whose condition is known is folded too, recursively.

Weights that move keep their omitted payloads: one that keeps its name is the same weight
(:func:`~weightstore.scenarios.derive.materialize` reads it from the base by name); one
renamed gets a ``copy`` recipe naming the original. A fold whose weights could not be
named unambiguously that way is skipped. Ifs are looked for in every graph and function,
except inside an If being folded (that one is inlined whole).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    make_node,
)
from .analysis import (
    NameAllocator,
    Scope,
    child_scopes,
    defined_names,
    initializers,
    input_names,
    is_constant,
    is_standard,
    iter_scopes,
    known_value,
    model_names,
    node_subgraphs,
    output_names,
    tensor_name_counts,
)
from .base import PassContext, has_payload
from .graphpath import function_hop
from .rewriting import LocalRewriting


@dataclass
class _Inlined:
    """A branch flattened for its parent: nodes, initializers, renamed weights' origins."""

    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # new name -> name in the model


class FoldConstantIf:
    """The ``fold-constant-if`` pass."""

    name = "fold-constant-if"

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        self._known = ctx.known or known_value
        self._model = model
        for cached in ("_counts", "_defs", "_names"):  # an instance may run again
            self.__dict__.pop(cached, None)
        self._fresh: set[str] = set()
        roots = [Scope((), model.graph)]
        roots += [Scope((function_hop(f),), f) for f in model.functions]
        records: list[LocalRewriting] = []
        for root in roots:
            records += self._walk(root)
        return records

    # model-wide name facts, gathered only once an If with a known condition is found:
    # a model without one costs a walk over its nodes, nothing more
    @functools.cached_property
    def _counts(self) -> dict[str, int]:
        return tensor_name_counts(self._model)

    @functools.cached_property
    def _defs(self) -> dict[str, int]:
        return _definition_counts(self._model)

    @functools.cached_property
    def _names(self) -> NameAllocator:
        return NameAllocator(model_names(self._model))

    def _walk(self, scope: Scope) -> list[LocalRewriting]:
        records: list[LocalRewriting] = []
        for i, node in enumerate(scope.container.node):
            record = self._fold(scope, i) if is_standard(node, "If") else None
            if record is not None:
                records.append(record)
                continue
            for child in child_scopes(scope, i):
                records += self._walk(child)
        return records

    def _fold(self, scope: Scope, index: int) -> LocalRewriting | None:
        node = scope.container.node[index]
        inlined = self._inline(scope, node)
        if inlined is None:
            return None
        nodes = inlined.nodes
        inits = inlined.initializers
        if scope.is_function:  # a function holds no initializers: they become Constants
            nodes = [make_node("Constant", [], [t.name], value=t) for t in inits]
            nodes += inlined.nodes
            inits = []
        derivations = {new: DerivedWeightRecipe("copy", (old,))
                       for new, old in sorted(inlined.origin.items())
                       if new != old and _omitted(new, nodes, inits)}
        sources = [s for recipe in derivations.values() for s in recipe.sources]
        if (any(self._counts.get(s, 0) != 1 for s in sources)
                or not self._weights_named(nodes, inits, derivations)):
            return None
        return LocalRewriting(
            operation_name=self.name,
            graph_path=scope.path,
            removed_nodes=(index,),
            added_nodes=tuple(nodes),
            added_initializers=tuple(inits),
            derivations=derivations,
        )

    def _weights_named(self, nodes: list[NodeProto], inits: list[TensorProto],
                       derivations: dict[str, DerivedWeightRecipe]) -> bool:
        """Is every omitted payload that moves either derived or uniquely named?"""
        tensors = [(t.name, t) for t in inits]
        for node in nodes:
            tensors += list(_node_tensors(node))
        return all(has_payload(t) or name in derivations or self._counts.get(name, 0) == 1
                   for name, t in tensors)

    def _choose(self, scope: Scope, node: NodeProto) -> GraphProto | None:
        cond = self._known(scope, node.input[0]) if node.input else None
        if cond is None or cond.size != 1:
            return None
        wanted = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        graphs = [g for hop, g in node_subgraphs(node) if hop == wanted]
        return graphs[0] if len(graphs) == 1 else None

    def _inline(self, scope: Scope, node: NodeProto) -> _Inlined | None:
        """The chosen branch of the If ``node`` (in ``scope``), ready for ``scope``."""
        branch = self._choose(scope, node)
        if (branch is None or branch.sparse_initializer or branch.input
                or len(branch.output) != len(node.output) or not all(node.output)):
            return None
        inner = Scope(scope.path, branch, scope)
        flat = _Inlined(initializers=[_copy(t) for t in branch.initializer])
        for child in branch.node:
            folded = self._inline(inner, child) if is_standard(child, "If") else None
            if folded is None:
                flat.nodes.append(_copy(child))
            else:
                flat.nodes += folded.nodes
                flat.initializers += folded.initializers
                flat.origin.update(folded.origin)
        return self._hoist(flat, output_names(branch), list(node.output))

    def _hoist(self, flat: _Inlined, branch_outputs: list[str], if_outputs: list[str],
               ) -> _Inlined:
        """Rename ``flat``'s names for the parent and make it produce ``if_outputs``."""
        produced = {o for n in flat.nodes for o in n.output if o}
        defined = produced | {t.name for t in flat.initializers}
        renames: dict[str, str] = {}
        copies: list[tuple[str, str]] = []
        for inner, outer in zip(branch_outputs, if_outputs, strict=True):
            if inner in produced and inner not in renames:
                renames[inner] = outer
            else:
                copies.append((inner, outer))
        for name in sorted(defined - set(renames)):
            if name not in self._fresh and self._defs.get(name, 0) != 1:
                renames[name] = self._names.fresh(name)
                self._fresh.add(renames[name])
        out = _Inlined()
        for n in flat.nodes:
            _rename_node(n, renames)
            out.nodes.append(n)
        for t in flat.initializers:
            t.name = renames.get(t.name, t.name)
            out.initializers.append(t)
        for inner, outer in copies:
            out.nodes.append(make_node("Identity", [renames.get(inner, inner)], [outer],
                                              name=self._names.fresh(f"{outer}.folded_if")))
        for old, new in renames.items():
            out.origin[new] = flat.origin.get(old, old)
        for new, old in flat.origin.items():
            out.origin.setdefault(renames.get(new, new), old)
        return out


# -- helpers ----------------------------------------------------------------------------------

def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def _definition_counts(model: ModelProto) -> dict[str, int]:
    """How many places (inputs, initializers, node outputs of any graph) define each name."""
    counts: dict[str, int] = {}
    for scope in iter_scopes(model):
        c = scope.container
        names = list(input_names(c)) + list(initializers(c))
        names += [o for n in c.node for o in n.output if o]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _rename_node(node: NodeProto, renames: dict[str, str]) -> None:
    """Rename a node's inputs and outputs, and what its subgraphs read from outside."""
    for j, name in enumerate(node.input):
        node.input[j] = renames.get(name, name)
    for j, name in enumerate(node.output):
        node.output[j] = renames.get(name, name)
    for _, g in node_subgraphs(node):
        _rename_captures(g, renames)


def _rename_captures(g: GraphProto, renames: dict[str, str]) -> None:
    local = defined_names(g)
    visible = {k: v for k, v in renames.items() if k not in local}
    if not visible:
        return
    for node in g.node:
        for j, name in enumerate(node.input):
            node.input[j] = visible.get(name, name)
        for _, sub in node_subgraphs(node):
            _rename_captures(sub, visible)
    for o in g.output:
        o.name = visible.get(o.name, o.name)


def _node_tensors(node: NodeProto) -> Iterator[tuple[str, TensorProto]]:
    """(value name, tensor) for a Constant node and every weight inside its subgraphs."""
    if is_constant(node) and node.output:
        for a in node.attribute:
            if a.name == "value" and a.type == AttributeProto.TENSOR:
                yield node.output[0], a.t
    for _, g in node_subgraphs(node):
        for t in g.initializer:
            yield t.name, t
        for inner in g.node:
            yield from _node_tensors(inner)


def _omitted(name: str, nodes: list[NodeProto], inits: list[TensorProto]) -> bool:
    """Does the moved weight ``name`` (initializer or top-level Constant) lack its payload?"""
    for t in inits:
        if t.name == name:
            return not has_payload(t)
    for node in nodes:
        if is_constant(node) and node.output and node.output[0] == name:
            return any(not has_payload(t) for _, t in _node_tensors(node))
    return False
