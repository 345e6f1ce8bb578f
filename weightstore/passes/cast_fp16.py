"""cast-fp16: store large float32 weights as float16, cast back to float32 when read.

Halves the bytes a package stores and loads for a device that computes in float32 anyway
(or fuses the Cast into its kernel). The float16 copy is declared with a ``cast`` recipe;
a ``Cast(to=FLOAT)`` node outputs the original name, so every reader is unchanged and no
value is renamed. The float32 initializer goes in the same record.

Which weights: float32 initializers and Constant-node tensors of at least 2 dims or at least
``min_elements`` elements (its parameter, 1024 by default: matrices, embeddings, conv
kernels are the bytes that matter; biases and norm scales stay exact), that are not graph
inputs or outputs, and read only where a value is numeric data (:data:`DATA_INPUTS`),
never as a threshold, an index or a shape. Runs in every graph; functions hold no
initializers.

Reads from subgraphs count like the graph's own: torch's dynamo exporter puts every weight
of a model with data-dependent control flow in the main graph, read from the branches of
an ``If`` (silero-vad's op 18 export reads all 30 of its weights that way). Such a weight
is cast when every read of it, in every subgraph that captures it at any depth, is a
numeric-data read; the ``Cast`` goes in the weight's own graph, before the first node
that reads or captures it, and the subgraphs read its output under the original name.
A subgraph that passes the weight through as one of its outputs keeps it float32.
"""

from __future__ import annotations

import math

from ..catalogue.descriptors import DerivedWeightRecipe
from ..io.onnx_proto import GraphProto, ModelProto, NodeProto, TensorProto, make_node
from ..recipe.pass_params import CastFP16Params
from .analysis import (
    STANDARD_DOMAINS,
    NameAllocator,
    Scope,
    defined_names,
    graph_weights,
    input_names,
    node_subgraphs,
    output_names,
    per_graph,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting

# op -> input positions that read numeric data (None: every input)
DATA_INPUTS: dict[str, tuple[int, ...] | None] = {
    "MatMul": None, "Gemm": None, "Conv": (1, 2), "ConvTranspose": (1, 2),
    "Add": None, "Sub": None, "Mul": None, "Div": None, "Concat": None, "Einsum": None,
    "Gather": (0,), "GatherElements": (0,), "GatherND": (0,),
    "LayerNormalization": (1, 2), "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2), "PRelu": (1,),
    "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3),
    "Transpose": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
    "Identity": (0,),
}


class CastFP16:
    """The ``cast-fp16`` pass."""

    name = "cast-fp16"
    Params = CastFP16Params

    def __init__(self, params: CastFP16Params | None = None) -> None:
        self.params = params or CastFP16Params()

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        return per_graph(model, self._graph, nodes=True)

    def _graph(self, scope: Scope, counts: dict[str, int], values: NameAllocator,
               nodes: NameAllocator) -> list[LocalRewriting]:
        g = scope.container
        data_readers: dict[str, list[int]] = {}
        # graph inputs and outputs, names read as non-data here or in a subgraph
        keep = set(input_names(g)) | set(output_names(g))
        for i, node in enumerate(g.node):
            reads = [(name, _reads_data(node, j)) for j, name in enumerate(node.input)]
            for _, sub in node_subgraphs(node):
                data, other = _captured_reads(sub)
                reads += [(name, True) for name in data] + [(name, False) for name in other]
            for name, numeric in reads:
                if name and numeric:
                    data_readers.setdefault(name, []).append(i)
                elif name:
                    keep.add(name)
        records = []
        for name, t, constant in graph_weights(g):
            users = data_readers.get(name, [])
            if (t.data_type != TensorProto.FLOAT or name in keep or not users
                    or counts.get(name, 0) != 1
                    or (len(t.dims) < 2 and math.prod(t.dims) < self.params.min_elements)):
                continue
            half = values.fresh(f"{name}.fp16")
            cast = make_node("Cast", [half], [name], to=TensorProto.FLOAT,
                                    name=nodes.fresh(f"{name}.cast_fp32"))
            records.append(LocalRewriting(
                operation_name=self.name,
                graph_path=scope.path,
                removed_nodes=() if constant is None else (constant,),
                added_nodes=(cast,),
                insert_at=min(users),
                added_initializers=(without_payload(t, half, TensorProto.FLOAT16),),
                removed_initializers=() if constant is not None else (name,),
                derivations={half: DerivedWeightRecipe(
                    "cast", (name,), (("to", str(TensorProto.FLOAT16)),))},
            ))
        return records


def _captured_reads(g: GraphProto) -> tuple[set[str], set[str]]:
    """The names subgraph ``g`` reads from enclosing graphs, its nested subgraphs
    included: (those read only as numeric data, every other)."""
    data: set[str] = set()
    other = set(output_names(g))  # passed through: not a read this pass can follow
    for node in g.node:
        for j, name in enumerate(node.input):
            if name:
                (data if _reads_data(node, j) else other).add(name)
        for _, sub in node_subgraphs(node):
            inner_data, inner_other = _captured_reads(sub)
            data |= inner_data
            other |= inner_other
    own = defined_names(g)
    return data - other - own, other - own


def _reads_data(node: NodeProto, position: int) -> bool:
    if node.domain not in STANDARD_DOMAINS or node.op_type not in DATA_INPUTS:
        return False
    allowed = DATA_INPUTS[node.op_type]
    return allowed is None or position in allowed
