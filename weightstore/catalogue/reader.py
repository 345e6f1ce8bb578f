"""Metadata-only reading of ONNX models (the seed's ``ParseOptions.skip_raw_data``).

The model file is memory-mapped and its protobuf framing walked just deep enough to find
tensor payload fields. Those fields are left out of a *metadata model*, which onnx's own
``ModelProto`` then parses; each left-out payload is recorded as an :class:`InlinePayload`
holding exact byte offsets into the file, so the bytes can be recovered later without ever
holding the whole model in memory. Works for files above protobuf's 2 GiB limit.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from .schema import CHILDREN, PAYLOAD_FIELDS, RAW_DATA, Kind, Path
from .wire import LEN, Field, encode_varint, iter_fields

MAX_DEPTH = 96


@dataclass(frozen=True)
class InlinePayload:
    """Payload fields of one TensorProto, located in the model file but not read."""

    path: Path
    fields: tuple[Field, ...]  # every payload field occurrence, in file order

    @property
    def encoding(self) -> str:
        """``raw_data`` when present (it wins, as in onnx), else the typed field's name."""
        numbers = {f.number for f in self.fields}
        if RAW_DATA in numbers:
            return "raw_data"
        return PAYLOAD_FIELDS[self.fields[-1].number]

    @property
    def raw_range(self) -> tuple[int, int] | None:
        """(offset, length) of the little-endian bytes when they sit contiguously in the file."""
        raws = [f for f in self.fields if f.number == RAW_DATA]
        if not raws:
            return None
        last = raws[-1]
        return last.value, last.length

    @property
    def stored_bytes(self) -> int:
        return sum(f.end - f.start for f in self.fields)


@dataclass
class Catalogue:
    """A model's metadata plus the location of every payload left out of it."""

    source: FsPath
    model: onnx.ModelProto
    payloads: dict[Path, InlinePayload]
    file_size: int
    _buf: mmap.mmap | None = field(default=None, repr=False)

    def view(self, offset: int, length: int) -> memoryview:
        """Zero-copy view of ``length`` bytes of the model file at ``offset``."""
        if self._buf is None:
            raise ModelError("catalogue is closed", file=str(self.source))
        if offset < 0 or length < 0 or offset + length > self.file_size:
            raise ModelError("byte range outside the model file", file=str(self.source),
                             offset=offset, length=length)
        return memoryview(self._buf)[offset:offset + length]

    def fragment(self, payload: InlinePayload) -> bytes:
        """The payload's fields as serialized TensorProto bytes (tags included)."""
        return b"".join(bytes(self.view(f.start, f.end - f.start)) for f in payload.fields)

    def close(self) -> None:
        if self._buf is not None:
            with contextlib.suppress(BufferError):  # a live view keeps the mapping
                self._buf.close()
            self._buf = None

    def __enter__(self) -> Catalogue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Stripper:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.payloads: dict[Path, InlinePayload] = {}

    def message(self, kind: Kind, pos: int, end: int, path: Path, depth: int) -> list:
        """Return the chunks of this message's content with payload fields left out."""
        if depth > MAX_DEPTH:
            raise ModelError("messages nested deeper than the limit", offset=pos,
                             limit=MAX_DEPTH)
        children = CHILDREN[kind]
        counts: dict[int, int] = {}
        out: list = []
        found: list[Field] = []
        for f in iter_fields(self.buf, pos, end):
            if kind is Kind.TENSOR and f.number in PAYLOAD_FIELDS:
                found.append(f)
                continue
            child = children.get(f.number)
            if child is None:
                out.append(self.buf[f.start:f.end])
                continue
            child_kind, repeated = child
            if f.wire_type != LEN:
                raise ModelError(f"{kind.value} field {f.number} has wire type {f.wire_type}, "
                                 "expected a length-delimited message", offset=f.start)
            index = counts.get(f.number, 0)
            if index and not repeated:
                raise ModelError(f"{kind.value} field {f.number} occurs twice", offset=f.start)
            counts[f.number] = index + 1
            inner = self.message(child_kind, f.value, f.end, (*path, (f.number, index)),
                                 depth + 1)
            size = sum(len(c) for c in inner)
            out.append(encode_varint((f.number << 3) | LEN) + encode_varint(size))
            out.extend(inner)
        if found:
            self.payloads[path] = InlinePayload(path, tuple(found))
        return out


def read_catalogue(path: str | os.PathLike[str]) -> Catalogue:
    """Catalogue ``path``: the metadata model and the byte range of every payload."""
    source = FsPath(path)
    try:
        f = open(source, "rb")  # noqa: SIM115 - closed right after mapping
    except FileNotFoundError:
        raise ModelError("model file not found", file=str(source)) from None
    except IsADirectoryError:
        raise ModelError("model path is a folder", file=str(source)) from None
    except OSError as exc:
        raise ModelError(f"cannot open model: {exc.strerror}", file=str(source)) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ModelError("model file is empty", file=str(source))
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = memoryview(buf)
        stripper = _Stripper(view)
        try:
            chunks = stripper.message(Kind.MODEL, 0, size, (), 0)
            metadata = b"".join(chunks)
        except ModelError as exc:
            exc.context.setdefault("file", str(source))
            raise
        finally:
            del view
        model = onnx.ModelProto()
        try:
            model.ParseFromString(metadata)
        except DecodeError as exc:
            raise ModelError(f"not an ONNX model: {exc}", file=str(source)) from None
        if not model.HasField("graph") or not model.ir_version:
            raise ModelError("not an ONNX model: no graph or ir_version", file=str(source))
        return Catalogue(source, model, stripper.payloads, size, buf)
    except BaseException:
        with contextlib.suppress(BufferError):  # views held by the traceback: GC closes it
            buf.close()
        raise
