"""The reverse conversion: external data and FileConstant nodes back to inline tensors.

Every payload read is bounds-checked, its path kept inside the model's folder, and verified
against the digest recorded beside it (``checksum`` or ``file_id``) when there is one; a
file whose model declares onnx.proto's SHA-1 of it is checked whole first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path

from ..catalogue.locations import resolve_location
from ..catalogue.payload import (
    describe,
    expected_nbytes,
    read_file_range,
    read_payload,
    verify_file_checksums,
)
from ..catalogue.reader import Catalogue
from ..catalogue.sites import iter_tensor_sites
from ..errors import ConversionError, ExternalDataError, IntegrityError
from ..io.digests import ALGORITHMS, digest_bytes
from ..io.onnx_proto import ModelProto, NodeProto, TensorProto
from .encoding import set_payload
from .external_data import recorded_encodings
from .file_constant import (
    attribute_text,
    file_constant_attributes,
    is_any_file_constant,
    iter_containers,
    restore_constants,
)


def file_constant_file(attrs: Mapping[str, object], base_dir: Path,
                       value_bins: Mapping[str, Path] | None, where: str,
                       ) -> tuple[Path, dict[str, str]]:
    """The file a FileConstant node reads, in GE's order: the ``location`` attribute, then
    ``file_path`` (both relative to the model and kept inside its folder), then
    ``file_id`` through the map the user gave (``value_bins``; None where the command
    takes no such map, as build and convert to-external). Also returns what named it, for
    errors."""
    for attr in ("location", "file_path"):
        value = attribute_text(attrs.get(attr) or "")
        if value:
            return resolve_location(base_dir, value, where=where), {attr: value}
    file_id = attribute_text(attrs.get("file_id") or "")
    if file_id and value_bins is not None and file_id in value_bins:
        return Path(value_bins[file_id]), {"file_id": file_id,
                                           "value_bin": str(value_bins[file_id])}
    if file_id and value_bins is None:
        raise ConversionError("FileConstant names its file by file_id only (GE's "
                              "ge.exec.value_bins), which this command cannot map to a file; "
                              "bring the weights inline first with `weightstore convert "
                              "to-inline MODEL OUT --value-bins ID=PATH`", where=where,
                              file_id=file_id)
    if file_id:
        raise ConversionError("FileConstant names a file_id no --value-bins entry maps to a "
                              "file; add --value-bins ID=PATH for it", where=where,
                              file_id=file_id)
    raise ConversionError("FileConstant has no location, file_path or file_id", where=where)


def check_digest(data: bytes, key: str | None, **context: object) -> None:
    """Raise IntegrityError when ``data`` does not match ``key`` ("algo:hex")."""
    if not key:
        return
    algo, _, expected = key.partition(":")
    if algo not in ALGORITHMS:
        return  # a checksum written by another tool in a form we do not know
    actual = digest_bytes(algo, data)
    if actual != expected:
        raise IntegrityError("payload digest mismatch", expected=key,
                             actual=f"{algo}:{actual}", **context)


def file_constant_range(attrs: Mapping[str, object], where: str) -> tuple[int, int]:
    """A FileConstant's ``(offset, length)``; the length from dtype and shape when the
    node gives none."""
    try:
        offset = int(attrs.get("offset", 0))
        length = int(attrs["length"]) if "length" in attrs else expected_nbytes(
            int(attrs["dtype"]), [int(d) for d in attrs["shape"]])
    except (TypeError, ValueError, KeyError):
        raise ConversionError("FileConstant offset, length, dtype or shape is not "
                              "usable", where=where) from None
    if length is None:
        raise ConversionError("FileConstant has no length and a type of no fixed size",
                              where=where)
    return offset, length


def file_constant_reads(model: ModelProto) -> list[tuple[str, int, int]]:
    """``(file, offset, length)`` each FileConstant node reads from its file (for a
    progress total and the report; a node whose range is unusable is left out here and
    fails when read). ``file``: its ``location``, ``file_path`` or ``file_id`` as written."""
    out = []
    for container, where in iter_containers(model):
        for node in container.node:
            if not is_any_file_constant(node):
                continue
            attrs = file_constant_attributes(node)
            value = attrs.get("value")
            if isinstance(value, TensorProto) and value.data_location != value.EXTERNAL:
                continue
            name = next((attribute_text(attrs[k]) for k in ("location", "file_path",
                                                               "file_id") if attrs.get(k)), "")
            with contextlib.suppress(ConversionError):
                offset, length = file_constant_range(attrs, where)
                out.append((name, offset, max(length, 0)))
    return out


def inline_model(catalogue: Catalogue, base_dir: Path | None = None,
                 value_bins: Mapping[str, Path] | None = None,
                 progress: Callable[[int], None] | None = None) -> ModelProto:
    """A copy of the catalogued model with every payload inline, encodings restored.

    ``value_bins`` maps GE ``file_id`` values to files (GE's ``ge.exec.value_bins``).
    ``progress(n)`` is told of every ``n`` payload bytes read from a file.
    """
    def advance(n: int) -> None:
        if progress is not None:
            progress(n)

    base_dir = base_dir or catalogue.source.parent
    model = ModelProto()
    model.CopyFrom(catalogue.model)
    encodings = recorded_encodings(model)
    described = [(site, describe(site, catalogue, base_dir)) for site in iter_tensor_sites(model)]
    verify_file_checksums((desc, site.where) for site, desc in described)
    for site, desc in described:
        if desc is None:
            continue
        if desc.is_external:
            data = read_payload(desc, catalogue)
            check_digest(data, desc.checksum, where=site.where, location=desc.location)
            advance(len(data))
            set_payload(site.tensor, data, encodings.get(site.key, "raw_data"))
        else:
            catalogue.restore(site.tensor, site.path, site.where)

    def read(node: NodeProto, where: str) -> bytes:
        attrs = file_constant_attributes(node)
        value = attrs.get("value")
        if isinstance(value, TensorProto) and value.data_location != value.EXTERNAL:
            return value.raw_data  # GE's value tensor, its external data read above
        path, named = file_constant_file(attrs, base_dir, value_bins, where)
        offset, length = file_constant_range(attrs, where)
        if not path.is_file():
            raise ExternalDataError("FileConstant file is missing", where=where, **named)
        size = path.stat().st_size
        if offset < 0 or length < 0 or offset + length > size:
            raise ExternalDataError("FileConstant range lies past the end of its file",
                                    where=where, offset=offset, length=length,
                                    file_size=size, **named)
        data = read_file_range(path, offset, length)
        file_id = attrs.get("file_id")
        check_digest(data, attribute_text(file_id) if file_id is not None else None,
                     where=where, **named)
        advance(length)
        return data

    restore_constants(model, read)
    return model
