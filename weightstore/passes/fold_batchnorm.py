"""fold-batchnorm: a Conv followed by an inference BatchNormalization becomes one Conv.

At inference BatchNormalization is a per-channel affine map, so it folds into the Conv's
weight and bias: W' = W * s and B' = (B - mean) * s + beta, with s = scale / sqrt(var + eps).
Both are declared as recipes (``fold-batchnorm-weight``, ``fold-batchnorm-bias``); the new
Conv takes the Conv's position and the BatchNormalization's output name.

Matches a Conv whose only reader is the BatchNormalization (not a graph output, not
captured), whose weight, optional bias and the four BatchNormalization parameters are
weights of the graph (initializers or Constant nodes) with the weight's float type and one
value per output channel, and a BatchNormalization in inference mode with a single output.
Parameters no other node reads are removed in the same record (with their Constant nodes).
"""

from __future__ import annotations

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import GraphProto, ModelProto, NodeProto, TensorProto
from .analysis import (
    NameAllocator,
    Scope,
    attribute,
    is_standard,
    output_names,
    per_graph,
    readers,
    removable_weights,
    weight,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)


class FoldBatchNorm:
    """The ``fold-batchnorm`` pass."""

    name = "fold-batchnorm"

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        return per_graph(model, self._graph)

    def _graph(self, scope: Scope, counts: dict[str, int], values: NameAllocator,
               ) -> list[LocalRewriting]:
        g = scope.container
        reads = readers(g)
        outputs = set(output_names(g))
        records = []
        for c, conv in enumerate(g.node):
            if not is_standard(conv, "Conv") or len(conv.input) < 2 or len(conv.output) != 1:
                continue
            y = conv.output[0]
            users = reads.get(y, [])
            if y in outputs or len(users) != 1:
                continue
            b = users[0]
            bn = g.node[b]
            params = self._params(g, conv, bn, counts)
            if params is None or b < c:
                continue
            w, bias, scale, beta, mean, var = params
            eps = repr(float(attribute(bn, "epsilon", 1e-5)))  # type: ignore[arg-type]
            new_w = values.fresh(f"{w.name}.folded_bn")
            new_b = values.fresh(f"{w.name}.folded_bn_bias")
            folded = NodeProto()
            folded.CopyFrom(conv)
            del folded.input[:]
            folded.input.extend([conv.input[0], new_w, new_b])
            folded.output[0] = bn.output[0]
            sources = [w.name, *([bias.name] if bias is not None else []),
                       scale.name, beta.name, mean.name, var.name]
            inits, constants = removable_weights(g, sources, (c, b), reads)
            records.append(LocalRewriting(
                operation_name=self.name,
                graph_path=scope.path,
                removed_nodes=(c, b, *constants),
                added_nodes=(folded,),
                insert_at=c,
                added_initializers=(without_payload(w, new_w),
                                    without_payload(scale, new_b, w.data_type)),
                removed_initializers=inits,
                derivations={
                    new_w: DerivedWeightRecipe("fold-batchnorm-weight",
                                               (w.name, scale.name, var.name),
                                               (("epsilon", eps),)),
                    new_b: DerivedWeightRecipe("fold-batchnorm-bias", tuple(sources[1:]),
                                               (("epsilon", eps),)),
                },
            ))
        return records

    @staticmethod
    def _params(g: GraphProto, conv: NodeProto, bn: NodeProto,
                counts: dict[str, int]) -> tuple | None:
        """(W, conv bias or None, scale, beta, mean, var) when the pair folds, else None."""
        if (not is_standard(bn, "BatchNormalization") or len(bn.input) != 5
                or bn.input[0] != conv.output[0] or any(bn.output[1:])
                or attribute(bn, "training_mode", 0) != 0 or attribute(bn, "spatial", 1) != 1):
            return None
        names = [conv.input[1], conv.input[2] if len(conv.input) > 2 else "", *bn.input[1:]]
        tensors = [weight(g, n) if n else None for n in names]
        w, bias, *bn_params = tensors
        if w is None or any(t is None for t in bn_params) or (names[1] and bias is None):
            return None
        if w.data_type not in FLOAT_TYPES or len(w.dims) < 3:
            return None
        channels = w.dims[0]
        for t in [bias, *bn_params]:
            if t is not None and (t.data_type != w.data_type or list(t.dims) != [channels]):
                return None
        if any(counts.get(t.name, 0) != 1 for t in tensors if t is not None):
            return None
        return (w, bias, *bn_params)
