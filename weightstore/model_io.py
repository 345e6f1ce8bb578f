"""Writing ONNX models: size limits checked first, then temp + fsync + rename."""

from __future__ import annotations

from pathlib import Path

import onnx

from .errors import PackageError
from .fsio import atomic_writer

PROTOBUF_LIMIT = (2 << 30) - 1


def save_model(model: onnx.ModelProto, path: Path) -> int:
    """Serialize ``model`` to ``path`` atomically; returns the byte size written."""
    size = model.ByteSize()
    if size > PROTOBUF_LIMIT:
        raise PackageError("model would exceed protobuf's 2 GiB limit; use an external "
                           "weight layout", file=path.name, size=size)
    data = model.SerializeToString(deterministic=True)
    with atomic_writer(path) as f:
        f.write(data)
    return len(data)
