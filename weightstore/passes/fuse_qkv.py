"""fuse-qkv: MatMuls sharing their input become one MatMul over a concatenated weight.

Attention projects one hidden state three times (query, key, value); one wider MatMul
reads the input once and gives kernels a bigger GEMM. The fused weight is declared with a
``concat`` recipe (axis 1) over the original weights, so no weight is read to decide. A
``Split`` on the last axis gives back the original output names, so no consumer changes.

A group is every MatMul of a graph (2 or more) reading the same first input whose second
input is a 2-D floating-point initializer of that graph with the same dtype and first dim.
An original weight that nothing else reads is removed in the same record; one still read
elsewhere stays for the other readers. Runs in every graph, subgraphs included; functions
hold no initializers and so never match.
"""

from __future__ import annotations

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import ModelProto, TensorProto, make_node
from .analysis import (
    NameAllocator,
    Scope,
    int64_initializer,
    is_standard,
    iter_scopes,
    model_names,
    node_names,
    opset_version,
    readers,
    removable_weights,
    tensor_name_counts,
    weight,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


class FuseQKV:
    """The ``fuse-qkv`` pass."""

    name = "fuse-qkv"

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        values = NameAllocator(model_names(model))
        nodes = NameAllocator(node_names(model))
        counts = tensor_name_counts(model)
        opset = opset_version(model)
        records = []
        for scope in iter_scopes(model, functions=False):
            records += self._graph(scope, counts, opset, values, nodes)
        return records

    def _graph(self, scope: Scope, counts: dict[str, int], opset: int, values: NameAllocator,
               nodes: NameAllocator) -> list[LocalRewriting]:
        g = scope.container
        groups: dict[tuple[str, int, int], list[int]] = {}
        for i, node in enumerate(g.node):
            if not is_standard(node, "MatMul") or len(node.input) != 2 or not node.input[0]:
                continue
            w = weight(g, node.input[1])
            if (w is None or w.data_type not in FLOAT_TYPES or len(w.dims) != 2
                    or counts.get(w.name, 0) != 1 or not node.output[0]):
                continue
            groups.setdefault((node.input[0], w.data_type, w.dims[0]), []).append(i)
        reads = readers(g)
        records = []
        for (_, data_type, rows), members in groups.items():
            if len(members) < 2:
                continue
            matmuls = [g.node[i] for i in members]
            weights = [weight(g, m.input[1]) for m in matmuls]
            sizes = [int(w.dims[1]) for w in weights if w is not None]
            first = matmuls[0]
            fused = values.fresh(f"{first.input[1]}.fused_qkv")
            fused_out = values.fresh(f"{first.output[0]}.fused_qkv")
            base = first.name or first.output[0]
            added_inits = [without_payload(TensorProto(), fused, data_type, [rows, sum(sizes)])]
            split_inputs = [fused_out]
            split_attrs: dict[str, object] = {"axis": -1}
            if opset >= 13:
                split_name = values.fresh(f"{fused}.split")
                added_inits.append(int64_initializer(split_name, sizes))
                split_inputs.append(split_name)
            else:
                split_attrs["split"] = sizes
            matmul = make_node("MatMul", [first.input[0], fused], [fused_out],
                                      name=nodes.fresh(f"{base}.fused_qkv"))
            split = make_node("Split", split_inputs, [m.output[0] for m in matmuls],
                                     name=nodes.fresh(f"{base}.fused_qkv_split"),
                                     **split_attrs)
            sources = tuple(m.input[1] for m in matmuls)
            inits, constants = removable_weights(g, sources, members, reads)
            records.append(LocalRewriting(
                operation_name=self.name,
                graph_path=scope.path,
                removed_nodes=(*members, *constants),
                added_nodes=(matmul, split),
                insert_at=members[0],
                added_initializers=tuple(added_inits),
                removed_initializers=inits,
                derivations={fused: DerivedWeightRecipe("concat", sources, (("axis", "1"),))},
            ))
        return records
