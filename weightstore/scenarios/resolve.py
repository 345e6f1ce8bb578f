"""The live payloads of a resolved graph: each external tensor's location, range and
checksum, checked to be an eligible payload, nothing read.

Resolving the graph itself (replay, cleanup, constant-result folding) is
:mod:`weightstore.resolve`'s: :func:`weightstore.resolve.variant.variant_graph` for a model
in hand, :func:`weightstore.resolve.variant.resolve_variant` for a model file. Checking the
files that hold the live payloads is a separate, later step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..catalogue.payload import expected_nbytes, external_entries
from ..catalogue.sites import TensorSite, ambiguous_names, iter_tensor_sites, value_key
from ..errors import ScenarioError
from ..io.onnx_proto import ModelProto, TensorProto


@dataclass(frozen=True)
class LivePayload:
    """One external payload a resolved variant needs, located but not read."""

    name: str
    where: str
    location: str
    offset: int
    length: int
    checksum: str | None
    # a FileConstant's element type and shape (an external tensor's are on its site)
    dtype: int = 0
    dims: tuple[int, ...] = ()


def live_payloads(resolved: ModelProto, scenario: str | None = None, *,
                  sites: Iterable[TensorSite] | None = None,
                  ambiguous: frozenset[str] | None = None) -> list[LivePayload]:
    """Every external payload of a resolved variant, in structural order.

    Every tensor must hold exactly one eligible payload: inline values, or external data
    with a location and a length that fits its type and shape. ``sites``: the variant's
    tensor sites, when the caller has walked them already, and their ``ambiguous`` names
    (each payload is named by its value key, ``TensorSite.value_key``).
    """
    sites = list(iter_tensor_sites(resolved)) if sites is None else list(sites)
    if ambiguous is None:
        ambiguous = ambiguous_names(resolved, sites)
    out = _file_constants(resolved, scenario, ambiguous)
    for site in sites:
        t = site.tensor
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = external_entries(t, site.where)
        name = site.value_key(ambiguous)
        offset, length = info.offset, info.length
        expected = expected_nbytes(t.data_type, list(t.dims))
        if length is None:
            length = expected
        if length is None or (expected is not None and length != expected):
            raise ScenarioError("live weight has no eligible payload", scenario=scenario,
                                initializer=name, location=info.location)
        out.append(LivePayload(name, site.where, info.location, offset, length,
                               info.checksum))
    return out


def live_value_names(resolved: ModelProto) -> set[str]:
    """Names of the weights (initializers, Constant values) a resolved variant keeps."""
    return {site.value_name for site in iter_tensor_sites(resolved)
            if site.role in ("initializer", "constant") and site.value_name}


def _file_constants(resolved: ModelProto, scenario: str | None,
                    ambiguous: frozenset[str]) -> list[LivePayload]:
    """The payloads of FileConstant nodes (the file-constant form) of a resolved model:
    each needs a ``location`` and a range its fixed-size type and shape fill exactly."""
    from ..catalogue.graphs import iter_scoped_containers
    from ..convert.file_constant import (
        attribute_text,
        file_constant_attributes,
        is_file_constant,
        tensor_of,
    )
    from ..convert.inline import file_constant_range
    from ..errors import ConversionError

    out = []
    for container, where, chain in iter_scoped_containers(resolved):
        for node in container.node:
            if not is_file_constant(node):
                continue
            attrs = file_constant_attributes(node)
            name = value_key(chain, node.output[0] if node.output else node.name, ambiguous)
            location = attribute_text(attrs.get("location", b""))
            node_where = f"{where} node '{node.name}'"
            try:
                tensor = tensor_of(attrs, node, node_where)
                offset, length = file_constant_range(attrs, node_where)
            except ConversionError:
                tensor, offset, length = None, -1, -1
            expected = (expected_nbytes(tensor.data_type, list(tensor.dims))
                        if tensor is not None else None)  # None: strings, unknown types
            if (not location or offset < 0 or length < 0 or expected is None
                    or length != expected):
                raise ScenarioError("live FileConstant has no eligible payload",
                                    scenario=scenario, initializer=name, location=location)
            checksum = attribute_text(attrs["file_id"]) if attrs.get("file_id") else None
            out.append(LivePayload(name, node_where, location, offset, length, checksum,
                                   tensor.data_type, tuple(tensor.dims)))
    return out
