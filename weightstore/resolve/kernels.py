"""Placement, kernel selection and prepared-object requirements (the seed's Step 4).

A kernel catalogue says, for a device, which nodes run on which execution provider and
which of their weights the kernel wants in a prepared (prepacked) form. Kernels see the
node, the inferred graph and weight descriptors, never weight bytes. The built-in CPU
catalogue follows what onnxruntime's CPU provider prepacks at session creation:

* ``MatMul`` with a constant 2-D float B (MLAS packed B);
* ``Gemm`` with a constant 2-D float B: the packed object is op(B), so ``transB`` is part
  of the requirement, and two Gemms reading one B with different ``transB`` need two;
* ``Conv`` with a constant 4-D float W.

Identical requests (same weight, kernel and form) are deduplicated before payload
closure; each lists every node that consumes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..io.onnx_proto import ModelProto, NodeProto, TensorProto
from ..passes.analysis import (
    STANDARD_DOMAINS,
    Scope,
    attribute,
    constant_weights,
    initializers,
    input_names,
    iter_scopes,
)
from .prepared import PreparedRequirement

FLOAT = TensorProto.FLOAT


@dataclass(frozen=True)
class WeightInfo:
    """What a kernel may know of a weight: its type and shape (no bytes)."""

    name: str
    dtype: int
    dims: tuple[int, ...]


class KernelCatalogue(Protocol):
    provider: str
    keeps_source: bool  # the runtime still reads a weight's source next to its packed form

    def requests(self, node: NodeProto, weights: Mapping[str, WeightInfo],
                 ) -> list[tuple[int, tuple[tuple[str, str], ...]]]:
        """(input position, form) of each weight ``node`` wants prepared."""
        ...


class CpuKernels:
    """onnxruntime's CPU execution provider and what its kernels prepack.

    onnxruntime packs the source at session creation even when a packed weight is
    supplied (then takes the supplied one in its place; 1.32 compares the two first), so
    it needs the source tensor: a prepared object does not make its source dead here.
    """

    provider = "CPUExecutionProvider"
    keeps_source = True

    def requests(self, node: NodeProto, weights: Mapping[str, WeightInfo],
                 ) -> list[tuple[int, tuple[tuple[str, str], ...]]]:
        if node.domain not in STANDARD_DOMAINS or len(node.input) < 2:
            return []
        w = weights.get(node.input[1])
        if w is None or w.dtype != FLOAT:
            return []
        if node.op_type == "MatMul" and len(w.dims) == 2:
            return [(1, ())]
        if node.op_type == "Gemm" and len(w.dims) == 2:
            return [(1, (("transB", str(int(attribute(node, "transB", 0)))),))]  # type: ignore[arg-type]
        if node.op_type == "Conv" and len(w.dims) == 4:
            return [(1, ())]
        return []


CATALOGUES: dict[str, KernelCatalogue] = {"cpu": CpuKernels()}


def catalogue_for(capabilities: Mapping[str, Any]) -> tuple[str, KernelCatalogue]:
    """The device kind named by ``capabilities['device']`` (default ``cpu``) and its
    catalogue; a kind without one has no prepared requirements."""
    kind = str(capabilities.get("device", "cpu"))
    return kind, CATALOGUES.get(kind, _NoPrepacking())


class _NoPrepacking:
    provider = "CPUExecutionProvider"
    keeps_source = True

    def requests(self, node, weights):
        return []


def _weights(scope: Scope) -> dict[str, WeightInfo]:
    """Fixed weights visible from ``scope`` (inner definitions hide outer ones)."""
    chain = []
    s: Scope | None = scope
    while s is not None:
        chain.append(s)
        s = s.parent
    out: dict[str, WeightInfo] = {}
    for s in reversed(chain):
        c = s.container
        for name in input_names(c):
            out.pop(name, None)
        for name, t in initializers(c).items():
            if name not in input_names(c):
                out[name] = WeightInfo(name, t.data_type, tuple(t.dims))
        constants = constant_weights(c)
        for node in c.node:
            for o in node.output:
                if o and o not in constants:
                    out.pop(o, None)
        for name, (_, t) in constants.items():
            out[name] = WeightInfo(name, t.data_type, tuple(t.dims))
    return out


def select_kernels(model: ModelProto, device: str, kernels: KernelCatalogue,
                   ) -> tuple[dict[str, str], tuple[PreparedRequirement, ...]]:
    """Placement (node -> provider) and the deduplicated prepared requirements."""
    placement: dict[str, str] = {}
    found: dict[tuple, PreparedRequirement] = {}
    for scope in iter_scopes(model, functions=False):
        weights = _weights(scope)
        for i, node in enumerate(scope.container.node):
            label = node.name or (node.output[0] if node.output else f"#{i}")
            placement[label] = kernels.provider
            for position, form in kernels.requests(node, weights):
                w = weights[node.input[position]]
                req = PreparedRequirement(w.name, node.op_type, form, device,
                                          kernels.provider, w.dtype, w.dims, (label,),
                                          bool(scope.path))
                old = found.get(req.key)
                if old is not None:
                    req = replace(old, consumers=(*old.consumers, label),
                                  in_subgraph=old.in_subgraph and req.in_subgraph)
                found[req.key] = req
    return placement, tuple(found[k] for k in sorted(found))
