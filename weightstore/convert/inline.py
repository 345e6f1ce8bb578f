"""The reverse conversion: external data and FileConstant nodes back to inline tensors.

Every payload read is bounds-checked, its path kept inside the model's folder, and verified
against the digest recorded beside it (``checksum`` or ``file_id``) when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import helper

from ..catalogue.locations import resolve_location
from ..catalogue.payload import describe, read_file_range, read_payload
from ..catalogue.reader import Catalogue
from ..catalogue.sites import iter_tensor_sites
from ..errors import ConversionError, ExternalDataError, IntegrityError
from ..hashing import ALGORITHMS, digest_bytes
from .encoding import set_payload
from .external_data import ENCODINGS_KEY, pop_metadata
from .file_constant import restore_constants


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


def inline_model(catalogue: Catalogue, base_dir: Path | None = None) -> onnx.ModelProto:
    """A copy of the catalogued model with every payload inline, encodings restored."""
    base_dir = base_dir or catalogue.source.parent
    model = onnx.ModelProto()
    model.CopyFrom(catalogue.model)
    raw = pop_metadata(model, ENCODINGS_KEY)
    try:
        encodings = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        raise ConversionError("malformed metadata entry", key=ENCODINGS_KEY) from None
    for site in iter_tensor_sites(model):
        desc = describe(site, catalogue, base_dir)
        if desc is None:
            continue
        if desc.is_external:
            data = read_payload(desc, catalogue)
            check_digest(data, desc.checksum, where=site.where, location=desc.location)
            set_payload(site.tensor, data, encodings.get(site.key, "raw_data"))
        else:
            catalogue.restore(site.tensor, site.path, site.where)

    def read(node: onnx.NodeProto, where: str) -> bytes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        location = attrs["location"]
        location = location.decode() if isinstance(location, bytes) else location
        path = resolve_location(base_dir, location, where=where)
        offset, length = int(attrs.get("offset", 0)), int(attrs["length"])
        if not path.is_file():
            raise ExternalDataError("FileConstant file is missing", where=where,
                                    location=location)
        size = path.stat().st_size
        if offset < 0 or length < 0 or offset + length > size:
            raise ExternalDataError("FileConstant range lies past the end of its file",
                                    where=where, location=location, offset=offset,
                                    length=length, file_size=size)
        data = read_file_range(path, offset, length)
        file_id = attrs.get("file_id")
        check_digest(data, file_id.decode() if isinstance(file_id, bytes) else file_id,
                     where=where, location=location)
        return data

    restore_constants(model, read)
    return model
