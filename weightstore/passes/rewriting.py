"""LocalRewriting records: in memory, normalized to sequential protos, and applied.

A rewrite pass produces :class:`LocalRewriting` records in *batch* coordinates: every
position refers to the graph as it was when the batch started, like a pattern engine's
matches. :func:`normalize` turns an ordered list of them into sequential
``LocalRewritingProto`` transitions (each position refers to the graph immediately before
or after that one transition), resolving insertion anchors into exact positions and
turning value renames (chains resolved) into explicit consumer replacements; a record that
would leave a value its removed nodes produced without producer is refused. A rewired
consumer keeps its batch identity. :func:`apply_record` replays
one sequential transition; it needs metadata only.

A record whose added nodes need an operator domain the model may not import (onnxruntime's
``com.microsoft``) says so in its ``opset_imports``; each becomes a record metadata entry
``weightstore.opset_import:<domain>`` = ``<version>``, and applying the record adds that
import to the model when the model has none for the domain (a domain it already imports
keeps its version).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._proto import weightstore_pb2 as pb
from ..catalogue.descriptors import DerivedWeightRecipe
from ..errors import ScenarioError
from ..io.files import parse_json
from ..io.onnx_proto import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
)
from .graphpath import FUNCTION_PREFIX, Container, parse_hop, resolve

DERIVATION_PREFIX = "weightstore.derivation:"
OPSET_PREFIX = "weightstore.opset_import:"


@dataclass(frozen=True)
class LocalRewriting:
    """One local graph transition produced by a pass, in the coordinates of its batch."""

    operation_name: str
    graph_path: tuple[str, ...] = ()
    removed_nodes: tuple[int, ...] = ()
    added_nodes: tuple[NodeProto, ...] = ()
    insert_at: int | None = None  # batch position the added nodes go before (None: where
    #                               the first removed node was, or the end)
    added_initializers: tuple[TensorProto, ...] = ()
    removed_initializers: tuple[str, ...] = ()  # by name
    value_renames: Mapping[str, str] = field(default_factory=dict)  # consumer rewiring only
    derivations: Mapping[str, DerivedWeightRecipe] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    opset_imports: Mapping[str, int] = field(default_factory=dict)  # domain -> version
    batch: int = 0  # records sharing a batch number share coordinates


def derivation_entry(name: str, recipe: DerivedWeightRecipe) -> tuple[str, str]:
    value = json.dumps({"operation": recipe.operation, "sources": list(recipe.sources),
                        "attributes": dict(recipe.attributes)}, sort_keys=True)
    return DERIVATION_PREFIX + name, value


def derivations_of(record: pb.LocalRewritingProto) -> dict[str, DerivedWeightRecipe]:
    """The derived-weight recipes a serialized record registers, by initializer name."""
    out = {}
    for entry in record.metadata_props:
        if entry.key.startswith(DERIVATION_PREFIX):
            try:
                doc = parse_json(entry.value)
                out[entry.key[len(DERIVATION_PREFIX):]] = DerivedWeightRecipe(
                    doc["operation"], tuple(doc["sources"]),
                    tuple(sorted((str(k), str(v)) for k, v in doc["attributes"].items())))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ScenarioError("malformed derivation metadata", key=entry.key) from None
    return out


# -- sequential application ---------------------------------------------------------------

def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def apply_record(model: ModelProto, record: pb.LocalRewritingProto) -> None:
    """Apply one sequential transition to ``model`` in place (metadata only)."""
    g = resolve(model, record.graph_path)
    imports = opset_imports_of(record)
    _apply_nodes(g, list(record.removed_nodes), list(record.added_nodes),
                 list(record.added_nodes_positions))
    _apply_initializers(g, list(record.removed_initializers),
                        list(record.added_initializers))
    known = {o.domain for o in model.opset_import}
    for domain, version in sorted(imports.items()):
        if domain not in known:
            model.opset_import.add(domain=domain, version=version)


def opset_imports_of(record: pb.LocalRewritingProto) -> dict[str, int]:
    """The operator domains (and versions) a serialized record's nodes need imported."""
    out = {}
    for entry in record.metadata_props:
        if entry.key.startswith(OPSET_PREFIX):
            domain = entry.key[len(OPSET_PREFIX):]
            if not domain or domain == "ai.onnx" or not entry.value.isdigit():
                raise ScenarioError("malformed opset import metadata", key=entry.key,
                                    value=entry.value)
            out[domain] = int(entry.value)
    return out


def _apply_nodes(g: Container, removed: list[int], added: list[NodeProto],
                 positions: list[int]) -> None:
    n = len(g.node)
    if len(set(removed)) != len(removed):
        raise ScenarioError("removed node positions repeat", positions=removed)
    if any(not 0 <= r < n for r in removed):
        raise ScenarioError("removed node position out of range", positions=removed, nodes=n)
    if len(positions) != len(added):
        raise ScenarioError("added nodes and their positions differ in count",
                            nodes=len(added), positions=len(positions))
    m = n - len(removed) + len(added)
    if len(set(positions)) != len(positions) or any(not 0 <= p < m for p in positions):
        raise ScenarioError("added node positions out of range or repeated",
                            positions=positions, size=m)
    # In place: survivors are never copied (a record touches a few nodes of a large graph).
    # Deleting from the highest position leaves lower ones valid; inserting in ascending
    # order of final position puts each added node where every earlier slot is settled.
    for r in sorted(removed, reverse=True):
        del g.node[r]
    for p, node in sorted(zip(positions, added, strict=True), key=lambda item: item[0]):
        g.node.insert(p, node)


def _apply_initializers(g: Container, removed: list[int],
                        added: list[TensorProto]) -> None:
    if isinstance(g, FunctionProto):
        if removed or added:
            raise ScenarioError("a function has no initializers")
        return
    n = len(g.initializer)
    if len(set(removed)) != len(removed) or any(not 0 <= r < n for r in removed):
        raise ScenarioError("removed initializer positions out of range or repeated",
                            positions=removed, initializers=n)
    for r in sorted(removed, reverse=True):
        del g.initializer[r]
    g.initializer.extend(added)


# -- normalization ----------------------------------------------------------------------------

def normalize(model: ModelProto, rewrites: Sequence[LocalRewriting],
              ) -> tuple[list[pb.LocalRewritingProto], ModelProto]:
    """Sequential protos for ``rewrites`` and the model they produce (``model`` untouched).

    Every record is applied to a working copy as it is converted, so a record that does
    not fit (a node already removed, a bad path, a forbidden rename) fails here, naming
    its index.
    """
    work = _copy(model)
    protos = []
    batch: int | None = None
    ids: dict[tuple[str, ...], list[tuple]] = {}
    for index, rw in enumerate(rewrites):
        if rw.batch != batch:
            batch, ids = rw.batch, {}
        try:
            proto = _normalize_one(work, rw, ids, index)
            apply_record(work, proto)
        except ScenarioError as exc:
            exc.context.setdefault("record", index)
            exc.context.setdefault("operation", rw.operation_name)
            raise
        protos.append(proto)
    return protos, work


def _current_path(path: tuple[str, ...], ids: dict[tuple[str, ...], list[tuple]],
                  ) -> list[str]:
    """Translate a batch-coordinate graph path into current positions."""
    out: list[str] = []
    start = 1 if path and path[0].startswith(FUNCTION_PREFIX) else 0
    out.extend(path[:start])
    for i in range(start, len(path)):
        parent = tuple(path[:i])
        index, attribute, k = parse_hop(path[i])
        if parent in ids:
            try:
                index = ids[parent].index(("batch", index))
            except ValueError:
                raise ScenarioError("graph path goes through a node this batch removed",
                                    graph_path="/".join(path)) from None
        out.append(f"{index}:{attribute}" + ("" if k is None else f":{k}"))
    return out


def _normalize_one(work: ModelProto, rw: LocalRewriting,
                   ids: dict[tuple[str, ...], list[tuple]], index: int,
                   ) -> pb.LocalRewritingProto:
    path_now = _current_path(rw.graph_path, ids)
    g = resolve(work, path_now)
    current = ids.setdefault(rw.graph_path, [("batch", i) for i in range(len(g.node))])
    if len(current) != len(g.node):
        raise ScenarioError("batch coordinates out of step with the graph",
                            graph_path="/".join(rw.graph_path))
    try:
        removed_now = [current.index(("batch", i)) for i in rw.removed_nodes]
    except ValueError:
        raise ScenarioError("removed node is not in the graph (removed earlier in the batch "
                            "or out of range)", nodes=list(rw.removed_nodes)) from None
    if len(set(removed_now)) != len(removed_now):
        raise ScenarioError("removed node positions repeat", nodes=list(rw.removed_nodes))
    gone = set(removed_now)
    rewired = _rewire_consumers(g, rw, gone)
    _check_no_dangling(g, rw, gone, rewired)
    # the new identity list: survivors and rewired consumers in place (a rewired consumer
    # is the same node, so it keeps its identity: later records of the batch may still
    # remove it or enter its subgraphs), added nodes at the anchor
    new_ids: list[tuple] = []
    slots: dict[int, int] = {}  # rewired position -> its place among the survivors
    anchor = None
    first_removed = min(removed_now) if removed_now else None
    for pos, ident in enumerate(current):
        if anchor is None and _is_anchor(ident, pos, rw, first_removed):
            anchor = len(new_ids)
        if pos in gone:
            continue
        if pos in rewired:
            slots[pos] = len(new_ids)
        new_ids.append(ident)
    if anchor is None:
        anchor = len(new_ids)
    added_count = len(rw.added_nodes)
    new_ids[anchor:anchor] = [("added", index, j) for j in range(added_count)]
    added_nodes: list[NodeProto] = list(rw.added_nodes)
    added_positions = list(range(anchor, anchor + added_count))
    # sequentially, a rewired consumer is removed and added back at its own position
    removed_all = sorted(gone | set(rewired))
    for pos, node in sorted(rewired.items()):
        added_nodes.append(node)
        slot = slots[pos]
        added_positions.append(slot + added_count if slot >= anchor else slot)
    ids[rw.graph_path] = new_ids

    names = [t.name for t in getattr(g, "initializer", ())]
    try:
        removed_inits = [names.index(n) for n in rw.removed_initializers]
    except ValueError:
        raise ScenarioError("removed initializer is not in the graph",
                            names=list(rw.removed_initializers)) from None
    proto = pb.LocalRewritingProto(operation_name=rw.operation_name, graph_path=path_now)
    proto.removed_nodes.extend(removed_all)
    proto.added_nodes.extend(added_nodes)
    proto.added_nodes_positions.extend(added_positions)
    proto.added_initializers.extend(rw.added_initializers)
    proto.removed_initializers.extend(removed_inits)
    entries = [derivation_entry(n, r) for n, r in sorted(rw.derivations.items())]
    entries += [(OPSET_PREFIX + d, str(v)) for d, v in sorted(rw.opset_imports.items())]
    entries += sorted(rw.metadata.items())
    keys = [k for k, _ in entries]
    if len(set(keys)) != len(keys):
        raise ScenarioError("metadata keys repeat", keys=keys)
    for key, value in entries:
        proto.metadata_props.add(key=key, value=value)
    return proto


def _is_anchor(ident: tuple, pos: int, rw: LocalRewriting, first_removed: int | None) -> bool:
    if rw.insert_at is not None:
        return ident[0] == "batch" and ident[1] >= rw.insert_at
    return first_removed is not None and pos == first_removed


def _rewire_consumers(g: Container, rw: LocalRewriting, removed: set[int],
                      ) -> dict[int, NodeProto]:
    """Consumer rewiring as explicit replacements: position -> rewired copy of the node."""
    if not rw.value_renames:
        return {}
    outputs = {o.name for o in g.output} if isinstance(g, GraphProto) else set(g.output)
    inputs = ({i.name for i in g.input} if isinstance(g, GraphProto) else set(g.input))
    inits = {t.name for t in getattr(g, "initializer", ())}
    produced_by_survivors = {o for i, n in enumerate(g.node) if i not in removed
                             for o in n.output}
    rewired: dict[int, NodeProto] = {}
    for old, new in _resolve_renames(rw.value_renames).items():
        if old in outputs:
            raise ScenarioError("rename would rename a graph output", value=old)
        if old in inputs:
            raise ScenarioError("rename would rename a graph input", value=old)
        if old in inits:
            raise ScenarioError("rename would rename an initializer", value=old)
        if old in produced_by_survivors:
            raise ScenarioError("rename would rename a node output", value=old)
        for pos, node in enumerate(g.node):
            if pos in removed:
                continue
            if _captures(node, old):
                raise ScenarioError("rename would rename a nested capture", value=old,
                                    node=node.name or node.op_type)
            if old in node.input:
                copy = rewired.get(pos) or _copy(node)
                for j, name in enumerate(copy.input):
                    if name == old:
                        copy.input[j] = new
                rewired[pos] = copy
    return rewired


def _resolve_renames(renames: Mapping[str, str]) -> dict[str, str]:
    """Each renamed value mapped to the end of its chain (``c -> b -> a`` gives ``c -> a``
    and ``b -> a``); a chain that comes back to itself is an error."""
    out = {}
    for old in sorted(renames):
        chain = [old]
        new = renames[old]
        while new in renames:
            if new in chain:
                raise ScenarioError("value renames form a cycle", values=[*chain, new])
            chain.append(new)
            new = renames[new]
        out[old] = new
    return out


def _check_no_dangling(g: Container, rw: LocalRewriting, gone: set[int],
                       rewired: Mapping[int, NodeProto]) -> None:
    """Refuse a record after which a node or graph output reads a value that only the
    record's removed nodes produced (a local check: what the record touches, not the
    whole graph)."""
    lost = {o for pos in gone for o in g.node[pos].output if o}
    if not lost:
        return
    nodes = [rewired.get(pos, node) for pos, node in enumerate(g.node) if pos not in gone]
    nodes += rw.added_nodes
    lost -= {o for node in nodes for o in node.output}
    if isinstance(g, GraphProto):
        inputs, outputs = {i.name for i in g.input}, [o.name for o in g.output]
    else:
        inputs, outputs = set(g.input), list(g.output)
    lost -= inputs
    lost -= {t.name for t in getattr(g, "initializer", ())
             if t.name not in rw.removed_initializers}
    lost -= {t.name for t in rw.added_initializers}
    for name in sorted(lost):
        if name in outputs:
            raise ScenarioError("record leaves a graph output without producer", value=name)
        for node in nodes:
            if name in node.input or _captures(node, name):
                raise ScenarioError("record leaves a value its removed nodes produced "
                                    "without producer", value=name,
                                    node=node.name or node.op_type)


def _captures(node: NodeProto, name: str) -> bool:
    """Does a subgraph of ``node`` read ``name`` from the enclosing scope?"""
    stack = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    stack += [g for a in node.attribute if a.type == AttributeProto.GRAPHS
              for g in a.graphs]
    while stack:
        graph = stack.pop()
        defined = ({i.name for i in graph.input} | {t.name for t in graph.initializer}
                   | {o for n in graph.node for o in n.output})
        for n in graph.node:
            if name in n.input and name not in defined:
                return True
            stack += [a.g for a in n.attribute if a.type == AttributeProto.GRAPH]
            stack += [sg for a in n.attribute if a.type == AttributeProto.GRAPHS
                      for sg in a.graphs]
        if any(o.name == name for o in graph.output) and name not in defined:
            return True
    return False
