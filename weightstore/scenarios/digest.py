"""``base_graph_digest``: binds a scenario to the exact base graph it was made for.

The digest covers what replay depends on and nothing physical, so it survives saving,
re-layout of external files, and appending scenarios:

- covered: the main graph and model-local functions in full (nodes, attributes and their
  subgraphs, inputs, outputs, value_info, initializer names, data types and dims, string
  tensors, doc strings), the opset imports (sorted), and one identity per tensor payload;
- not covered: payload bytes, external ``location``/``offset``/``length``,
  ``data_location``, the scenarios (field 20000), ``ir_version``, producer fields,
  model ``metadata_props`` (conversions record encodings there) and training info.

Payload bytes never enter the digest, not even through protobuf's serialization: every
numeric payload field is cleared from a copy before it is serialized, and each tensor
contributes its ``payload_identity`` instead. The default identity reads metadata only:
the ``checksum`` external-data entry when the model records one, else ``size:<nbytes>``
computed from dtype and dims. Inline payloads (and external ones without a checksum) are
therefore identified by their size alone, whatever their encoding: a catalogued metadata
model, whose inline payloads are omitted, digests like the fully parsed model, and a model
whose payload bytes are garbage still replays. Pass a content-based ``payload_identity``
when byte identity matters.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from ..catalogue.payload import expected_nbytes, external_info
from ..catalogue.schema import PAYLOAD_FIELDS
from ..catalogue.sites import TensorSite, iter_tensor_sites
from ..errors import ScenarioError
from ..hashing import ALGORITHMS, Hasher, new_hasher

PayloadIdentity = Callable[[TensorSite], str]

# Versioned domain separation: a change to what is covered must change every digest.
_DOMAIN = b"weightstore.base_graph_digest.v1\x00"


def default_payload_identity(site: TensorSite) -> str:
    """The recorded checksum, else the payload's size from dtype and dims (metadata only)."""
    tensor = site.tensor
    checksum = external_info(tensor).get("checksum")
    if checksum:
        return checksum
    if tensor.data_type == onnx.TensorProto.STRING:
        return "strings"  # string_data stays in the digested graph itself
    dims = tuple(tensor.dims)
    nbytes = expected_nbytes(tensor.data_type, dims) if all(d >= 0 for d in dims) else None
    return f"size:{'unknown' if nbytes is None else nbytes}"


def _payload_free_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """A ModelProto holding only the covered fields, at their original field numbers.

    Keeping ``graph`` and ``functions`` at their own numbers gives every tensor the same
    structural path as in ``model`` (paths count occurrences per field, so leaving training
    info out shifts nothing).
    """
    view = onnx.ModelProto()
    if model.HasField("graph"):
        view.graph.CopyFrom(model.graph)
    view.functions.extend(model.functions)
    for opset in sorted(model.opset_import, key=lambda o: (o.domain, o.version)):
        view.opset_import.add().CopyFrom(opset)
    return view


def _frame(hasher: Hasher, data: bytes) -> None:
    """Length-prefixed, so no two sequences of parts hash alike."""
    hasher.update(len(data).to_bytes(8, "little"))
    hasher.update(data)


def base_graph_digest(model: onnx.ModelProto,
                      payload_identity: PayloadIdentity | None = None,
                      algo: str = "blake3") -> bytes:
    """Raw digest (32 bytes) of ``model``'s base graph, as described in the module doc.

    ``payload_identity`` maps each tensor site (paths as in the catalogue) to a string that
    stands for its payload; it sees the tensor with its payload fields still in place.
    """
    if algo not in ALGORITHMS:
        raise ScenarioError("unknown digest algorithm", algorithm=algo,
                            known=", ".join(ALGORITHMS))
    identify = payload_identity or default_payload_identity
    view = _payload_free_view(model)
    sites = list(iter_tensor_sites(view))
    identities = [(site.key, identify(site)) for site in sites]
    for site in sites:
        tensor = site.tensor
        for name in PAYLOAD_FIELDS.values():
            tensor.ClearField(name)
        tensor.ClearField("external_data")
        tensor.ClearField("data_location")
    hasher = new_hasher(algo)
    hasher.update(_DOMAIN)
    _frame(hasher, view.SerializeToString(deterministic=True))
    for key, identity in identities:
        if not isinstance(identity, str):
            raise ScenarioError("payload identity is not a string", path=key,
                                type=type(identity).__name__)
        _frame(hasher, key.encode())
        _frame(hasher, identity.encode())
    return bytes.fromhex(hasher.hexdigest())
