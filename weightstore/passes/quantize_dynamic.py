"""quantize-dynamic: MatMul weights in int8, as onnxruntime's ``quantize_dynamic`` writes them.

The graph is the one ``onnxruntime.quantization.quantize_dynamic`` gives a MatMul with
its defaults (per tensor, ``weight_type`` int8 or uint8, the activation in uint8): a
``DynamicQuantizeLinear`` per activation (``<x>_QuantizeLinear``, shared by every MatMul
reading ``<x>``), then per MatMul ``MatMulInteger`` (``<node>_quant``), ``Cast`` to the
weight's float type, ``Mul`` of the two scales (``<node>_quant_scales_mul``; two unnamed
MatMuls of one activation and one weight share it) and ``Mul`` of the product into the
MatMul's own output name, so no reader changes. The names are onnxruntime's (a name the
model already uses gets a ``.<k>`` suffix). The quantized weight, its scale and zero point
(``<w>_quantized``, ``<w>_scale``, ``<w>_zero_point``, once per weight) are declared with
``dynamic-int8-*`` recipes that onnxruntime's own functions compute. The float weight goes
with its last MatMul; a node reading it after its first MatMul (or a graph output) then
reads it through a ``DequantizeLinear`` (``<w>_DequantizeLinear``), as onnxruntime
rewires it. Read before its first MatMul or from a subgraph, it stays for every reader
(where onnxruntime would define it twice).

Which MatMuls: those ``quantize_dynamic`` picks in the main graph (it leaves subgraphs and
functions alone by default): a standard MatMul whose second input is a float32 or
float16 initializer (not a Constant node, not an overridable graph input) and whose first
input is computed (not an initializer). A weight whose name another graph of the model
also defines is left alone.

A Gemm is quantized too, as ``quantize_dynamic`` does even when asked for MatMul only (it
turns every Gemm of ``alpha`` 1, ``beta`` 1 and ``transA`` 0 into a MatMul, plus an Add of
its bias, before it quantizes): the same conditions on its inputs as a MatMul's, the
MatMul named ``<gemm>_MatMul`` and writing ``<y>_MatMul`` when an Add ``<gemm>_Add`` of
the bias follows. With ``transB`` 1 the weight quantized is the transposed one,
``<w>_Transposed`` (``_Transposed_<k>`` when a name is taken): its quantized tensor is
derived with ``transposed`` from ``<w>``, and ``<w>`` stays only while another node reads
it. Any other Gemm stays a Gemm, as in ``quantize_dynamic``'s graph, except one of
``alpha`` 1, ``beta`` 1 and ``transA`` 0 whose inputs do not qualify (a weight that is no
initializer, say), which ``quantize_dynamic`` still writes as a float MatMul (and Add).
The ops ``quantize_dynamic`` also quantizes by default stay in float: Gather
(embeddings), Conv, Attention, LSTM, EmbedLayerNormalization. So the graph is
``quantize_dynamic(..., op_types_to_quantize=["MatMul"])``'s, node for node (up to their
order) and payload for payload, but for such unquantized Gemms. Needs ai.onnx opset 11 or later
(``DynamicQuantizeLinear``).
"""

from __future__ import annotations

from ..catalogue.descriptors import DerivedWeightRecipe
from ..errors import ScenarioError
from ..io.onnx_proto import ModelProto, NodeProto, TensorProto, make_node
from ..recipe.pass_params import QuantizeDynamicParams
from .analysis import (
    NameAllocator,
    attribute,
    input_names,
    is_standard,
    model_names,
    node_names,
    opset_version,
    output_names,
    readers,
    tensor_name_counts,
    without_payload,
)
from .base import PassContext
from .rewriting import LocalRewriting

WEIGHT_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
MIN_OPSET = 11


class QuantizeDynamic:
    """The ``quantize-dynamic`` pass."""

    name = "quantize-dynamic"
    Params = QuantizeDynamicParams

    def __init__(self, params: QuantizeDynamicParams | None = None) -> None:
        self.params = params or QuantizeDynamicParams()

    def __call__(self, model: ModelProto, ctx: PassContext) -> list[LocalRewriting]:
        g = model.graph
        inits = {t.name: t for t in g.initializer}
        inputs = set(input_names(g))
        counts = tensor_name_counts(model)
        chosen = [i for i, node in enumerate(g.node)
                  if _quantizes(node, inits, inputs, counts)]
        if not chosen:
            return []
        if opset_version(model) < MIN_OPSET:
            raise ScenarioError("quantize-dynamic needs ai.onnx opset 11 or later "
                                "(DynamicQuantizeLinear)", opset=opset_version(model))
        return _Rewriter(model, self.params.weight_type, chosen).records()


def _is_gemm(node: NodeProto) -> bool:
    """A Gemm ``quantize_dynamic`` writes as MatMul (+ Add): alpha 1, beta 1, transA 0."""
    return (is_standard(node, "Gemm") and len(node.input) in (2, 3)
            and attribute(node, "alpha", 1.0) == 1.0 and attribute(node, "beta", 1.0) == 1.0
            and attribute(node, "transA", 0) == 0)


def _transposed(node: NodeProto) -> bool:
    return is_standard(node, "Gemm") and attribute(node, "transB", 0) == 1


def _quantizes(node: NodeProto, inits: dict[str, TensorProto], inputs: set[str],
               counts: dict[str, int]) -> bool:
    matmul = is_standard(node, "MatMul") and len(node.input) == 2
    if not (matmul or _is_gemm(node)) or not node.output[0]:
        return False
    a, w = node.input[:2]
    weight = inits.get(w)
    return (bool(a) and a not in inits and weight is not None and w not in inputs
            and weight.data_type in FLOAT_TYPES and counts.get(w, 0) == 1)


class _Rewriter:
    """One record per chosen MatMul, in graph order; what several MatMuls share (an
    activation's DynamicQuantizeLinear, a weight's quantized tensors, an unnamed pair's
    scale product) is added by the first and read by the others."""

    def __init__(self, model: ModelProto, weight_type: str, chosen: list[int]) -> None:
        self.g = model.graph
        self.weight_type = weight_type
        self.chosen = chosen
        self.values = NameAllocator(model_names(model))
        self.nodes = NameAllocator(node_names(model))
        self.inits = {t.name: t for t in self.g.initializer}
        self.activations: dict[str, tuple[str, str, str]] = {}  # x -> (q, scale, zero)
        self.weights: dict[str, tuple[str, str, str]] = {}  # w -> (q, scale, zero)
        self.transposed: dict[str, tuple[str, str, str]] = {}  # w -> (q, scale, zero)
        self.products: dict[str, str] = {}  # unnamed scale product's node name -> output
        reads = readers(self.g)
        outputs = set(output_names(self.g))
        taken = set(chosen)
        first: dict[str, int] = {}
        self.last_reader: dict[str, int] = {}  # w -> its last chosen MatMul
        for i in chosen:
            first.setdefault(self.g.node[i].input[1], i)
            self.last_reader[self.g.node[i].input[1]] = i
        # the float weight goes once its MatMuls are rewritten; a node reading it after
        # the first of them (or a graph output) reads it dequantized, as onnxruntime
        # rewires it; read before or by a subgraph, it stays (and so for every reader)
        self.removable: set[str] = set()
        self.dequantized: dict[str, int | None] = {}  # w -> the first later reader
        for w, start in first.items():
            others = [p for p in reads.get(w, ()) if p not in taken]
            if any(p < start or w not in self.g.node[p].input for p in others):
                continue
            transposed = any(_transposed(self.g.node[i]) for i in chosen
                             if self.g.node[i].input[1] == w)
            if transposed and (others or w in outputs):
                continue  # the transposed copy is quantized; the others read ``w``
            self.removable.add(w)
            if others or w in outputs:
                self.dequantized[w] = min(others, default=None)

    def records(self) -> list[LocalRewriting]:
        out = [self._record(i) for i in self.chosen]
        for w, before in self.dequantized.items():
            dequantize = make_node("DequantizeLinear", list(self.weights[w]), [w],
                                          self._name(f"{w}_DequantizeLinear"))
            out.append(LocalRewriting(operation_name=QuantizeDynamic.name,
                                      added_nodes=(dequantize,), insert_at=before,
                                      removed_initializers=(w,)))
        return out

    def _name(self, wanted: str) -> str:
        return self.nodes.fresh(wanted) if wanted else ""

    def _transposed_names(self, w: str) -> tuple[str, str, str]:
        """``<w>_Transposed``'s quantized, scale and zero point names, onnxruntime's."""
        suffixes = ("", "_quantized", "_scale", "_zero_point")
        name, k = f"{w}_Transposed", 0
        while any(name + s in self.values.taken for s in suffixes):
            k += 1
            name = f"{w}_Transposed_{k}"
        return tuple(self.values.fresh(name + s) for s in suffixes[1:])

    def _record(self, position: int) -> LocalRewriting:
        node = self.g.node[position]
        a, w = node.input[:2]
        added: list[NodeProto] = []
        gemm = is_standard(node, "Gemm")
        name = f"{node.name}_MatMul" if gemm and node.name else node.name
        bias = node.input[2:] and node.input[2]
        y = self.values.fresh(f"{node.output[0]}_MatMul") if bias else node.output[0]
        tensors: list[TensorProto] = []
        derivations: dict[str, DerivedWeightRecipe] = {}
        if a not in self.activations:
            self.activations[a] = (self.values.fresh(f"{a}_quantized"),
                                   self.values.fresh(f"{a}_scale"),
                                   self.values.fresh(f"{a}_zero_point"))
            added.append(make_node("DynamicQuantizeLinear", [a],
                                          list(self.activations[a]),
                                          self._name(f"{a}_QuantizeLinear")))
        transposed = _transposed(node)
        weights = self.transposed if transposed else self.weights
        if w not in weights:
            weights[w] = names = self._transposed_names(w) if transposed else (
                self.values.fresh(f"{w}_quantized"), self.values.fresh(f"{w}_scale"),
                self.values.fresh(f"{w}_zero_point"))
            tensors, derivations = self._declare(self.inits[w], names, transposed)
        qa, sa, za = self.activations[a]
        qw, sw, zw = weights[w]
        base = f"{name}_quant" if name else ""
        integer = self._name(base)
        product_out = self.values.fresh(f"{y}_output_quantized")
        added.append(make_node("MatMulInteger", [qa, qw, za, zw], [product_out],
                                      integer))
        cast_out = self.values.fresh(f"{product_out}_cast_output")
        added.append(make_node("Cast", [product_out], [cast_out],
                                      self._name(f"{product_out}_cast"),
                                      to=self.inits[w].data_type))
        scales = f"{base}_scales_mul" if base else f"{sa}_{sw}_mul"
        if base or scales not in self.products:
            scales_name = self._name(scales)
            self.products[scales] = self.values.fresh(f"{scales_name}:0")
            added.append(make_node("Mul", [sa, sw], [self.products[scales]],
                                          scales_name))
        added.append(make_node("Mul", [cast_out, self.products[scales]], [y],
                                      self._name(f"{base}_output_scale_mul" if base else "")))
        if bias:
            added.append(make_node("Add", [y, bias], [node.output[0]],
                                          self._name(f"{node.name}_Add" if node.name else "")))
        drop = (w in self.removable and w not in self.dequantized
                and self.last_reader[w] == position)
        return LocalRewriting(
            operation_name=QuantizeDynamic.name,
            removed_nodes=(position,),
            added_nodes=tuple(added),
            added_initializers=tuple(tensors),
            removed_initializers=(w,) if drop else (),
            derivations=derivations,
        )

    def _declare(self, weight: TensorProto, names: tuple[str, str, str],
                 transposed: bool = False,
                 ) -> tuple[list[TensorProto], dict[str, DerivedWeightRecipe]]:
        qtype = WEIGHT_TYPES[self.weight_type]
        q, scale, zero = names
        dims = list(reversed(weight.dims)) if transposed else None
        tensors = [without_payload(weight, q, qtype, dims=dims),
                   without_payload(weight, scale, dims=()),
                   without_payload(weight, zero, qtype, dims=())]
        attributes = (("weight_type", self.weight_type),)
        if transposed:
            attributes = (("transposed", "true"), *attributes)
        operations = ("dynamic-int8-weight", "dynamic-int8-scale", "dynamic-int8-zero-point")
        return tensors, {name: DerivedWeightRecipe(op, (weight.name,), attributes)
                         for name, op in zip(names, operations, strict=True)}
