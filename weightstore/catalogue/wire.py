"""Protobuf wire format, read just deep enough to find where fields start and end.

Only framing is decoded here (tags, varints, lengths); message contents are left to
protobuf's own parser. Every read is bounds-checked against the buffer and failures raise
:class:`~weightstore.errors.ModelError` naming the byte offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelError


class FramingError(ModelError):
    """Bytes that are not a protocol buffer message where one should start."""

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_VARINT_BYTES = 10
MAX_DEPTH = 96  # messages nested deeper than this are refused


@dataclass(frozen=True, slots=True)
class Field:
    """One field occurrence: ``start`` is the tag's offset, ``value`` the payload's."""

    number: int
    wire_type: int
    start: int
    value: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.value


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, next position)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise FramingError("truncated varint", offset=start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if pos - start >= MAX_VARINT_BYTES:
            raise FramingError("varint longer than 10 bytes", offset=start)


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def iter_fields(buf: memoryview, pos: int, end: int):
    """Yield every field of the message occupying ``buf[pos:end]``."""
    while pos < end:
        start = pos
        tag, pos = read_varint(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise FramingError("field number 0 is invalid", offset=start)
        if wire_type == VARINT:
            _, value_end = read_varint(buf, pos, end)
            yield Field(number, wire_type, start, pos, value_end)
            pos = value_end
        elif wire_type == I64:
            if pos + 8 > end:
                raise FramingError("truncated 64-bit field", offset=start, field=number)
            yield Field(number, wire_type, start, pos, pos + 8)
            pos += 8
        elif wire_type == I32:
            if pos + 4 > end:
                raise FramingError("truncated 32-bit field", offset=start, field=number)
            yield Field(number, wire_type, start, pos, pos + 4)
            pos += 4
        elif wire_type == LEN:
            length, value = read_varint(buf, pos, end)
            if value + length > end:
                raise FramingError("length-delimited field runs past the end of its message",
                                 offset=start, field=number, length=length)
            yield Field(number, wire_type, start, value, value + length)
            pos = value + length
        else:
            raise FramingError(f"unsupported wire type {wire_type}", offset=start, field=number)
