"""The metadata model: structure plus small values, weights left out.

Small values (an If condition, a shape, a split size) are part of a model's metadata:
passes decide on them and scenario digests bind them. Payloads above the limit stay
omitted, and external references stay as they are: no external file is opened.
"""

from __future__ import annotations

import onnx

from .payload import SMALL_VALUE_LIMIT, expected_nbytes
from .reader import Catalogue
from .sites import iter_tensor_sites


def metadata_model(catalogue: Catalogue, small_limit: int = SMALL_VALUE_LIMIT,
                   ) -> onnx.ModelProto:
    model = onnx.ModelProto()
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
