"""Putting payload bytes back into a TensorProto in the encoding it had originally.

Externalizing turns every payload into little-endian raw bytes; these helpers restore
``raw_data`` or the typed field (``float_data``, ``int64_data``, ...) so that
inline -> external -> inline gives back the very same TensorProto.
"""

from __future__ import annotations

from ..catalogue import typed_fields
from ..catalogue.schema import PAYLOAD_FIELDS, TYPED_FIELDS
from ..errors import ConversionError, ModelError
from ..io.onnx_proto import TensorProto

# Appended to an encoding when the inline tensor spelt out ``data_location: DEFAULT``
# (onnxruntime's quantizer writes it): the same tensor, but two more bytes, which the
# reverse conversion puts back.
EXPLICIT_LOCATION = "+data_location"


def inline_encoding(tensor: TensorProto, field: str) -> str:
    """The encoding to record for an inline ``tensor`` whose values are in ``field``."""
    if tensor.HasField("data_location") and tensor.data_location == TensorProto.DEFAULT:
        return field + EXPLICIT_LOCATION
    return field


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
    """Store little-endian ``data`` in ``tensor`` as ``encoding`` (inline): a field, and
    :data:`EXPLICIT_LOCATION` when the tensor spelt out its default location."""
    clear_payload(tensor)
    field = encoding.removesuffix(EXPLICIT_LOCATION)
    if field == "raw_data":
        tensor.raw_data = data
    elif field not in TYPED_FIELDS:
        raise ConversionError("unknown tensor encoding", encoding=encoding, tensor=tensor.name)
    else:
        try:
            typed_fields.encode(tensor, field, data)
        except ModelError as exc:
            raise ConversionError(exc.message, encoding=encoding, tensor=tensor.name) from None
    if field != encoding:
        tensor.data_location = TensorProto.DEFAULT


def set_external(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    """Point ``tensor`` at external data with onnx.proto's ``location``, ``offset`` and
    ``length`` only. No ``checksum``: onnx.proto defines it as the SHA-1 of the whole file,
    which no payload's digest is; weightstore keeps those in ``summary.json`` and the store
    (see docs/reference/formats/package.md)."""
    clear_payload(tensor)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        if value:
            tensor.external_data.add(key=key, value=value)
