"""gemm-transpose-b: Gemm with ``transB=1`` reads a pre-transposed copy of its weight.

Exported linear layers store B as [N, K] and ask Gemm to transpose it at every run; kernels
that want [K, N] then repack it. Storing B' = B^T (a ``transpose`` recipe, perm [1, 0])
lets the Gemm run with ``transB=0``. The Gemm is replaced in place (same position, same
outputs). Several such Gemms reading one B share one B'; B is removed by the record of its
last reader once nothing reads it after the rewrite (no other node, and none of these
Gemms as its A or C input).
"""

from __future__ import annotations

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import ModelProto, NodeProto
from .analysis import (
    NameAllocator,
    Scope,
    attribute,
    is_standard,
    per_graph,
    readers,
    removable_weights,
    weight,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting


class GemmTransposeB:
    """The ``gemm-transpose-b`` pass."""

    name = "gemm-transpose-b"

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        return per_graph(model, self._graph)

    def _graph(self, scope: Scope, counts: dict[str, int], values: NameAllocator,
               ) -> list[LocalRewriting]:
        g = scope.container
        matches: dict[str, list[int]] = {}
        for i, node in enumerate(g.node):
            if not is_standard(node, "Gemm") or len(node.input) < 2 or attribute(
                    node, "transB", 0) != 1:
                continue
            b = weight(g, node.input[1])
            if b is None or len(b.dims) != 2 or counts.get(b.name, 0) != 1:
                continue
            matches.setdefault(b.name, []).append(i)
        reads = readers(g)
        records = []
        for b_name, positions in matches.items():
            b = weight(g, b_name)
            assert b is not None
            transposed = values.fresh(f"{b_name}.transposed")
            # B goes only when its Gemms read it as B alone: one that also reads it as A or
            # C (``Gemm(w, w)``, B as bias) still reads it after the rewrite
            also_read = any(name == b_name for i in positions
                            for j, name in enumerate(g.node[i].input) if j != 1)
            inits, constants = ((), ()) if also_read else removable_weights(
                g, [b_name], positions, reads)
            for k, i in enumerate(positions):
                first, last = k == 0, k == len(positions) - 1
                gemm = NodeProto()
                gemm.CopyFrom(g.node[i])
                gemm.input[1] = transposed
                kept = [a for a in gemm.attribute if a.name != "transB"]
                del gemm.attribute[:]
                gemm.attribute.extend(kept)
                records.append(LocalRewriting(
                    operation_name=self.name,
                    graph_path=scope.path,
                    removed_nodes=(i, *constants) if last else (i,),
                    added_nodes=(gemm,),
                    insert_at=i,
                    added_initializers=(without_payload(b, transposed, dims=b.dims[::-1]),)
                    if first else (),
                    removed_initializers=inits if last else (),
                    derivations={transposed: DerivedWeightRecipe(
                        "transpose", (b_name,), (("perm", "[1, 0]"),))} if first else {},
                ))
        return records
