"""Writing ONNX models: size limits checked first, then temp + fsync + rename."""

from __future__ import annotations

from pathlib import Path

from ..errors import PackageError
from .files import atomic_write_bytes
from .onnx_proto import ModelProto

PROTOBUF_LIMIT = (2 << 30) - 1


def serialize_model(model: ModelProto, name: str) -> bytes:
    """The model's deterministic bytes, after checking protobuf's size limit."""
    size = model.ByteSize()
    if size > PROTOBUF_LIMIT:
        raise PackageError("model would exceed protobuf's 2 GiB limit; use an external "
                           "weight layout", file=name, size=size)
    return model.SerializeToString(deterministic=True)


def save_model(model: ModelProto, path: Path) -> int:
    """Serialize ``model`` to ``path`` atomically; returns the byte size written."""
    data = serialize_model(model, path.name)
    atomic_write_bytes(path, data)
    return len(data)
