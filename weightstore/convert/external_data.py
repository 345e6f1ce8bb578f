"""The ``external-data`` form: standard ONNX external data.

Only the keys ``location``, ``offset`` and ``length`` are written by the placement:
onnxruntime rejects keys it does not know, and onnx.proto's ``checksum`` is the SHA-1 of
the whole file, which the payload's digest is not. A model that stands alone with its data
file gets that SHA-1 (:func:`declare_file_checksums`). Tensors that were held in typed
fields are listed in the model's ``metadata_props`` under :data:`ENCODINGS_KEY` so that
inlining restores them exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ..catalogue.sites import iter_tensor_sites
from ..errors import ConversionError
from ..io.files import parse_json
from ..io.onnx_proto import ModelProto, TensorProto
from .encoding import set_external
from .placement import ExternalTensor

ENCODINGS_KEY = "weightstore.inline_encodings"


def apply_external_data(model: ModelProto, tensors: Sequence[ExternalTensor]) -> None:
    """Point every listed tensor at its placement (mutates ``model``)."""
    typed: dict[str, str] = {}
    for ext in tensors:
        p = ext.placement
        set_external(ext.site.tensor, p.location, p.offset, p.length)
        if ext.encoding != "raw_data":
            typed[ext.site.key] = ext.encoding
    if typed:
        set_metadata(model, ENCODINGS_KEY, json.dumps(typed, sort_keys=True))


def declare_file_checksums(model: ModelProto, sha1: Mapping[str, str]) -> None:
    """Give each external tensor of ``model`` whose ``location`` is a key of ``sha1``
    onnx.proto's ``checksum``: the SHA-1 of that whole file (lowercase hex). For a model
    that stands alone with its data file (a ``convert`` output), which no summary
    describes; packages write none (their digests are in ``summary.json``)."""
    for site in iter_tensor_sites(model):
        t = site.tensor
        if t.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in t.external_data if e.key == "location"), None)
        if location in sha1:
            t.external_data.add(key="checksum", value=sha1[location])


def recorded_encodings(model: ModelProto) -> dict[str, str]:
    """Take the typed encodings a conversion recorded out of ``model``: tensor path ->
    typed field."""
    raw = pop_metadata(model, ENCODINGS_KEY)
    try:
        encodings = parse_json(raw) if raw else {}
    except ValueError:
        raise ConversionError("malformed metadata entry", key=ENCODINGS_KEY) from None
    if not isinstance(encodings, dict):
        raise ConversionError("malformed metadata entry", key=ENCODINGS_KEY)
    return {str(k): str(v) for k, v in encodings.items()}


def set_metadata(model: ModelProto, key: str, value: str) -> None:
    for entry in model.metadata_props:
        if entry.key == key:
            entry.value = value
            return
    entry = model.metadata_props.add()
    entry.key = key
    entry.value = value


def pop_metadata(model: ModelProto, key: str) -> str | None:
    for i, entry in enumerate(model.metadata_props):
        if entry.key == key:
            value = entry.value
            del model.metadata_props[i]
            return value
    return None
