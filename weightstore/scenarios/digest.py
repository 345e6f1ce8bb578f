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

from collections.abc import Callable, Iterator

from ..catalogue import typed_fields
from ..catalogue.payload import expected_nbytes, external_info
from ..catalogue.schema import PAYLOAD_FIELDS, SMALL_VALUE_LIMIT
from ..catalogue.sites import ATTRIBUTE_NAME_PREFIX, TensorSite, iter_tensor_sites
from ..convert.encoding import has_payload
from ..errors import ScenarioError
from ..io.digests import ALGORITHMS, digest_bytes, new_hasher
from ..io.onnx_proto import FunctionProto, GraphProto, ModelProto, TensorProto

PayloadIdentity = Callable[[TensorSite], str]
_PAYLOAD_NAMES = frozenset(PAYLOAD_FIELDS.values())
_TYPED = tuple(n for n in PAYLOAD_FIELDS.values() if n != "raw_data")

# Versioned domain separation: a change to what is covered must change every digest.
_DOMAIN = b"weightstore.base_graph_digest.v2\x00"


def default_payload_identity(site: TensorSite) -> str:
    """What stands for a tensor's payload in the digest (see the module doc)."""
    return _identity(site.tensor, site.where)


def _identity(tensor: TensorProto, where: str) -> str:
    checksum = external_info(tensor).get("checksum")
    if checksum:
        return checksum
    if tensor.data_type == TensorProto.STRING:
        return "strings"  # string_data stays in the digested graph itself
    dims = tuple(tensor.dims)
    nbytes = expected_nbytes(tensor.data_type, dims) if all(d >= 0 for d in dims) else None
    external = tensor.data_location == TensorProto.EXTERNAL
    if nbytes is not None and 0 < nbytes <= SMALL_VALUE_LIMIT and not external:
        # small values are metadata: passes decide on them (an If condition, a shape)
        if not has_payload(tensor):
            raise ScenarioError("a small tensor's value is missing: digest the metadata "
                                "model with small values inline", where=where,
                                name=tensor.name)
        values = TensorProto()
        values.CopyFrom(tensor)
        for field, _ in values.ListFields():
            if field.name not in _PAYLOAD_NAMES:
                values.ClearField(field.name)
        return "value:" + digest_bytes("blake3", values.SerializeToString(deterministic=True))
    return f"size:{'unknown' if nbytes is None else nbytes}"


def _tensors(view: ModelProto) -> Iterator[TensorProto]:
    """Every tensor of the view, in the catalogue's structural order (a lean walk)."""
    def graph(g: GraphProto | FunctionProto) -> Iterator[TensorProto]:
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                if attr.HasField("g"):
                    yield from graph(attr.g)
                yield from attr.tensors
                for sub in attr.graphs:
                    yield from graph(sub)
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                for sp in attr.sparse_tensors:
                    yield sp.values
                    yield sp.indices
        if isinstance(g, GraphProto):
            yield from g.initializer
            for sp in g.sparse_initializer:
                yield sp.values
                yield sp.indices

    if view.HasField("graph"):
        yield from graph(view.graph)
    for f in view.functions:
        yield from graph(f)


def _payload_free_view(model: ModelProto) -> ModelProto:
    """A ModelProto holding only the covered fields, at their original field numbers.

    Keeping ``graph`` and ``functions`` at their own numbers gives every tensor the same
    structural path as in ``model`` (paths count occurrences per field, so leaving training
    info out shifts nothing).
    """
    view = ModelProto()
    if model.HasField("graph"):
        view.graph.CopyFrom(model.graph)
    view.functions.extend(model.functions)
    for opset in sorted(model.opset_import, key=lambda o: (o.domain, o.version)):
        view.opset_import.add().CopyFrom(opset)
    return view


def base_graph_digest(model: ModelProto,
                      payload_identity: PayloadIdentity | None = None,
                      algo: str = "blake3") -> bytes:
    """Raw digest (32 bytes) of ``model``'s base graph, as described in the module doc.

    ``payload_identity`` maps each tensor site (paths as in the catalogue) to a string that
    stands for its payload; it sees the tensor with its payload fields still in place.
    """
    if algo not in ALGORITHMS:
        raise ScenarioError("unknown digest algorithm", algorithm=algo,
                            known=", ".join(ALGORITHMS))
    view = _payload_free_view(model)
    for tensor in _tensors(view):  # names resolution gives unnamed attribute tensors
        if tensor.name.startswith(ATTRIBUTE_NAME_PREFIX):
            tensor.ClearField("name")
    identities: list[tuple[str, str]] = []
    if payload_identity is None:
        # Fast path: small inline values stay in the serialized view (that binds them);
        # only external references and large inline payloads give way to an identity.
        for i, tensor in enumerate(_tensors(view)):
            if _stays_inline(tensor):
                _as_raw(tensor)
                continue
            identities.append((str(i), _identity(tensor, tensor.name)))
            _clear_payload(tensor)
    else:
        for site in iter_tensor_sites(view):
            identities.append((site.key, payload_identity(site)))
            _clear_payload(site.tensor)
    parts = [_DOMAIN, view.SerializeToString(deterministic=True)]
    for key, identity in identities:
        if not isinstance(identity, str):
            raise ScenarioError("payload identity is not a string", path=key,
                                type=type(identity).__name__)
        parts += [key.encode(), identity.encode()]
    hasher = new_hasher(algo)
    hasher.update(b"".join(len(p).to_bytes(8, "little") + p for p in parts))
    return bytes.fromhex(hasher.hexdigest())


def _stays_inline(tensor: TensorProto) -> bool:
    """A small inline value, or strings: digested as serialized, with the graph."""
    if tensor.data_location == TensorProto.EXTERNAL:
        return False
    if tensor.data_type == TensorProto.STRING:
        return True
    dims = list(tensor.dims)
    nbytes = expected_nbytes(tensor.data_type, dims) if all(d >= 0 for d in dims) else None
    return nbytes is not None and nbytes <= SMALL_VALUE_LIMIT and (
        nbytes == 0 or has_payload(tensor) or _missing(tensor))


def _as_raw(tensor: TensorProto) -> None:
    """Typed fields to raw little-endian bytes (bit-exact), so the encoding a tool chose
    (onnx stores ``float_data`` as ``raw_data`` when it externalizes) does not count."""
    tensor.ClearField("data_location")  # DEFAULT, set or not: physical, not covered
    tensor.ClearField("external_data")
    if tensor.raw_data or tensor.data_type == TensorProto.STRING:
        return
    for name in _TYPED:
        values = getattr(tensor, name)
        if len(values):
            fragment = TensorProto()
            getattr(fragment, name).extend(values)
            raw = typed_fields.decode(fragment.SerializeToString(), name, tensor.data_type,
                                      list(tensor.dims), where=tensor.name)
            tensor.ClearField(name)
            tensor.raw_data = raw
            return


def _missing(tensor: TensorProto) -> bool:
    raise ScenarioError("a small tensor's value is missing: digest the metadata model with "
                        "small values inline", name=tensor.name)


def _clear_payload(tensor: TensorProto) -> None:
    for name in PAYLOAD_FIELDS.values():
        tensor.ClearField(name)
    tensor.ClearField("external_data")
    tensor.ClearField("data_location")
