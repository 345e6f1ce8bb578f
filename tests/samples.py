"""Small but realistic ONNX models for the example, the tests and the benchmarks.

Everything here is deterministic: every weight is drawn from a numpy ``Generator`` seeded by
the caller's seed and the tensor's name, so the same arguments always give byte-identical
``SerializeToString()`` output.

The encoder deliberately covers the places where weights hide in real exports:

* graph initializers stored as ``raw_data``;
* ``Constant`` nodes in the main graph, some with typed fields (``float_data`` /
  ``int64_data``) and some that are shape-like inputs (Slice starts/ends, Reshape shapes);
* a model-local function (GELU) whose body holds a ``Constant`` vector with ``float_data``;
* an ``If`` whose branches hold ``Constant`` weights and subgraph initializers, with a second
  ``If`` nested inside the then-branch (nesting depth 2).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "FUNCTION_DOMAIN",
    "IR_VERSION",
    "OPSET",
    "make_encoder",
    "make_large_model",
    "make_shared_pair",
    "run_onnxruntime",
    "sample_inputs",
]

OPSET = 17
IR_VERSION = 8
FUNCTION_DOMAIN = "local.fn"
PRODUCER = "weightstore.samples"
WEIGHT_STD = 0.02

SeedFor = Callable[[str], int]


def _rng(seed: int, name: str) -> np.random.Generator:
    """A generator keyed by ``seed`` and a stable digest of ``name``."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


class _Builder:
    """Collects nodes, initializers and values for one graph, drawing weights by name."""

    def __init__(self, seed_for: SeedFor, prefix: str = "") -> None:
        self.seed_for = seed_for
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0

    def normal(self, name: str, shape: Sequence[int], scale: float = WEIGHT_STD) -> np.ndarray:
        """Random normal float32 array of ``shape`` times ``scale``."""
        arr = _rng(self.seed_for(name), name).standard_normal(tuple(shape), dtype=np.float32)
        arr *= np.float32(scale)
        return arr

    def init(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` as a raw_data initializer; returns its name."""
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, shape: Sequence[int]) -> str:
        """A random normal initializer."""
        return self.init(name, self.normal(name, shape))

    def layer_norm_params(self, name: str, hidden: int) -> tuple[str, str]:
        """Gamma (around 1) and beta (around 0) initializers for a LayerNormalization."""
        gamma = self.normal(f"{name}.weight", [hidden]) + np.float32(1.0)
        beta = self.normal(f"{name}.bias", [hidden])
        return self.init(f"{name}.weight", gamma), self.init(f"{name}.bias", beta)

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        outputs: Sequence[str] | None = None,
        *,
        domain: str = "",
        **attrs: Any,
    ) -> str:
        """Append a node with a unique name; returns its first output."""
        self._count += 1
        name = f"{self.prefix}{op}_{self._count}"
        outs = list(outputs) if outputs is not None else [f"{name}_out"]
        self.nodes.append(
            helper.make_node(op, list(inputs), outs, name=name, domain=domain, **attrs)
        )
        return outs[0]

    def const(self, output: str, tensor: TensorProto) -> str:
        """A Constant node producing ``output`` from ``tensor``."""
        tensor.name = output
        return self.node("Constant", [], [output], value=tensor)

    def const_array(self, output: str, array: np.ndarray) -> str:
        """A Constant node with a raw_data tensor."""
        return self.const(output, numpy_helper.from_array(array, output))

    def const_typed(self, output: str, array: np.ndarray) -> str:
        """A Constant node whose tensor uses typed fields (float_data, int64_data, ...)."""
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor = helper.make_tensor(output, dtype, list(array.shape), array.ravel().tolist())
        return self.const(output, tensor)

    def int64s(self, output: str, values: Sequence[int] | int) -> str:
        """A shape-like int64 Constant (a scalar when ``values`` is an int)."""
        return self.const_array(output, np.array(values, dtype=np.int64))


def _gelu_function(ffn: int) -> onnx.FunctionProto:
    """GELU, 0.5 * x * (1 + erf(x / sqrt(2))), times a per-channel scale of ones.

    The scale is a float_data Constant of ``ffn`` floats so that the function body carries an
    externalizable tensor; multiplying by 1.0 keeps the output exactly GELU.
    """
    b = _Builder(lambda _name: 0, prefix="gelu_")
    sqrt2 = b.const_array("sqrt2", np.array(math.sqrt(2.0), dtype=np.float32))
    one = b.const_array("one", np.array(1.0, dtype=np.float32))
    half = b.const_array("half", np.array(0.5, dtype=np.float32))
    scale = b.const_typed("channel_scale", np.ones([ffn], dtype=np.float32))
    scaled = b.node("Div", ["X", sqrt2], ["x_div"])
    erf = b.node("Erf", [scaled], ["erf"])
    shifted = b.node("Add", [erf, one], ["erf_plus_one"])
    prod = b.node("Mul", ["X", shifted], ["x_mul"])
    gelu = b.node("Mul", [prod, half], ["gelu"])
    b.node("Mul", [gelu, scale], ["Y"])
    return helper.make_function(
        FUNCTION_DOMAIN,
        "Gelu",
        ["X"],
        ["Y"],
        b.nodes,
        [helper.make_opsetid("", OPSET)],
        doc_string="GELU (erf form) with a per-channel scale of ones.",
    )


def _attention(
    b: _Builder, x: str, p: str, *, hidden: int, heads: int, shapes: tuple[str, str]
) -> str:
    """Self-attention block with its output projection, residual and LayerNormalization."""
    head_dim = hidden // heads
    heads_shape, merge_shape = shapes
    projected: dict[str, str] = {}
    for part in ("query", "key", "value"):
        w = b.weight(f"{p}.attention.self.{part}.weight", [hidden, hidden])
        bias = b.weight(f"{p}.attention.self.{part}.bias", [hidden])
        mm = b.node("MatMul", [x, w])
        lin = b.node("Add", [mm, bias])
        projected[part] = b.node("Reshape", [lin, heads_shape])
    q = b.node("Transpose", [projected["query"]], perm=[0, 2, 1, 3])
    k = b.node("Transpose", [projected["key"]], perm=[0, 2, 3, 1])
    v = b.node("Transpose", [projected["value"]], perm=[0, 2, 1, 3])
    scores = b.node("MatMul", [q, k])
    scale = b.const_array(f"{p}.attention.scale", np.array(math.sqrt(head_dim), dtype=np.float32))
    scaled = b.node("Div", [scores, scale])
    probs = b.node("Softmax", [scaled], axis=-1)
    ctx = b.node("MatMul", [probs, v])
    ctx = b.node("Transpose", [ctx], perm=[0, 2, 1, 3])
    merged = b.node("Reshape", [ctx, merge_shape])
    w_o = b.weight(f"{p}.attention.output.dense.weight", [hidden, hidden])
    b_o = b.weight(f"{p}.attention.output.dense.bias", [hidden])
    out = b.node("Add", [b.node("MatMul", [merged, w_o]), b_o])
    res = b.node("Add", [out, x])
    gamma, beta = b.layer_norm_params(f"{p}.attention.output.LayerNorm", hidden)
    return b.node("LayerNormalization", [res, gamma, beta], axis=-1, epsilon=1e-12)


def _feed_forward(b: _Builder, x: str, p: str, *, hidden: int, ffn: int) -> str:
    """FFN block: MatMul, GELU (local function), MatMul, residual, LayerNormalization.

    The intermediate bias is a Constant node with ``float_data``.
    """
    w1 = b.weight(f"{p}.intermediate.dense.weight", [hidden, ffn])
    b1_name = f"{p}.intermediate.dense.bias"
    b1 = b.const_typed(b1_name, b.normal(b1_name, [ffn]))
    inter = b.node("Add", [b.node("MatMul", [x, w1]), b1])
    act = b.node("Gelu", [inter], domain=FUNCTION_DOMAIN)
    w2 = b.weight(f"{p}.output.dense.weight", [ffn, hidden])
    b2 = b.weight(f"{p}.output.dense.bias", [hidden])
    out = b.node("Add", [b.node("MatMul", [act, w2]), b2])
    res = b.node("Add", [out, x])
    gamma, beta = b.layer_norm_params(f"{p}.output.LayerNorm", hidden)
    return b.node("LayerNormalization", [res, gamma, beta], axis=-1, epsilon=1e-12)


def _pooler(b: _Builder, hidden_states: str, seq_len: str, *, hidden: int) -> str:
    """The ``If`` on ``use_pooler`` producing ``pooled`` [batch, hidden].

    then: tanh(first_token @ W + b); W comes from a nested ``If`` (on seq > 1) whose branches
          hold a Constant weight and a subgraph initializer; b is a then-branch initializer.
    else: mean over seq @ W_mean, with W_mean a float_data Constant.
    """
    seed_for = b.seed_for
    out_type = ["batch", hidden]

    # Depth 2: project the first token.
    inner_then = _Builder(seed_for, prefix="pooler_dense_")
    w = inner_then.const_array(
        "pooler.dense.weight", inner_then.normal("pooler.dense.weight", [hidden, hidden])
    )
    inner_then.node("MatMul", ["pooler.first", w], ["pooler.projected_then"])
    inner_else = _Builder(seed_for, prefix="pooler_single_")
    w1 = inner_else.weight("pooler.single.weight", [hidden, hidden])
    inner_else.node("MatMul", ["pooler.first", w1], ["pooler.projected_else"])

    # Depth 1, then-branch.
    then = _Builder(seed_for, prefix="pooler_then_")
    idx = then.int64s("pooler.first_index", 0)
    then.node("Gather", [hidden_states, idx], ["pooler.first"], axis=1)
    min_seq = then.int64s("pooler.min_seq", 1)
    multi = then.node("Greater", [seq_len, min_seq], ["pooler.multi_token"])
    projected = then.node(
        "If",
        [multi],
        ["pooler.projected"],
        then_branch=_graph(inner_then, "pooler_dense", [], [("pooler.projected_then", out_type)]),
        else_branch=_graph(inner_else, "pooler_single", [], [("pooler.projected_else", out_type)]),
    )
    bias = then.weight("pooler.dense.bias", [hidden])
    pre = then.node("Add", [projected, bias])
    then.node("Tanh", [pre], ["pooled_then"])

    # Depth 1, else-branch.
    other = _Builder(seed_for, prefix="pooler_else_")
    mean = other.node("ReduceMean", [hidden_states], axes=[1], keepdims=0)
    w_mean = other.const_typed(
        "pooler.mean.weight", other.normal("pooler.mean.weight", [hidden, hidden])
    )
    other.node("MatMul", [mean, w_mean], ["pooled_else"])

    return b.node(
        "If",
        ["use_pooler"],
        ["pooled"],
        then_branch=_graph(then, "pooler_then", [], [("pooled_then", out_type)]),
        else_branch=_graph(other, "pooler_else", [], [("pooled_else", out_type)]),
    )


def _graph(
    b: _Builder,
    name: str,
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[tuple[str, Sequence[int | str]]],
    elem_type: int = TensorProto.FLOAT,
) -> onnx.GraphProto:
    """Wrap a builder's nodes into a graph whose outputs are float tensors."""
    outs = [helper.make_tensor_value_info(n, elem_type, list(shape)) for n, shape in outputs]
    return helper.make_graph(b.nodes, name, list(inputs), outs, initializer=b.initializers)


def _build_encoder(
    *,
    vocab: int,
    hidden: int,
    heads: int,
    layers: int,
    ffn: int,
    max_seq: int,
    seed_for: SeedFor,
    name: str,
) -> onnx.ModelProto:
    """The encoder, with each tensor's seed chosen by ``seed_for(tensor_name)``."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    for label, value in (("vocab", vocab), ("layers", layers), ("ffn", ffn), ("max_seq", max_seq)):
        if value < 1:
            raise ValueError(f"{label} must be positive, got {value}")
    b = _Builder(seed_for)

    # Sequence length from the input shape, through shape-like Constants.
    shape = b.node("Shape", ["input_ids"], ["input_shape"])
    seq_1d = b.node(
        "Slice",
        [
            shape,
            b.int64s("seq_dim.starts", [1]),
            b.int64s("seq_dim.ends", [2]),
            b.int64s("seq_dim.axes", [0]),
        ],
        ["seq_len_1d"],
    )
    seq_len = b.node("Squeeze", [seq_1d, b.int64s("seq_len.squeeze_axes", [0])], ["seq_len"])

    # Embeddings: word + position (Range) + token type (int64_data Constant, Slice, Gather).
    word_table = b.weight("embeddings.word_embeddings.weight", [vocab, hidden])
    words = b.node("Gather", [word_table, "input_ids"], axis=0)
    positions = b.node(
        "Range", [b.int64s("positions.start", 0), seq_len, b.int64s("positions.delta", 1)]
    )
    pos_table = b.weight("embeddings.position_embeddings.weight", [max_seq, hidden])
    pos = b.node("Gather", [pos_table, positions], axis=0)
    segment = (np.arange(max_seq) >= max_seq // 2).astype(np.int64)
    token_types = b.const_typed("embeddings.token_type_ids", segment)
    types = b.node(
        "Slice",
        [
            token_types,
            b.int64s("token_types.starts", [0]),
            seq_1d,
            b.int64s("token_types.axes", [0]),
        ],
    )
    type_table = b.weight("embeddings.token_type_embeddings.weight", [2, hidden])
    typ = b.node("Gather", [type_table, types], axis=0)
    emb = b.node("Add", [b.node("Add", [words, pos]), typ])
    gamma, beta = b.layer_norm_params("embeddings.LayerNorm", hidden)
    x = b.node("LayerNormalization", [emb, gamma, beta], axis=-1, epsilon=1e-12)

    for i in range(layers):
        p = f"encoder.layer.{i}"
        shapes = (
            b.int64s(f"{p}.attention.heads_shape", [0, 0, heads, hidden // heads]),
            b.int64s(f"{p}.attention.merge_shape", [0, 0, hidden]),
        )
        x = _attention(b, x, p, hidden=hidden, heads=heads, shapes=shapes)
        x = _feed_forward(b, x, p, hidden=hidden, ffn=ffn)
    b.node("Identity", [x], ["hidden_states"])
    _pooler(b, "hidden_states", seq_len, hidden=hidden)

    graph = helper.make_graph(
        b.nodes,
        name,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("use_pooler", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info(
                "hidden_states", TensorProto.FLOAT, ["batch", "seq", hidden]
            ),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", hidden]),
        ],
        initializer=b.initializers,
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(FUNCTION_DOMAIN, 1)],
        functions=[_gelu_function(ffn)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
        doc_string=f"{name}: BERT-like encoder sample (vocab={vocab}, hidden={hidden}, "
        f"heads={heads}, layers={layers}, ffn={ffn}, max_seq={max_seq}).",
    )


def make_encoder(
    *,
    vocab: int = 1000,
    hidden: int = 64,
    heads: int = 4,
    layers: int = 2,
    ffn: int = 256,
    max_seq: int = 32,
    seed: int = 0,
    name: str = "tiny-bert",
    retrained: Sequence[str] = (),
) -> onnx.ModelProto:
    """A BERT-like encoder: inputs ``input_ids`` [batch, seq] and ``use_pooler`` (bool scalar);
    outputs ``hidden_states`` [batch, seq, hidden] and ``pooled`` [batch, hidden].

    Tensors whose names start with a ``retrained`` prefix are drawn with ``seed + 1``: the
    result shares every other weight, byte for byte, with the encoder of ``seed`` (a
    fine-tuned sibling)."""
    prefixes = tuple(retrained)
    return _build_encoder(
        vocab=vocab,
        hidden=hidden,
        heads=heads,
        layers=layers,
        ffn=ffn,
        max_seq=max_seq,
        seed_for=lambda n: seed + 1 if prefixes and n.startswith(prefixes) else seed,
        name=name,
    )


SHARED_PREFIXES = ("embeddings.", "encoder.layer.0.")


def make_shared_pair(seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Two encoders with byte-identical embeddings and first layer, different elsewhere."""
    first = make_encoder(seed=seed, name="tiny-bert-a")

    def seed_for(tensor: str) -> int:
        return seed if tensor.startswith(SHARED_PREFIXES) else seed + 1

    second = _build_encoder(
        vocab=1000,
        hidden=64,
        heads=4,
        layers=2,
        ffn=256,
        max_seq=32,
        seed_for=seed_for,
        name="tiny-bert-b",
    )
    return first, second


def _large_chain(total_bytes: int, seed: int, tensor_bytes: int,
                 ) -> tuple[onnx.ModelProto, list[Callable[[], np.ndarray]]]:
    """The chain model with empty tables, and one generator of each table's values."""
    if total_bytes < 4:
        raise ValueError(f"total_bytes must be at least 4, got {total_bytes}")
    if tensor_bytes < 4:
        raise ValueError(f"tensor_bytes must be at least 4, got {tensor_bytes}")
    width = max(1, min(1024, total_bytes // 4, tensor_bytes // 4))
    row_bytes = 4 * width
    rows_per_tensor = tensor_bytes // row_bytes
    total_rows = max(1, round(total_bytes / row_bytes))
    b = _Builder(lambda _name: seed, prefix="chain_")
    makers: list[Callable[[], np.ndarray]] = []
    x = "x"
    index = 0
    while total_rows > 0:
        rows = min(rows_per_tensor, total_rows)
        total_rows -= rows
        name = f"chain.{index}.weight"

        def table(name: str = name, rows: int = rows) -> np.ndarray:
            values = _rng(seed, name).standard_normal((rows, width), dtype=np.float32)
            values *= np.float32(WEIGHT_STD)
            return values

        makers.append(table)
        b.initializers.append(TensorProto(name=name, data_type=TensorProto.FLOAT,
                                          dims=[rows, width]))
        proj = b.node("Gemm", [x, name], transB=1)
        mean = b.node("ReduceMean", [proj], axes=[1], keepdims=1)
        x = b.node("Tanh", [b.node("Add", [x, mean])])
        index += 1
    b.node("Identity", [x], ["y"])
    graph = helper.make_graph(
        b.nodes,
        "large-chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        initializer=b.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
    )
    return model, makers


def make_large_model(
    total_bytes: int, *, seed: int = 0, tensor_bytes: int = 16 << 20
) -> onnx.ModelProto:
    """A valid chain whose raw_data initializers add up to about ``total_bytes``.

    Input ``x`` float [1, width]; each table T [rows, width] contributes
    ``x = tanh(x + mean(Gemm(x, T, transB=1)))``; output ``y`` [1, width]. Every table is at
    most ``tensor_bytes`` and the total is exact to within one row (4 * width bytes).
    """
    model, makers = _large_chain(total_bytes, seed, tensor_bytes)
    for tensor, make in zip(model.graph.initializer, makers, strict=True):
        tensor.raw_data = make().tobytes()
    return model


def _tag(number: int, wire_type: int = 2) -> bytes:
    return _varint((number << 3) | wire_type)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write_large_single_file(path: str | Path, total_bytes: int, *, seed: int = 0,
                            tensor_bytes: int = 64 << 20) -> Path:
    """Write :func:`make_large_model`'s chain as ONE file with inline weights, any size.

    protobuf cannot serialize a message over 2 GiB, so the file is composed at the wire
    level: the model without its tables is serialized by protobuf, then the graph field is
    written with its true length and the tables are streamed in as ``initializer`` fields
    holding ``raw_data``. Memory stays at one table.
    """
    model, makers = _large_chain(total_bytes, seed, tensor_bytes)
    headers = [t.SerializeToString() for t in model.graph.initializer]
    sizes = [t.dims[0] * t.dims[1] * 4 for t in model.graph.initializer]
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    del graph.initializer[:]
    graph_bytes = graph.SerializeToString()
    model.ClearField("graph")
    tensor_lengths = [len(h) + len(_tag(9)) + len(_varint(n)) + n
                      for h, n in zip(headers, sizes, strict=True)]
    graph_length = len(graph_bytes) + sum(len(_tag(5)) + len(_varint(n)) + n
                                          for n in tensor_lengths)
    path = Path(path)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
        f.write(_tag(7) + _varint(graph_length) + graph_bytes)
        for header, n, length, make in zip(headers, sizes, tensor_lengths, makers,
                                           strict=True):
            f.write(_tag(5) + _varint(length) + header + _tag(9) + _varint(n))
            data = make()
            f.write(memoryview(data).cast("B"))
            del data
    return path


def _gather_table_rows(model: onnx.ModelProto, input_name: str) -> int | None:
    """Rows of the initializer that ``input_name`` indexes through a Gather, if any."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def sample_inputs(
    model: onnx.ModelProto,
    *,
    seed: int = 0,
    batch: int = 2,
    seq: int = 8,
    vocab: int | None = None,
) -> dict[str, np.ndarray]:
    """Random valid inputs for a model from this module.

    Symbolic dims ``batch`` and ``seq`` take the given sizes (others 1); integer inputs are ids
    below ``vocab`` (by default the rows of the table they Gather from); bool inputs are True;
    float inputs are standard normal.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    sizes = {"batch": batch, "seq": seq}
    out: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        ttype = value.type.tensor_type
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, 1)
            for d in ttype.shape.dim
        )
        dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type)
        if dtype == np.bool_:
            out[value.name] = np.ones(shape, dtype=np.bool_)
        elif np.issubdtype(dtype, np.integer):
            high = vocab or _gather_table_rows(model, value.name) or 2
            out[value.name] = rng.integers(0, high, size=shape, dtype=dtype)
        else:
            out[value.name] = rng.standard_normal(shape).astype(dtype)
    return out


def run_onnxruntime(
    model_or_path: onnx.ModelProto | str | Path, inputs: Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """Run on the CPU provider with one thread; a path lets external data beside it resolve."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    source: str | bytes
    if isinstance(model_or_path, onnx.ModelProto):
        source = model_or_path.SerializeToString()
    else:
        source = str(model_or_path)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return list(session.run(None, dict(inputs)))
