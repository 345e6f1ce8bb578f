"""Weight descriptors: what a tensor is and where its bytes are, without the bytes.

The seed's ``WeightDescriptor``: name, element type, dimensions, origin, payload descriptor,
optional source digest and optional derivation, plus where the tensor lives in the model.
An omitted payload is a lazy :class:`PayloadDescriptor`; a genuinely empty tensor has a
payload of length 0 and :attr:`WeightDescriptor.is_empty` set, so the two never mix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..io.onnx_proto import TensorProto
from .payload import PayloadDescriptor, describe, read_payload
from .reader import Catalogue
from .schema import Path as TensorPath
from .schema import path_str
from .sites import iter_tensor_sites


class PayloadOrigin(str, Enum):
    """Where a payload comes from (the seed's ``PayloadOrigin``)."""

    PORTABLE = "portable"  # the model's own tensor
    PREPARED = "prepared"  # a prepacked object from a prepared-model cache
    DERIVED = "derived"  # computed from other weights by a DerivedWeightRecipe


@dataclass(frozen=True)
class DerivedWeightRecipe:
    """How a derived weight's bytes are produced from other weights (e.g. fused Q/K/V)."""

    operation: str
    sources: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WeightDescriptor:
    name: str
    element_type: int
    dims: tuple[int, ...]
    origin: PayloadOrigin
    payload: PayloadDescriptor | None  # None: values held in the metadata model (strings)
    role: str  # "initializer" | "constant" | "attribute" | "sparse"
    where: str
    path: TensorPath
    scope: tuple[str, ...]  # graphs from the root to the owner, readable
    function: str | None = None  # "domain:name" when inside a model-local function
    source_digest: str | None = None  # "algo:hex" when the model records one
    derivation: DerivedWeightRecipe | None = None
    string_bytes: int = 0  # strings: the bytes of their string_data, always inline

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes if self.payload is not None else self.string_bytes

    @property
    def is_empty(self) -> bool:
        """A genuinely empty tensor (not an omitted payload)."""
        return self.payload is not None and self.payload.nbytes == 0

    @property
    def is_external(self) -> bool:
        return self.payload is not None and self.payload.is_external

    def read(self, catalogue: Catalogue) -> bytes:
        """The little-endian bytes, reading only this payload's range."""
        if self.payload is None:
            raise ValueError(f"{self.where} keeps its values in the metadata model")
        return read_payload(self.payload, catalogue)

    def to_dict(self) -> dict[str, Any]:
        p = self.payload
        out: dict[str, Any] = {
            "name": self.name,
            "dtype": TensorProto.DataType.Name(self.element_type),
            "shape": list(self.dims),
            "bytes": self.nbytes,
            "origin": self.origin.value,
            "role": self.role,
            "where": self.where,
            "scope": list(self.scope),
            "function": self.function,
            "path": path_str(self.path),
        }
        if p is None and self.element_type == TensorProto.STRING:
            out["payload"] = {"file": None, "offset": None, "length": self.string_bytes,
                              "encoding": "string_data", "location": None, "checksum": None}
        elif p is not None:
            out["payload"] = {
                "file": p.file.name, "offset": p.offset, "length": p.length,
                "encoding": p.encoding, "location": p.location,
                "checksum": p.checksum or p.file_sha1,  # as the model writes it
            }
        return out


def weight_descriptors(catalogue: Catalogue, base_dir: Path | None = None,
                       ) -> list[WeightDescriptor]:
    """Every tensor of the catalogued model, in structural order; reads no payload byte."""
    base_dir = base_dir or catalogue.source.parent
    out = []
    for site in iter_tensor_sites(catalogue.model):
        payload = describe(site, catalogue, base_dir)
        name = site.value_name or site.tensor.name
        out.append(WeightDescriptor(
            name=name, element_type=site.tensor.data_type, dims=tuple(site.tensor.dims),
            origin=PayloadOrigin.PORTABLE, payload=payload, role=site.role, where=site.where,
            path=site.path, scope=site.scope, function=site.function,
            source_digest=payload.checksum if payload is not None else None,
            string_bytes=sum(map(len, site.tensor.string_data))))
    return out
