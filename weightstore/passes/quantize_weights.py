"""quantize-weights: MatMul weights to 4- or 8-bit blocks, read by com.microsoft MatMulNBits.

The weight-only quantization onnxruntime's ``MatMulNBitsQuantizer`` does with its default
round-to-nearest algorithm (QOperator format), as replayable records: each selected
``MatMul(A, B)`` becomes ``MatMulNBits(A, B_Q<bits>, B_scales[, B_zero_points])`` with
attributes ``K``, ``N``, ``bits``, ``block_size`` and ``accuracy_level`` (omitted at 0),
named ``<MatMul's name>_Q<bits>`` and writing the MatMul's output. The three new weights
are declared with ``matmul-nbits-*`` recipes over B (:mod:`weightstore.scenarios.derive`
computes them with onnxruntime's own kernels, once per weight); B goes in the record of
its last quantized reader when nothing else reads it. The records import the
``com.microsoft`` domain (version 1) when the model does not.

Which MatMuls, as ``MatMulNBitsQuantizer`` picks them: every standard-domain MatMul whose
B is an initializer of the same graph holding a float32 or float16 matrix (2 dims), in
every graph (subgraphs too), then narrowed by the parameters: ``nodes`` (a regular
expression the node's name must contain a match of), ``exclude`` (one it must not) and
``min_elements`` (smaller weights stay). Left as they are, where the quantizer would do
otherwise or fail: a B that is also a graph input (a caller may override it; the
quantizer drops the input), a B a subgraph's MatMul reads from an enclosing graph, and a
B of more than 2 dims with unit leading ones (the quantizer reshapes it).

Gemm is skipped, as ``MatMulNBitsQuantizer`` skips it (its ``op_types_to_quantize`` is
MatMul alone): every graph this pass writes is one that quantizer writes for the same
settings, byte for byte, which is what makes it checkable. A Gemm head (a classifier's
``Gemm(x, W, b, transB=1)``) stays float; mapping it would take a transposed copy of W
and MatMulNBits' optional bias, with ``alpha``/``beta``/``transA`` refused, a graph no
reference tool produces.
"""

from __future__ import annotations

import math
import re

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import ModelProto, NodeProto, TensorProto, make_node
from ..recipe.pass_params import QuantizeWeightsParams
from .analysis import (
    NameAllocator,
    Scope,
    initializers,
    input_names,
    is_standard,
    per_graph,
    readers,
    removable_weights,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting

DOMAIN = "com.microsoft"
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)


class QuantizeWeights:
    """The ``quantize-weights`` pass."""

    name = "quantize-weights"
    Params = QuantizeWeightsParams

    def __init__(self, params: QuantizeWeightsParams | None = None) -> None:
        self.params = params or QuantizeWeightsParams()
        self._nodes = re.compile(self.params.nodes) if self.params.nodes is not None else None
        self._exclude = (re.compile(self.params.exclude)
                         if self.params.exclude is not None else None)

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        return per_graph(model, self._graph, nodes=True)

    def selects(self, node: NodeProto, b: TensorProto) -> bool:
        """Does this pass quantize ``node``, a MatMul reading the fixed weight ``b``?"""
        if self._nodes is not None and not self._nodes.search(node.name):
            return False
        if self._exclude is not None and self._exclude.search(node.name):
            return False
        return (b.data_type in FLOATS and len(b.dims) == 2
                and math.prod(b.dims) >= self.params.min_elements)

    def _graph(self, scope: Scope, counts: dict[str, int], values: NameAllocator,
               nodes: NameAllocator) -> list[LocalRewriting]:
        g = scope.container
        inits = initializers(g)
        inputs = set(input_names(g))
        matches: dict[str, list[int]] = {}
        for i, node in enumerate(g.node):
            if not is_standard(node, "MatMul") or len(node.input) != 2:
                continue
            b = inits.get(node.input[1])
            if (b is None or b.name in inputs or counts.get(b.name, 0) != 1
                    or not self.selects(node, b)):
                continue
            matches.setdefault(b.name, []).append(i)
        reads = readers(g)
        records = []
        for b_name, positions in matches.items():
            records += self._weight(scope, inits[b_name], positions, reads, values, nodes)
        return records

    def _weight(self, scope: Scope, b: TensorProto, positions: list[int],
                reads: dict[str, list[int]], values: NameAllocator, nodes: NameAllocator,
                ) -> list[LocalRewriting]:
        """The records quantizing weight ``b`` for its MatMuls at ``positions``."""
        g = scope.container
        p = self.params
        k, n = (int(d) for d in b.dims)
        blocks = (k + p.block_size - 1) // p.block_size
        kpack = 8 // p.bits
        names = {"weight": values.fresh(f"{b.name}_Q{p.bits}"),
                 "scales": values.fresh(f"{b.name}_scales")}
        declared = [
            without_payload(b, names["weight"], TensorProto.UINT8,
                            (n, blocks, (p.block_size + kpack - 1) // kpack)),
            without_payload(b, names["scales"], b.data_type, (n, blocks))]
        if not p.symmetric:
            names["zero-points"] = values.fresh(f"{b.name}_zero_points")
            declared.append(without_payload(b, names["zero-points"], TensorProto.UINT8,
                                            (n, (blocks + kpack - 1) // kpack)))
        attributes = (("bits", str(p.bits)), ("block_size", str(p.block_size)),
                      ("symmetric", "true" if p.symmetric else "false"))
        derivations = {name: DerivedWeightRecipe(f"matmul-nbits-{part}", (b.name,), attributes)
                       for part, name in names.items()}
        also_read = any(g.node[i].input[0] == b.name for i in positions)  # MatMul(w, w)
        drop, _ = ((), ()) if also_read else removable_weights(g, [b.name], positions, reads)
        kwargs = {"K": k, "N": n, "bits": p.bits, "block_size": p.block_size}
        if p.accuracy_level:
            kwargs["accuracy_level"] = p.accuracy_level
        records = []
        for number, i in enumerate(positions):
            first, last = number == 0, number == len(positions) - 1
            matmul = g.node[i]
            name = nodes.fresh(f"{matmul.name}_Q{p.bits}") if matmul.name else ""
            quantized = make_node(
                "MatMulNBits", [matmul.input[0], *names.values()], [matmul.output[0]],
                name=name, domain=DOMAIN, **kwargs)
            records.append(LocalRewriting(
                operation_name=self.name,
                graph_path=scope.path,
                removed_nodes=(i,),
                added_nodes=(quantized,),
                insert_at=i,
                added_initializers=tuple(declared) if first else (),
                removed_initializers=drop if last else (),
                derivations=derivations if first else {},
                opset_imports={DOMAIN: 1},
            ))
        return records
