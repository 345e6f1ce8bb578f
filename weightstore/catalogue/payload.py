"""Payload descriptors: where a tensor's bytes are, without reading them.

A descriptor says which file holds the bytes, at which absolute offset and length, and how
they are encoded there: ``raw`` little-endian bytes (``raw_data`` or external data), or a
packed typed field (``float_data``, ``int64_data``, ...) that must be converted.
Recovering the bytes reads exactly the descriptor's range.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExternalDataError, IntegrityError, ModelError
from ..io.digests import FILE_CHECKSUM, digest_file, split_key
from ..io.files import NotRegularFileError, open_regular, read_exact
from ..io.onnx_proto import TensorProto
from . import typed_fields
from .element_types import expected_nbytes
from .locations import resolve_location
from .reader import Catalogue
from .sites import TensorSite


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
    checksum: str | None = None  # external data: the payload's "algo:hex" (earlier packages)
    file_sha1: str | None = None  # external data: onnx.proto's SHA-1 of the whole file

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


EXTERNAL_KEYS = ("location", "offset", "length", "checksum")  # and prepacked_N
_DIGITS = frozenset("0123456789")
_MAX_OFFSET = 2**63 - 1  # onnxruntime's off_t / int64
_SHA1_HEX = 40
_HEX = _DIGITS | frozenset("abcdef")


@dataclass(frozen=True)
class ExternalEntries:
    """A tensor's external-data entries, read as onnxruntime reads them."""

    location: str
    offset: int
    length: int | None  # None: to the end of the file
    checksum: str | None  # weightstore's earlier "algo:hex" form: the payload's digest
    file_sha1: str | None = None  # onnx.proto's form: SHA-1 of the whole file, lowercase hex
    prepacked: tuple[tuple[str, str], ...] = ()  # onnxruntime's prepacked_N entries


def external_info(tensor: TensorProto) -> dict[str, str]:
    """The tensor's external-data entries by key, each checked by
    :func:`external_entries` when there are any; a key given twice (which one would
    win?) is refused."""
    if len(tensor.external_data):
        external_entries(tensor)
    return {e.key: e.value for e in tensor.external_data}


def external_entries(tensor: TensorProto, where: str | None = None) -> ExternalEntries:
    """The one parser of external-data entries (catalogue, convert, resolve, load).

    onnxruntime reads ``offset`` and ``length`` with ``strtoll`` in base 10 (leading blanks
    and a sign taken, trailing text refused) and refuses any key it does not know, where
    Python's ``int()`` also takes trailing blanks, underscores and any Unicode decimal
    digit: only plain ASCII digits read the same everywhere, so anything else is refused.
    A ``location`` must name a file (no empty component, no trailing ``/``). A
    ``checksum`` is onnx.proto's (40 hex digits: the SHA-1 of the whole file at
    ``location``, returned as ``file_sha1``) or the form packages of earlier weightstore
    versions wrote (``blake3:``/``sha256:`` + 64 lowercase hex: the payload's digest,
    returned as ``checksum``); any other form is refused, since it could be verified
    against nothing. Errors name the tensor, the key and the value.
    """
    context = {"tensor": tensor.name, **({"where": where} if where else {})}
    seen: dict[str, str] = {}
    prepacked = []
    for e in tensor.external_data:
        if e.key in seen or any(k == e.key for k, _ in prepacked):
            raise ExternalDataError("external data gives a key twice", **context, key=e.key)
        if e.key.startswith("prepacked"):
            prepacked.append((e.key, e.value))
        elif e.key in EXTERNAL_KEYS:
            seen[e.key] = e.value
        else:
            raise ExternalDataError("external data has a key onnxruntime does not know",
                                    **context, key=e.key, value=e.value)
    location = seen.get("location", "")
    if not location:
        raise ExternalDataError("external data has no location", **context, key="location",
                                value=location)
    # (an absolute location is refused where it is resolved, as a PathEscapeError)
    if "" in location.replace("\\", "/").lstrip("/").split("/"):
        raise ExternalDataError("external data location has an empty component (a "
                                "trailing or doubled '/'): it names no file",
                                **context, key="location", value=location)
    offset = _decimal(seen, "offset", context)
    checksum, file_sha1 = _checksum(seen.get("checksum"), context)
    return ExternalEntries(location, offset or 0, _decimal(seen, "length", context),
                           checksum, file_sha1, tuple(prepacked))


def _decimal(entries: dict[str, str], key: str, context: dict[str, str]) -> int | None:
    if key not in entries:
        return None
    value = entries[key]
    if not value or not _DIGITS.issuperset(value):
        raise ExternalDataError(f"external data {key} is not a plain decimal number (ASCII "
                                "digits only, as every reader reads it the same)",
                                **context, key=key, value=value)
    number = int(value)
    if number > _MAX_OFFSET:
        raise ExternalDataError(f"external data {key} is larger than 2**63-1", **context,
                                key=key, value=value)
    return number


def _checksum(value: str | None, context: dict[str, str]) -> tuple[str | None, str | None]:
    """``(payload digest, file SHA-1)`` of a ``checksum`` entry: at most one is set."""
    if value is None:
        return None, None
    if len(value) == _SHA1_HEX and _HEX.issuperset(value.lower()):
        return None, value.lower()
    try:
        split_key(value)
    except IntegrityError:
        raise ExternalDataError("external data checksum is neither onnx.proto's SHA-1 of the "
                                "file (40 hex digits) nor an earlier weightstore package's "
                                "blake3: or sha256: digest (lowercase hex) of the payload",
                                **context, key="checksum", value=value) from None
    return value, None


def verify_file_checksums(described: Iterable[tuple[PayloadDescriptor | None, str]]) -> None:
    """Refuse an external file whose SHA-1 is not the one its model declares.

    onnx.proto's external-data ``checksum`` is the SHA-1 of the whole file at ``location``
    (:attr:`PayloadDescriptor.file_sha1`): each file a model declares one for (in
    ``described``, each descriptor with the tensor it is of) is read once, whole, and
    every declaration is compared with it. A mismatch names the file and the tensor."""
    declared: dict[Path, list[tuple[PayloadDescriptor, str]]] = {}
    for desc, where in described:
        if desc is not None and desc.file_sha1 is not None:
            declared.setdefault(desc.file, []).append((desc, where))
    for path, descs in declared.items():
        actual = digest_file(FILE_CHECKSUM, path)
        for desc, where in descs:
            if desc.file_sha1 != actual:
                raise IntegrityError(
                    "external data file does not match the SHA-1 checksum its model "
                    "declares (onnx.proto's checksum)", file=str(path),
                    location=desc.location, tensor=where, expected=desc.file_sha1,
                    actual=actual)


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
        info = external_entries(t, site.where)
        location, offset, length = info.location, info.offset, info.length
        path = resolve_location(base_dir, location, where=site.where)
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
                                 location=location, checksum=info.checksum,
                                 file_sha1=info.file_sha1)
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
