"""Scenarios in packages: records prepared once, their added weights stored and placed.

A recipe's scenarios are computed once per model on its metadata. The initializers their
records add (a fused Q/K/V weight, an fp16 copy, a folded If branch's weights) are weights
like any other: their bytes are computed from the base model's payloads when the package
is built, hashed into the store, and placed in the package's weight files; the records
then point at them through ordinary external data, or hold them inline when small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .._proto import weightstore_pb2 as pb
from ..catalogue.shape_inputs import shape_input_names
from ..convert.encoding import has_payload, set_external, set_payload
from ..convert.weights import ModelWeights
from ..errors import ScenarioError
from ..hashing import digest_bytes, make_key
from ..recipe import ScenarioEntry
from .api import prepare_records
from .derive import resolver
from .digest import base_graph_digest
from .rewriting import derivations_of
from .storage import write_scenarios
from .variants import catalogue_values, scenario_rewrites

DIGEST_ALGORITHM = "blake3"


@dataclass
class AddedWeight:
    """One initializer a scenario record adds, and how to get its bytes."""

    scenario: str
    record: int
    index: int  # in the record's added_initializers
    name: str
    data_type: int
    dims: tuple[int, ...]
    shape_input: bool  # feeds a shape-like input: stays inline (onnxruntime needs it)
    compute: Callable[[], bytes] = field(repr=False)
    key: str = ""
    size: int = 0

    @property
    def where(self) -> str:
        return (f"scenario '{self.scenario}' record {self.record} "
                f"initializer '{self.name}'")


@dataclass
class PackagedScenario:
    name: str
    records: list[pb.LocalRewritingProto]
    added: list[AddedWeight]


def prepare_scenarios(mw: ModelWeights, entries: Sequence[ScenarioEntry],
                      ) -> list[PackagedScenario]:
    """Run each entry's passes on the model's metadata and normalize the records.

    Also marks, in ``mw``, the base weights that a scenario feeds to shape-like inputs:
    they stay inline in every layout, so every variant loads in onnxruntime.
    """
    out = []
    values = catalogue_values(mw.catalogue, mw.base_dir)
    for entry in entries:
        rewrites, base = scenario_rewrites(mw, entry.passes)
        records, variant = prepare_records(base, entry.name, rewrites)
        shapes = shape_input_names(variant)
        mw.shape_names = mw.shape_names | shapes
        derivations: dict = {}
        for record in records:
            derivations.update(derivations_of(record))
        value = resolver(derivations, values)
        added = []
        for r, record in enumerate(records):
            for j, tensor in enumerate(record.added_initializers):
                added.append(AddedWeight(
                    entry.name, r, j, tensor.name, tensor.data_type, tuple(tensor.dims),
                    tensor.name in shapes, _bytes_of(tensor, value)))
        out.append(PackagedScenario(entry.name, records, added))
    return out


def _bytes_of(tensor: onnx.TensorProto, value: Callable[[str], np.ndarray],
              ) -> Callable[[], bytes]:
    if has_payload(tensor):
        data = numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
        return lambda: data

    def compute() -> bytes:
        array = np.ascontiguousarray(value(tensor.name))
        expected = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if array.dtype != expected or tuple(array.shape) != tuple(tensor.dims):
            raise ScenarioError("computed weight differs from its declaration",
                                name=tensor.name, dtype=str(array.dtype),
                                shape=list(array.shape))
        return numpy_helper.from_array(array).raw_data

    return compute


def hash_added(scenarios: Sequence[PackagedScenario], algo: str) -> Iterator[
        tuple[AddedWeight, bytes]]:
    """Compute each added weight once, set its key and size, and yield it with its bytes."""
    for scenario in scenarios:
        for weight in scenario.added:
            data = weight.compute()
            weight.key = make_key(algo, digest_bytes(algo, data))
            weight.size = len(data)
            yield weight, data


def externalized(weight: AddedWeight, threshold: int, embedded: bool) -> bool:
    return not embedded and not weight.shape_input and weight.size >= threshold


def attach(model: onnx.ModelProto, scenarios: Sequence[PackagedScenario],
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
        for weight in scenario.added:
            tensor = proto.rewrites[weight.record].added_initializers[weight.index]
            where = place(weight)
            if where is None:
                set_payload(tensor, read(weight))
            else:
                set_external(tensor, where[0], where[1], weight.size, weight.key)
        protos.append(proto)
    write_scenarios(model, protos)
