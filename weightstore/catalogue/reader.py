"""Metadata-only reading of ONNX models (the seed's ``ParseOptions.skip_raw_data``).

The model file's protobuf framing is walked (by positional reads) just deep enough to find
tensor payload fields. Those fields are left out of a *metadata model*, which onnx's own
``ModelProto`` then parses; each left-out payload is recorded as an :class:`InlinePayload`
holding exact byte offsets into the file, so the bytes can be recovered later without ever
holding the whole model in memory. Works for files above protobuf's 2 GiB limit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..io.files import NotRegularFileError, open_regular, read_exact
from ..io.identity import file_stamp
from ..io.onnx_proto import GraphProto, ModelProto, TensorProto
from .filebytes import FileBytes
from .graphs import iter_containers
from .schema import CHILDREN, PAYLOAD_FIELDS, RAW_DATA, Kind, Path
from .typed_fields import check_values
from .utf8 import check_field
from .wire import LEN, MAX_DEPTH, Field, FramingError, encode_varint, iter_fields

if TYPE_CHECKING:
    from .sites import TensorSite


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
    """A model's metadata plus the location of every payload left out of it.

    Holds the model file open; :meth:`read` and :meth:`fragment` use positional reads and
    are safe to call from several threads. A build of many models :meth:`park` s each
    catalogue (the file is closed, the metadata kept) and reads it in :meth:`opened`
    blocks, so it holds one model file open at a time, not one per model; a read outside
    them opens the file for that read alone.
    """

    source: FsPath
    model: ModelProto
    payloads: dict[Path, InlinePayload]
    file_size: int
    _fd: int | None = field(default=None, repr=False)
    _stamp: tuple[int, ...] = field(default=(), repr=False)  # what the offsets are valid for
    _parked: bool = field(default=False, repr=False)

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of the model file at ``offset``."""
        if offset < 0 or length < 0 or offset + length > self.file_size:
            raise ModelError("byte range outside the model file", file=str(self.source),
                             offset=offset, length=length)
        fd = self._fd
        if fd is None and not self._parked:
            raise ModelError("catalogue is closed", file=str(self.source))
        try:
            if fd is not None:
                return read_exact(fd, offset, length)
            fd = self._reopen()  # parked: this read alone (thread-safe, nothing shared)
            try:
                return read_exact(fd, offset, length)
            finally:
                os.close(fd)
        except (EOFError, OSError) as exc:
            raise ModelError(f"cannot read the model file: {exc}", file=str(self.source),
                             offset=offset) from None

    def fragment(self, payload: InlinePayload) -> bytes:
        """The payload's fields as serialized TensorProto bytes (tags included)."""
        return b"".join(self.read(f.start, f.end - f.start) for f in payload.fields)

    def restore(self, tensor: TensorProto, path: Path, where: str = "") -> None:
        """Put the payload fields left out at ``path`` back into ``tensor``, as they were:
        every tensor that stays inline (a metadata value, one below ``size_threshold``)
        comes back here, so a typed value its element type cannot hold is refused here
        (:func:`~.typed_fields.check_values`) as a conversion refuses it."""
        payload = self.payloads.get(path)
        if payload is None:
            return
        try:
            tensor.MergeFromString(self.fragment(payload))
        except DecodeError:
            raise ModelError("malformed tensor payload", where=where, file=str(self.source),
                             offset=payload.fields[0].start) from None
        check_values(tensor, where)

    def close(self) -> None:
        self._parked = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def park(self) -> None:
        """Close the model file but keep the metadata; :meth:`opened` reopens it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._parked = True

    @contextlib.contextmanager
    def opened(self) -> Iterator[Catalogue]:
        """The model file open for the block: reopened if parked (and parked again after),
        as is otherwise. A file replaced or rewritten since it was catalogued is refused."""
        if not self._parked:
            yield self
            return
        self._fd, self._parked = self._reopen(), False
        try:
            yield self
        finally:
            self.park()

    def _reopen(self) -> int:
        """A new descriptor of the model file, refused if the file is not the one
        catalogued (every byte range recorded for it would be wrong)."""
        fd = _open_model(self.source)
        try:
            if file_stamp(os.fstat(fd)) != self._stamp:
                raise ModelError("model file changed since the build catalogued it",
                                 file=str(self.source))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def __enter__(self) -> Catalogue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


DESCRIPTORS = {kind: ModelProto.DESCRIPTOR.file.message_types_by_name[kind.value]
               for kind in Kind}


class _Stripper:
    def __init__(self, buf: FileBytes) -> None:
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
                check_field(self.buf, f, DESCRIPTORS[kind], depth)
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
    return catalogue_from(open_model(source), source)


def open_model(source: FsPath) -> int:
    """A descriptor of the model file ``source`` (a regular file), or a ModelError."""
    if source.is_dir():
        raise ModelError("model path is a folder", file=str(source))
    return _open_model(source)


def catalogue_from(fd: int, source: FsPath) -> Catalogue:
    """Catalogue the model file open at ``fd``; the catalogue owns ``fd`` from here on
    (closed on error too)."""
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size == 0:
            raise ModelError("model file is empty", file=str(source))
        stripper = _Stripper(FileBytes(fd, size))
        try:
            metadata = b"".join(stripper.message(Kind.MODEL, 0, size, (), 0))
        except ModelError as exc:
            if isinstance(exc, FramingError):
                exc.message = f"not an ONNX model: {exc.message}"
            exc.context.setdefault("file", str(source))
            raise
        model = ModelProto()
        try:
            model.ParseFromString(metadata)
        except Exception as exc:  # protobuf's DecodeError, or its depth and size limits
            raise ModelError(f"not an ONNX model: {exc}", file=str(source)) from None
        if not model.HasField("graph") or not model.ir_version:
            raise ModelError("not an ONNX model: no graph or ir_version", file=str(source))
        payloads = stripper.payloads
        refuse_ambiguous(model, lambda site: site.path in payloads, source)
        return Catalogue(source, model, payloads, size, fd, file_stamp(st))
    except BaseException:
        os.close(fd)
        raise


def refuse_ambiguous(model: ModelProto, inline: Callable[[TensorSite], bool],
                     source: FsPath) -> None:
    """Refuse what a runtime would have to guess: two initializers of one name in one
    graph, or a tensor holding its data both inline (``inline(site)``) and as external
    data. A tensor with ``external_data`` entries is refused beside inline data whatever
    its ``data_location`` says: onnx and onnxruntime would take the inline bytes of one
    left at DEFAULT, a writer that forgot to set EXTERNAL meant the file's."""
    from .sites import iter_tensor_sites

    refuse_duplicate_initializers(model, source)
    for site in iter_tensor_sites(model):
        tensor = site.tensor
        if ((tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data))
                and inline(site)):
            raise ModelError("tensor holds its data both inline and as external data",
                             where=site.where, file=str(source),
                             data_location=TensorProto.DataLocation.Name(
                                 tensor.data_location))


def refuse_duplicate_initializers(model: ModelProto, source: FsPath) -> None:
    """Refuse two initializers of one name in one graph."""
    for container, where in iter_containers(model):
        if not isinstance(container, GraphProto):
            continue
        seen: set[str] = set()
        names = [t.name for t in container.initializer]
        names += [s.values.name for s in container.sparse_initializer]
        for name in names:
            if name in seen:
                raise ModelError("two initializers share a name in one graph", where=where,
                                 initializer=name, file=str(source))
            seen.add(name)


def _open_model(source: FsPath) -> int:
    try:
        return open_regular(source)
    except FileNotFoundError:
        raise ModelError("model file not found", file=str(source)) from None
    except NotRegularFileError as exc:
        raise ModelError(f"model path is {exc}", file=str(source)) from None
    except ValueError:  # a NUL byte in the path
        raise ModelError("model path contains a NUL byte", file=repr(str(source))) from None
    except OSError as exc:
        raise ModelError(f"cannot open model: {exc.strerror}", file=str(source)) from None

