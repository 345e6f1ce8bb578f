"""Payload descriptors: where a tensor's bytes are, without reading them.

A descriptor says which file holds the bytes, at which absolute offset and length, and how
they are encoded there: ``raw`` little-endian bytes (``raw_data`` or external data), or a
packed typed field (``float_data``, ``int64_data``, ...) that must be converted.
Recovering the bytes reads exactly the descriptor's range.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExternalDataError, ModelError
from ..io.files import NotRegularFileError, open_regular, read_exact
from ..io.onnx_proto import TensorProto
from . import typed_fields
from .element_types import expected_nbytes
from .locations import resolve_location
from .reader import Catalogue
from .sites import TensorSite

SMALL_VALUE_LIMIT = 4096  # bytes: values this small are metadata (shapes, conditions)


@dataclass(frozen=True)
class PayloadDescriptor:
    """Where one tensor's payload lives. Identifies bytes; never holds them."""

    file: Path
    offset: int
    length: int
    encoding: str  # "raw", or the typed field name holding the values
    data_type: int
    dims: tuple[int, ...]
    spans: tuple[tuple[int, int], ...] = ()  # typed encodings: field spans, tags included
    location: str | None = None  # external data: location as written in the model
    checksum: str | None = None  # external data: "algo:hex" when the model records one

    @property
    def is_external(self) -> bool:
        return self.location is not None

    @property
    def nbytes(self) -> int:
        """Size of the little-endian bytes this payload recovers to."""
        if self.encoding == "raw":
            return self.length
        n = expected_nbytes(self.data_type, self.dims)
        return self.length if n is None else n


def external_info(tensor: TensorProto) -> dict[str, str]:
    """The tensor's external-data entries by key; a key given twice (which one would
    win?) is refused, naming the tensor."""
    out = {e.key: e.value for e in tensor.external_data}
    if len(out) != len(tensor.external_data):
        seen: set[str] = set()
        twice = next(e.key for e in tensor.external_data
                     if e.key in seen or seen.add(e.key))  # type: ignore[func-returns-value]
        raise ExternalDataError("external data gives a key twice", tensor=tensor.name,
                                key=twice)
    return out


def _int_field(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return None
    try:
        value = int(info[key])
    except ValueError:
        raise ExternalDataError(f"external data {key} is not an integer", where=where,
                                value=info[key]) from None
    if value < 0:
        raise ExternalDataError(f"external data {key} is negative", where=where, value=value)
    return value


def describe(site: TensorSite, catalogue: Catalogue, base_dir: Path) -> PayloadDescriptor | None:
    """The payload descriptor of ``site``.

    None only for tensors whose values stay in the metadata model (strings) or have no
    type. A genuinely empty tensor (a dimension of 0) gets a descriptor of length 0 and is
    never confused with an omitted payload; a non-empty tensor with no data is an error.
    """
    t = site.tensor
    dims = tuple(t.dims)
    if any(d < 0 for d in dims):
        raise ModelError("tensor has a negative dimension", where=site.where, dims=list(dims))
    if t.data_location == TensorProto.EXTERNAL:
        info = external_info(t)
        location = info.get("location", "")
        path = resolve_location(base_dir, location, where=site.where)
        offset = _int_field(info, "offset", site.where) or 0
        length = _int_field(info, "length", site.where)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise ExternalDataError("external data file is missing", where=site.where,
                                    location=location) from None
        if not os.path.isfile(path):
            raise ExternalDataError("external data is not a regular file", where=site.where,
                                    location=location)
        if offset > size:
            raise ExternalDataError("external data offset lies past the end of its file",
                                    where=site.where, location=location, offset=offset,
                                    file_size=size)
        if length is None:
            length = size - offset
        if offset + length > size:
            raise ExternalDataError("external data range lies past the end of its file",
                                    where=site.where, location=location, offset=offset,
                                    length=length, file_size=size)
        expected = expected_nbytes(t.data_type, dims)
        if expected is not None and expected != length:
            raise ExternalDataError("external data length disagrees with the tensor's shape",
                                    where=site.where, location=location, length=length,
                                    expected=expected)
        return PayloadDescriptor(path, offset, length, "raw", t.data_type, dims,
                                 location=location, checksum=info.get("checksum"))
    inline = catalogue.payloads.get(site.path)
    if inline is None:
        expected = expected_nbytes(t.data_type, dims)
        if expected is None:
            return None
        if expected:
            raise ModelError("tensor has no data", where=site.where, dims=list(dims),
                             file=str(catalogue.source))
        return PayloadDescriptor(catalogue.source, 0, 0, "raw", t.data_type, dims)
    raw = inline.raw_range
    if raw is not None:
        offset, length = raw
        expected = expected_nbytes(t.data_type, dims)
        if expected is not None and expected != length:
            raise ModelError("raw_data length disagrees with the tensor's shape",
                             where=site.where, length=length, expected=expected,
                             file=str(catalogue.source))
        return PayloadDescriptor(catalogue.source, offset, length, "raw", t.data_type, dims)
    spans = tuple((f.start, f.end) for f in inline.fields)
    first, last = spans[0][0], spans[-1][1]
    return PayloadDescriptor(catalogue.source, first, last - first, inline.encoding,
                             t.data_type, dims, spans=spans)


def read_payload(desc: PayloadDescriptor, catalogue: Catalogue | None = None) -> bytes:
    """Recover exactly the little-endian bytes ``numpy_helper.to_array`` would hold."""
    if desc.encoding == "raw":
        if catalogue is not None and desc.file == catalogue.source:
            return catalogue.read(desc.offset, desc.length)
        return read_file_range(desc.file, desc.offset, desc.length)
    if catalogue is None or desc.file != catalogue.source:
        raise ModelError("typed payload needs its model's catalogue", file=str(desc.file))
    fragment = b"".join(catalogue.read(s, e - s) for s, e in desc.spans)
    return typed_fields.decode(fragment, desc.encoding, desc.data_type, desc.dims,
                               where=f"{desc.file.name}@{desc.offset}")


def read_file_range(path: Path, offset: int, length: int) -> bytes:
    try:
        fd = open_regular(path)
    except NotRegularFileError as exc:
        raise ExternalDataError(f"external data is {exc}", file=str(path)) from None
    try:
        return read_exact(fd, offset, length)
    except EOFError as exc:
        raise ExternalDataError(f"short read: {exc}", file=str(path), offset=offset,
                                length=length) from None
    finally:
        os.close(fd)
