"""The metadata model: structure plus small values, weights left out.

Small values (an If condition, a shape, a split size) are part of a model's metadata:
passes decide on them and scenario digests bind them. Payloads above the limit stay
omitted, and external references stay as they are: no external file is opened.

A model file whose every inline payload is small (a packaged model, whose weights are
external data) *is* its metadata model: :func:`parse_metadata` gets it with one parse by
protobuf's own parser, where the catalogue's wire walk would visit every field in Python.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelError
from ..io.onnx_proto import ModelProto, TensorProto
from .payload import expected_nbytes
from .reader import Catalogue, refuse_duplicate_initializers
from .schema import SMALL_VALUE_LIMIT, TYPED_FIELDS
from .sites import iter_tensor_sites, iter_tensors
from .typed_fields import check_values, narrows
from .utf8 import check_message

# files up to this size may be parsed whole: a larger one holds large payloads (or is a
# graph so big that the catalogue's bounded reads are worth their time anyway)
WHOLE_PARSE_LIMIT = 16 << 20


def metadata_model(catalogue: Catalogue, small_limit: int = SMALL_VALUE_LIMIT,
                   ) -> ModelProto:
    model = ModelProto()
    model.CopyFrom(catalogue.model)
    for site in iter_tensor_sites(model):
        payload = catalogue.payloads.get(site.path)
        if payload is None:
            continue
        nbytes = expected_nbytes(site.tensor.data_type, list(site.tensor.dims))
        size = nbytes if nbytes is not None else payload.stored_bytes
        if size <= small_limit:
            catalogue.restore(site.tensor, site.path, site.where)
    return model


def parse_metadata(data: bytes, source: Path, small_limit: int = SMALL_VALUE_LIMIT,
                   ) -> ModelProto | None:
    """The metadata model of the model file whose bytes are ``data``, parsed whole, when
    it holds no inline payload above ``small_limit`` (it is then exactly what
    :func:`metadata_model` gives); None when it does, or when anything about the file is
    in doubt: the catalogue then reads it (and names what is wrong with it)."""
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf's DecodeError, or its depth and size limits
        return None
    if not model.HasField("graph") or not model.ir_version:
        return None
    try:
        check_message(memoryview(data), 0, len(data), ModelProto.DESCRIPTOR)
    except ModelError:
        return None
    narrowed = False
    for t in iter_tensors(model):
        if _inline(t):
            nbytes = expected_nbytes(t.data_type, list(t.dims))
            if (nbytes is None or nbytes > small_limit
                    or t.data_location == TensorProto.EXTERNAL):
                return None
            narrowed = narrowed or narrows(t)
    refuse_duplicate_initializers(model, source)
    if narrowed:  # walked again only to name the tensor that holds what its type cannot
        for site in iter_tensor_sites(model):
            check_values(site.tensor, site.where)
    return model


def _inline(tensor: TensorProto) -> bool:
    """Does the tensor hold payload fields (the ones the catalogue leaves out)?"""
    return tensor.HasField("raw_data") or any(len(getattr(tensor, f)) for f in TYPED_FIELDS)
