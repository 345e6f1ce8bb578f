"""Which ModelProto fields lead to tensors, as field numbers of onnx.proto.

One table serves both the wire-level reader (which walks bytes) and the proto-side walker
(which walks parsed messages), so both name every tensor by the same structural path.
"""

from __future__ import annotations

from enum import Enum


class Kind(Enum):
    MODEL = "ModelProto"
    GRAPH = "GraphProto"
    NODE = "NodeProto"
    ATTRIBUTE = "AttributeProto"
    FUNCTION = "FunctionProto"
    TRAINING = "TrainingInfoProto"
    SPARSE = "SparseTensorProto"
    TENSOR = "TensorProto"


# field number -> (kind of the sub-message, repeated?)
CHILDREN: dict[Kind, dict[int, tuple[Kind, bool]]] = {
    Kind.MODEL: {7: (Kind.GRAPH, False), 20: (Kind.TRAINING, True), 25: (Kind.FUNCTION, True)},
    Kind.GRAPH: {1: (Kind.NODE, True), 5: (Kind.TENSOR, True), 15: (Kind.SPARSE, True)},
    Kind.NODE: {5: (Kind.ATTRIBUTE, True)},
    Kind.ATTRIBUTE: {
        5: (Kind.TENSOR, False),
        6: (Kind.GRAPH, False),
        10: (Kind.TENSOR, True),
        11: (Kind.GRAPH, True),
        22: (Kind.SPARSE, False),
        23: (Kind.SPARSE, True),
    },
    Kind.FUNCTION: {7: (Kind.NODE, True), 11: (Kind.ATTRIBUTE, True)},
    Kind.TRAINING: {1: (Kind.GRAPH, False), 2: (Kind.GRAPH, False)},
    Kind.SPARSE: {1: (Kind.TENSOR, False), 2: (Kind.TENSOR, False)},
    Kind.TENSOR: {},
}

# bytes: tensor values this small are metadata (shapes, conditions), kept in the metadata
# model; larger ones are payloads
SMALL_VALUE_LIMIT = 4096

# TensorProto fields that hold payload bytes. string_data (6) stays in the metadata model:
# strings cannot be external data.
PAYLOAD_FIELDS: dict[int, str] = {
    4: "float_data",
    5: "int32_data",
    7: "int64_data",
    9: "raw_data",
    10: "double_data",
    11: "uint64_data",
}
# the typed value fields (every payload field but raw_data)
TYPED_FIELDS = frozenset(v for v in PAYLOAD_FIELDS.values() if v != "raw_data")
RAW_DATA = 9

# A structural path: ((field number, occurrence index), ...) from the ModelProto down.
Path = tuple[tuple[int, int], ...]


def path_str(path: Path) -> str:
    """Stable text form of a path, e.g. ``7.0/1.12/5.0/5.0``."""
    return "/".join(f"{n}.{i}" for n, i in path)


def parse_path(text: str) -> Path:
    try:
        return tuple((int(n), int(i)) for n, i in (p.split(".") for p in text.split("/")))
    except ValueError as exc:
        raise ValueError(f"malformed tensor path {text!r}") from exc
