"""Scenarios inside a ModelProto, kept as unknown field 20000.

ModelProto has no scenario field, so the records travel as a provisional field number that
onnx's parsers keep as an unknown field: ``onnx.load``/``onnx.save``, the checker and
onnxruntime all leave them alone, and the catalogue copies them into its metadata model.
Reading never serializes the model; writing replaces every field-20000 entry and keeps
every other field, known or unknown, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

from .._proto import weightstore_pb2 as pb
from ..catalogue.wire import LEN, iter_fields
from ..errors import ScenarioError
from ..io.onnx_proto import ModelProto

# Local provisional range 20000..20999, not reserved upstream: adopting the field in ONNX
# may need another number and a migration.
FIELD = 20000

ModelModificationScenarioProto = pb.ModelModificationScenarioProto


def unknown_field_set(message: ModelProto) -> Any:
    """The message's unknown fields (``field_number``, ``wire_type``, ``data``), through
    ``google.protobuf.unknown_fields`` (every protobuf from the declared floor, 4.21.1, has
    it; ``Message.UnknownFields()``, which it replaces, is gone from protobuf 5.26 on)."""
    from google.protobuf import unknown_fields

    return unknown_fields.UnknownFieldSet(message)


def _entries(model: ModelProto) -> list[bytes]:
    """The raw bytes of every field-20000 entry, in file order."""
    out: list[bytes] = []
    for entry in unknown_field_set(model):
        if entry.field_number != FIELD:
            continue
        if entry.wire_type != LEN:
            raise ScenarioError("model field 20000 does not hold scenario messages",
                                field=FIELD, wire_type=entry.wire_type)
        out.append(entry.data)
    return out


def read_scenarios(model: ModelProto) -> list[ModelModificationScenarioProto]:
    """Every scenario stored in ``model``, in stored order (no validation of names)."""
    scenarios: list[ModelModificationScenarioProto] = []
    for index, data in enumerate(_entries(model)):
        scenario = ModelModificationScenarioProto()
        try:
            scenario.ParseFromString(data)
        except DecodeError:
            raise ScenarioError("malformed modification scenario", field=FIELD,
                                index=index) from None
        scenarios.append(scenario)
    return scenarios


def write_scenarios(model: ModelProto,
                    scenarios: Sequence[ModelModificationScenarioProto]) -> None:
    """Replace the scenarios stored in ``model``, in place; an empty list removes them.

    Storage only: names and versions are checked by the registration API. The records are
    serialized deterministically after every other field, so equal inputs give equal bytes.
    When the model already holds scenarios it is re-parsed: sub-message references (such
    as ``model.graph``) taken before the call then no longer belong to ``model``.
    """
    items = list(scenarios)
    for index, item in enumerate(items):
        if not isinstance(item, ModelModificationScenarioProto):
            raise ScenarioError("not a ModelModificationScenarioProto", index=index,
                                type=type(item).__name__)
    added = pb.ModelScenarios(modification_scenarios=items).SerializeToString(
        deterministic=True)
    if not _entries(model):
        # Nothing to remove: appending unknown fields leaves every other field untouched.
        if added:
            model.MergeFromString(added)
        return
    data = memoryview(model.SerializeToString())
    kept: list[memoryview] = []
    last = 0
    for f in iter_fields(data, 0, len(data)):
        if f.number == FIELD:
            kept.append(data[last:f.start])
            last = f.end
    kept.append(data[last:])
    model.ParseFromString(b"".join(kept) + added)
