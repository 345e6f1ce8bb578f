"""Scenarios in packages: records prepared once, their added weights stored and placed.

A recipe's scenarios are computed once per model on its metadata. The initializers their
records add (a fused Q/K/V weight, an fp16 copy, a folded If branch's weights) are weights
like any other: their bytes are computed from the base model's payloads when the package
is built, hashed into the store, and placed in the package's weight files; the records
then point at them through ordinary external data, or hold them inline when small.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._proto import weightstore_pb2 as pb
from ..catalogue.locations import resolve_location
from ..catalogue.payload import (
    expected_nbytes,
    external_entries,
    read_file_range,
)
from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..catalogue.shape_inputs import shape_input_names
from ..convert.encoding import clear_payload, has_payload, set_external, set_payload
from ..convert.inline import check_digest
from ..convert.weights import ModelWeights
from ..errors import ScenarioError, WeightstoreError
from ..io.digests import digest_bytes, make_key, split_key
from ..io.files import parse_json
from ..io.onnx_arrays import from_array, np_dtype, to_array
from ..io.onnx_proto import ModelProto, NodeProto, TensorProto
from ..passes.base import run_passes
from ..passes.cleanup import Cleanup, prune
from ..passes.rewriting import derivations_of
from .api import apply_scenario, check_scenarios, prepare_records, strip_scenarios, verify_base
from .derive import resolver
from .digest import base_graph_digest
from .recorded_passes import PASSES_KEY, passes_entry, passes_text, scenario_digest
from .resolve import live_value_names
from .storage import write_scenarios
from .variants import catalogue_values, scenario_rewrites

if TYPE_CHECKING:  # scenario commands other than add do not load the recipe's models
    from ..recipe.schema import ScenarioEntry

DIGEST_ALGORITHM = "blake3"


@dataclass
class AddedWeight:
    """A weight a scenario record adds (an initializer, or a Constant node's value) that
    is live in the scenario's final graph, and how to get its bytes."""

    scenario: str
    record: int
    kind: str  # "initializer": added_initializers[index]; "node": inside added_nodes
    index: tuple  # where in the record (see _added_tensors)
    name: str
    data_type: int
    dims: tuple[int, ...]
    shape_input: bool  # feeds a shape-like input: stays inline (onnxruntime needs it)
    compute: Callable[[], bytes] = field(repr=False)
    key: str = ""
    size: int = 0

    @property
    def where(self) -> str:
        return f"scenario '{self.scenario}' record {self.record} {self.kind} '{self.name}'"

    @property
    def nbytes(self) -> int:
        """Size from type and shape, known before the bytes are computed."""
        return expected_nbytes(self.data_type, self.dims) or 0

    def bytes(self) -> bytes:
        try:
            return self.compute()
        except WeightstoreError as exc:
            exc.context.setdefault("scenario", self.scenario)
            exc.context.setdefault("record", self.record)
            exc.context.setdefault("weight", self.name)
            raise

    def tensor_in(self, record: pb.LocalRewritingProto) -> TensorProto:
        return _follow(record, self.kind, self.index)


@dataclass
class PackagedScenario:
    name: str
    records: list[pb.LocalRewritingProto]
    added: list[AddedWeight]  # live ones only: a weight a later record drops is not stored
    requires: dict = field(default_factory=dict)  # device capabilities, for 'auto' devices
    passes: str | None = None  # its passes entry's text (recorded_passes), None if none
    idle: tuple[str, ...] = ()  # the recipe's passes that found nothing to rewrite

    @property
    def digest(self) -> str:
        """What the scenario does: its records and passes (recorded_passes)."""
        return scenario_digest(self.name, self.records, self.passes)


REQUIRES_KEY = "weightstore.requires"


def _requires_of(record: pb.ModelModificationScenarioProto) -> dict:
    for entry in record.metadata_props:
        if entry.key == REQUIRES_KEY:
            try:
                value = parse_json(entry.value)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise ScenarioError("malformed scenario requirements", scenario=record.scenario)
            return value
    return {}


def check_name(name: str, where: str) -> None:
    """Scenario names become file names in packages: same rule as recipe names."""
    from ..recipe.schema import NAME_MAX_LENGTH, NAME_PATTERN, RESERVED_SCENARIO_NAMES

    if (not re.fullmatch(NAME_PATTERN, name) or len(name) > NAME_MAX_LENGTH
            or name in RESERVED_SCENARIO_NAMES):
        raise ScenarioError("scenario name is not usable in a package (letters, digits, '.', "
                            "'_', '-'; not common, default or auto)", scenario=name,
                            model=where)


def _node_tensors(node: NodeProto, path: tuple):
    """(path, value name, tensor) for every tensor inside ``node``, subgraphs included.

    A path step is ``(attribute name, k)`` then ``("i", j)`` for a graph's initializer or
    ``("n", j)`` for a graph's node; ``k`` is -1 for a single-graph or tensor attribute.
    """
    for attr in node.attribute:
        if attr.HasField("t"):
            name = node.output[0] if node.op_type == "Constant" and node.output else ""
            yield (*path, (attr.name, -1)), name, attr.t
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for k, g in enumerate(graphs):
            step = (attr.name, -1 if attr.HasField("g") else k)
            for j, t in enumerate(g.initializer):
                yield (*path, step, ("i", j)), t.name, t
            for j, sub in enumerate(g.node):
                yield from _node_tensors(sub, (*path, step, ("n", j)))


def _added_tensors(records: Sequence[pb.LocalRewritingProto]):
    """(record, kind, index, value name, tensor) for every tensor the records add."""
    for r, record in enumerate(records):
        for j, t in enumerate(record.added_initializers):
            yield r, "initializer", (j,), t.name, t
        for k, node in enumerate(record.added_nodes):
            for path, name, t in _node_tensors(node, ()):
                yield r, "node", (k, *path), name, t


def _follow(record: pb.LocalRewritingProto, kind: str, index: tuple) -> TensorProto:
    if kind == "initializer":
        return record.added_initializers[index[0]]
    node = record.added_nodes[index[0]]
    steps = list(index[1:])
    while True:
        attr_name, k = steps.pop(0)
        attr = next(a for a in node.attribute if a.name == attr_name)
        if not steps:
            return attr.t
        g = attr.g if k == -1 else attr.graphs[k]
        what, j = steps.pop(0)
        if what == "i":
            return g.initializer[j]
        node = g.node[j]


def prepare_scenarios(mw: ModelWeights, entries: Sequence[ScenarioEntry],
                      ) -> list[PackagedScenario]:
    """The scenarios a packaged model carries: those its source already holds (verified
    against it), then the recipe's (passes run on the model's metadata), in order.

    Also marks, in ``mw``, the base weights a scenario feeds to shape-like inputs: they
    stay inline in every layout, so every variant loads in onnxruntime.
    """
    meta = mw.metadata_model(SMALL_VALUE_LIMIT)
    plans: list[tuple[str, list[pb.LocalRewritingProto], dict, str | None, list[str]]] = []
    for record in check_scenarios(meta):
        check_name(record.scenario, str(mw.catalogue.source))
        verify_base(meta, record)
        plans.append((record.scenario, list(record.rewrites), _requires_of(record),
                      passes_text(record), []))
    base = strip_scenarios(meta)
    for entry in entries:
        if any(plan[0] == entry.name for plan in plans):
            raise ScenarioError("the source model already holds a scenario of this name",
                                scenario=entry.name, model=str(mw.catalogue.source))
        steps = entry.steps()
        rewrites, idle = scenario_rewrites(mw, steps)
        records, _ = prepare_records(base, entry.name, rewrites)
        plans.append((entry.name, records, dict(entry.requires), passes_entry(steps)[1],
                      idle))
    values = catalogue_values(mw.catalogue, mw.base_dir)
    out = []
    for name, records, requires, passes, idle in plans:
        final = _final_variant(base, name, records)
        shapes = shape_input_names(final)
        mw.shape_names = mw.shape_names | shapes
        live = live_value_names(final)
        derivations: dict = {}
        for record in records:
            derivations.update(derivations_of(record))
        value = resolver(derivations, values)
        added = [
            AddedWeight(name, r, kind, index, value_name, t.data_type, tuple(t.dims),
                        value_name in shapes, _bytes_of(t, value_name, value, mw.base_dir))
            for r, kind, index, value_name, t in _added_tensors(records)
            if value_name in live and (kind == "initializer" or not has_payload(t))
            and t.data_type != TensorProto.STRING]
        out.append(PackagedScenario(name, records, added, requires, passes, tuple(idle)))
    return out


def _final_variant(base: ModelProto, name: str,
                   records: Sequence[pb.LocalRewritingProto]) -> ModelProto:
    """The scenario replayed and cleaned up: the weights its records must carry.

    These are the first two phases of every resolution (replay, cleanup), on the same
    primitives; the build stops there on purpose. What a resolution proves after them
    (constant results folding an ``If``) depends on the resolver: onnx's shape inference
    (a newer onnx may prove a dim an older supported one does not), the phases a caller
    configures, transformations run before the analysis. A weight left out because this
    build's analysis proved its branch dead would leave a record pointing at a tensor
    without bytes, and any resolver that cannot prove the same would fail on replay. So
    a record carries every weight live after replay and cleanup, structure alone.
    """
    record = pb.ModelModificationScenarioProto(scenario=name)
    record.rewrites.extend(records)
    cleaned = run_passes(apply_scenario(base, record), [Cleanup()]).model
    prune(cleaned)
    return cleaned


def _bytes_of(tensor: TensorProto, name: str, value: Callable[[str], np.ndarray],
              base_dir: Path) -> Callable[[], bytes]:
    if has_payload(tensor):
        data = from_array(to_array(tensor)).raw_data
        return lambda: data
    if tensor.data_location == TensorProto.EXTERNAL:  # a source scenario's stored bytes
        def stored() -> bytes:
            info = external_entries(tensor, name)
            path = resolve_location(base_dir, info.location, where=name)
            data = read_file_range(path, info.offset, info.length or 0)
            check_digest(data, info.checksum, where=name)
            return data
        return stored

    def compute() -> bytes:
        array = np.asarray(value(name))  # a scalar stays 0-d
        expected = np_dtype(tensor.data_type)
        if array.dtype != expected or tuple(array.shape) != tuple(tensor.dims):
            raise ScenarioError("computed weight differs from its declaration",
                                name=name, dtype=str(array.dtype), shape=list(array.shape))
        return from_array(array).raw_data

    return compute


def hash_added(weights: Iterable[AddedWeight], algo: str, jobs: int = 1) -> Iterator[
        tuple[AddedWeight, bytes]]:
    """Compute each added weight once, set its key and size, and yield it with its bytes,
    in order. ``jobs`` threads compute and hash (onnxruntime's kernels and the hashes run
    without the interpreter lock), at most ``2 * jobs`` weights ahead of the caller."""
    def one(weight: AddedWeight) -> tuple[AddedWeight, bytes]:
        data = weight.bytes()
        weight.key = make_key(algo, digest_bytes(algo, data))
        weight.size = len(data)
        return weight, data

    if jobs <= 1:
        yield from map(one, weights)
        return
    from concurrent.futures import Future, ThreadPoolExecutor

    ahead: deque[Future[tuple[AddedWeight, bytes]]] = deque()
    with ThreadPoolExecutor(jobs) as pool:
        try:
            for weight in weights:
                ahead.append(pool.submit(one, weight))
                if len(ahead) >= 2 * jobs:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                future.cancel()


def added_weight_ids(scenario: PackagedScenario) -> list[tuple[str, AddedWeight]]:
    """A name for each weight ``scenario`` adds, unique in its model, that changes whenever
    what its bytes are computed from can change besides the source model itself: the
    records (passes, derivations, declarations), and the weight's place in them. With the
    source's identity it names the bytes, so a build can find their key again unhashed."""
    tag = split_key(scenario.digest)[1]
    return [(f"scenario/{tag}/{w.record}/{w.kind}/{'.'.join(map(str, w.index))}", w)
            for w in scenario.added]


def externalized(weight: AddedWeight, threshold: int, embedded: bool) -> bool:
    return not embedded and not weight.shape_input and weight.size >= threshold


def attach(model: ModelProto, scenarios: Sequence[PackagedScenario],
           place: Callable[[AddedWeight], tuple[str, int] | None],
           read: Callable[[AddedWeight], bytes]) -> None:
    """Store the scenarios in a packaged model, their added weights placed or inline.

    ``place(weight)`` gives ``(location, offset)`` for a weight in the package's files, or
    None to keep it inline (bytes from ``read``). The base graph digest is taken on the
    packaged model itself, whose tensors carry their checksums.
    """
    digest = base_graph_digest(model, algo=DIGEST_ALGORITHM)
    protos = []
    for scenario in scenarios:
        proto = pb.ModelModificationScenarioProto(
            scenario=scenario.name, base_graph_digest=digest,
            digest_algorithm=DIGEST_ALGORITHM, replay_format_version=1)
        for record in scenario.records:
            proto.rewrites.add().CopyFrom(record)
        if scenario.passes is not None:
            proto.metadata_props.add(key=PASSES_KEY, value=scenario.passes)
        if scenario.requires:
            proto.metadata_props.add(key=REQUIRES_KEY,
                                     value=json.dumps(scenario.requires, sort_keys=True))
        listed = {(w.record, w.kind, w.index) for w in scenario.added}
        for r, kind, index, _, tensor in _added_tensors(proto.rewrites):
            if (r, kind, index) not in listed and tensor.data_location == \
                    TensorProto.EXTERNAL:
                clear_payload(tensor)  # dead in the scenario: never read, not packaged
        for weight in scenario.added:
            tensor = weight.tensor_in(proto.rewrites[weight.record])
            where = place(weight)
            if where is None:
                set_payload(tensor, read(weight))
            else:
                set_external(tensor, where[0], where[1], weight.size)
        protos.append(proto)
    write_scenarios(model, protos)
