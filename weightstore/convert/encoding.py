"""Putting payload bytes back into a TensorProto in the encoding it had originally.

Externalizing turns every payload into little-endian raw bytes; these helpers restore
``raw_data`` or the typed field (``float_data``, ``int64_data``, ...) so that
inline -> external -> inline gives back the very same TensorProto.
"""

from __future__ import annotations

from ..catalogue import typed_fields
from ..catalogue.schema import PAYLOAD_FIELDS
from ..errors import ConversionError, ModelError
from ..io.onnx_proto import TensorProto

TYPED_FIELDS = frozenset(v for v in PAYLOAD_FIELDS.values() if v != "raw_data")


def has_payload(tensor: TensorProto) -> bool:
    """Is the tensor's value present inline, rather than omitted or external?"""
    if tensor.data_location == TensorProto.EXTERNAL:
        return False
    if tensor.raw_data or any(len(getattr(tensor, f)) for f in TYPED_FIELDS):
        return True
    return len(tensor.string_data) > 0 or 0 in tensor.dims


def clear_payload(tensor: TensorProto) -> None:
    """Remove payload fields and any external-data reference."""
    for name in PAYLOAD_FIELDS.values():
        tensor.ClearField(name)
    tensor.ClearField("external_data")
    tensor.ClearField("data_location")


def set_payload(tensor: TensorProto, data: bytes, encoding: str = "raw_data") -> None:
    """Store little-endian ``data`` in ``tensor`` as ``encoding`` (inline)."""
    clear_payload(tensor)
    if encoding == "raw_data":
        tensor.raw_data = data
        return
    if encoding not in TYPED_FIELDS:
        raise ConversionError("unknown tensor encoding", encoding=encoding, tensor=tensor.name)
    try:
        typed_fields.encode(tensor, encoding, data)
    except ModelError as exc:
        raise ConversionError(exc.message, encoding=encoding, tensor=tensor.name) from None


def set_external(tensor: TensorProto, location: str, offset: int, length: int,
                 checksum: str) -> None:
    """Point ``tensor`` at external data with only the keys onnxruntime accepts (no
    ``checksum`` when it is empty)."""
    clear_payload(tensor)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length)), ("checksum", checksum)):
        if not value:
            continue
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value
