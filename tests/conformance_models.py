"""Models with every tensor shape an exporter can write, for the conformance matrix.

PyTorch, TensorFlow and Hugging Face exports, quantizers and GE each leave tensors in
their own shapes: every element type onnx knows (4-bit and 2-bit types packed with odd
element counts, 6-bit floats, float8, bfloat16 and float16 in ``int32_data``, UINT64 in
``uint64_data``, DOUBLE in ``double_data``, complex numbers), values in ``raw_data`` or in
the typed fields, scalars, empty tensors, tensors right at the size threshold, every
``Constant`` attribute, sparse tensors, strings, initializers doubling as graph inputs
(opset < 9 exporters), subgraphs, model-local functions, training info, names no file
system likes, and weights already external (in subfolders, at offsets, with and without
``length`` and ``checksum``). Each model here is built from those pieces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

OPSET = 25
THRESHOLD = 1024  # the layouts' size_threshold, in bytes

SKIP = {T.UNDEFINED, T.STRING}
ELEMENT_TYPES = sorted(v for v in T.DataType.values() if v not in SKIP)
_BITS = {getattr(T, n): b for n, b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4),
                                      ("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6),
                                      ("FLOAT6E3M2", 6)) if hasattr(T, n)}
# onnxruntime (CPU) returns these to numpy as they are; the others are cast to float
# (bit-exact for every value they hold) or, when it has no kernel for them, not run.
_IDENTITY = {T.FLOAT, T.UINT8, T.INT8, T.UINT16, T.INT16, T.INT32, T.INT64, T.BOOL,
             T.FLOAT16, T.DOUBLE, T.UINT32, T.UINT64, T.FLOAT8E4M3FN}
_CAST = {T.BFLOAT16, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ, T.UINT4, T.INT4,
         T.FLOAT8E8M0, T.UINT2, T.INT2} & set(ELEMENT_TYPES)


def type_name(data_type: int) -> str:
    return T.DataType.Name(data_type)


def nbytes(data_type: int, count: int) -> int:
    """Bytes of ``count`` packed elements (onnx's rule: ceil(count * bits / 8))."""
    bits = _BITS.get(data_type)
    if bits is None:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    return -(-count * bits // 8)


def count_for(data_type: int, size: int) -> int:
    """The smallest odd element count whose payload is at least ``size`` bytes."""
    count = 1
    while nbytes(data_type, count) < size:
        count += 1
    return count if count % 2 else count + 1


def random_array(data_type: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values of the element type, from raw random bits wherever every bit pattern is a
    value (NaNs with payloads included), else from random numbers in range."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    count = int(np.prod(shape))
    if data_type == T.BOOL:
        return rng.integers(0, 2, count).astype(bool).reshape(shape)
    if data_type in _BITS:
        if data_type in (T.INT4, T.UINT4, T.INT2, T.UINT2):
            info = ml_dtypes.iinfo(dtype)
            return rng.integers(int(info.min), int(info.max) + 1, count).astype(dtype) \
                .reshape(shape)
        return (rng.standard_normal(count) * 2).astype(dtype).reshape(shape)
    return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def raw_tensor(name: str, data_type: int, shape: tuple[int, ...], seed: int) -> T:
    return numpy_helper.from_array(random_array(data_type, shape, seed), name)


def typed_tensor(name: str, data_type: int, shape: tuple[int, ...], seed: int) -> T:
    """The same values as :func:`raw_tensor`, stored the way ``make_tensor`` stores them
    without ``raw``: in the element type's typed field (``float_data``, ``int32_data``,
    ``int64_data``, ``double_data``, ``uint64_data``)."""
    values = random_array(data_type, shape, seed)
    if data_type in (T.FLOAT, T.DOUBLE, T.COMPLEX64, T.COMPLEX128):
        # through the wire, so signalling NaNs stay as they are
        field = "float_data" if data_type in (T.FLOAT, T.COMPLEX64) else "double_data"
        width = 4 if field == "float_data" else 8
        tensor = T(name=name, data_type=data_type, dims=shape)
        number = 4 if field == "float_data" else 10
        data = values.tobytes()
        tensor.MergeFromString(_len_field(number, data))
        assert len(getattr(tensor, field)) * width == len(data)
        return tensor
    tensor = T(name=name, data_type=data_type, dims=shape)
    raw = numpy_helper.from_array(values).raw_data
    if data_type in (T.INT8, T.INT16, T.INT32):
        tensor.int32_data.extend(values.astype(np.int64).ravel().tolist())
    elif data_type == T.INT64:
        tensor.int64_data.extend(values.ravel().tolist())
    elif data_type in (T.UINT32, T.UINT64):
        tensor.uint64_data.extend(values.astype(np.uint64).ravel().tolist())
    elif data_type in (T.FLOAT6E2M3, T.FLOAT6E3M2):  # one element per value, unpacked
        tensor.int32_data.extend(values.view(np.uint8).ravel().tolist())
    else:  # 16-bit types as uint16, 8-bit ones and packed 4/2-bit bytes as uint8
        width = np.uint16 if len(raw) == 2 * values.size else np.uint8
        tensor.int32_data.extend(np.frombuffer(raw, dtype=width).tolist())
    same = numpy_helper.to_array(tensor)
    assert same.tobytes() == values.tobytes(), type_name(data_type)
    return tensor


def _len_field(number: int, data: bytes) -> bytes:
    from weightstore.catalogue.wire import encode_varint

    return encode_varint((number << 3) | 2) + encode_varint(len(data)) + data


@dataclass
class Parts:
    """A graph under construction: nodes, initializers, inputs and outputs."""

    nodes: list[onnx.NodeProto]
    inits: list[T]
    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    runnable: list[str]  # outputs onnxruntime computes

    @classmethod
    def empty(cls) -> Parts:
        return cls([], [], [], [], [])

    def output(self, value: str, data_type: int, shape: tuple[int, ...] | None,
               node_name: str) -> None:
        """Make ``value`` a graph output: as it is, cast to float, or not run at all."""
        if data_type in _IDENTITY:
            out, to = f"out_{node_name}", data_type
            self.nodes.append(helper.make_node("Identity", [value], [out], name=node_name))
        elif data_type in _CAST:
            out, to = f"out_{node_name}", T.FLOAT
            self.nodes.append(helper.make_node("Cast", [value], [out], name=node_name,
                                               to=T.FLOAT))
        else:
            return
        self.outputs.append(helper.make_tensor_value_info(out, to, shape))
        self.runnable.append(out)


def element_type_parts(parts: Parts, types: list[int], *, seed: int = 0) -> None:
    """Every element type in raw_data and in its typed field, payloads just above the
    threshold with odd element counts (packed types end on half a byte), plus a scalar
    and an empty tensor of each."""
    for data_type in types:
        name = type_name(data_type).lower()
        count = count_for(data_type, THRESHOLD + 1)
        seed += 1
        for form, make in (("raw", raw_tensor), ("typed", typed_tensor)):
            tensor = make(f"{name}_{form}", data_type, (count,), seed)
            parts.inits.append(tensor)
            parts.output(tensor.name, data_type, (count,), f"use_{name}_{form}")
        seed += 1
        parts.inits.append(raw_tensor(f"{name}_scalar", data_type, (), seed))
        parts.output(f"{name}_scalar", data_type, (), f"use_{name}_scalar")
        parts.inits.append(typed_tensor(f"{name}_scalar_typed", data_type, (), seed))
        parts.output(f"{name}_scalar_typed", data_type, (), f"use_{name}_scalar_typed")
        parts.inits.append(raw_tensor(f"{name}_empty", data_type, (3, 0), seed))
        parts.output(f"{name}_empty", data_type, (3, 0), f"use_{name}_empty")


def threshold_parts(parts: Parts) -> None:
    """float32 payloads one below, at and one above the threshold (in elements: 4 bytes),
    and uint8 ones one byte off either side."""
    for label, count in (("below", THRESHOLD // 4 - 1), ("at", THRESHOLD // 4),
                         ("above", THRESHOLD // 4 + 1)):
        parts.inits.append(raw_tensor(f"f32_{label}", T.FLOAT, (count,), 100 + count))
        parts.output(f"f32_{label}", T.FLOAT, (count,), f"use_f32_{label}")
    for label, count in (("below", THRESHOLD - 1), ("at", THRESHOLD), ("above", THRESHOLD + 1)):
        parts.inits.append(raw_tensor(f"u8_{label}", T.UINT8, (count,), 200 + count))
        parts.output(f"u8_{label}", T.UINT8, (count,), f"use_u8_{label}")


def constant_parts(parts: Parts) -> None:
    """A ``Constant`` of each attribute form; ``value`` both in raw_data and typed fields."""
    n = count_for(T.FLOAT, THRESHOLD + 8)
    floats = random_array(T.FLOAT, (n,), 300)
    ints = np.arange(-n, n, 3, dtype=np.int64)
    forms = [
        ("value_raw", {"value": raw_tensor("", T.FLOAT, (n,), 301)}, T.FLOAT, (n,)),
        ("value_typed", {"value": typed_tensor("cv", T.FLOAT, (n,), 302)}, T.FLOAT, (n,)),
        ("value_i64_typed", {"value": typed_tensor("", T.INT64, (n,), 303)}, T.INT64, (n,)),
        ("value_f16_typed", {"value": typed_tensor("", T.FLOAT16, (2 * n + 1,), 304)},
         T.FLOAT16, (2 * n + 1,)),
        ("value_float", {"value_float": float(floats[0])}, T.FLOAT, ()),
        ("value_floats", {"value_floats": [float(x) for x in floats]}, T.FLOAT, (n,)),
        ("value_int", {"value_int": -7}, T.INT64, ()),
        ("value_ints", {"value_ints": [int(x) for x in ints]}, T.INT64, (len(ints),)),
        ("value_string", {"value_string": "héllo wörld"}, T.STRING, ()),
        ("value_strings", {"value_strings": ["a", "b/c", "ü"]}, T.STRING, (3,)),
    ]
    for label, attrs, data_type, shape in forms:
        out = f"const_{label}"
        node = helper.make_node("Constant", [], [out], name=f"node_{label}")
        for key, value in attrs.items():
            node.attribute.append(helper.make_attribute(key, value))
        parts.nodes.append(node)
        if data_type == T.STRING:
            parts.nodes.append(helper.make_node("Identity", [out], [f"out_{label}"],
                                                name=f"use_{label}"))
            parts.outputs.append(helper.make_tensor_value_info(f"out_{label}", T.STRING,
                                                               shape))
            parts.runnable.append(f"out_{label}")
        else:
            parts.output(out, data_type, shape, f"use_{label}")
    values = numpy_helper.from_array(random_array(T.FLOAT, (n,), 305), "sv")
    indices = numpy_helper.from_array(np.arange(0, 2 * n, 2, dtype=np.int64), "si")
    sparse = helper.make_sparse_tensor(values, indices, [2 * n])
    parts.nodes.append(helper.make_node("Constant", [], ["const_sparse"], name="node_sparse",
                                        sparse_value=sparse))
    parts.output("const_sparse", T.FLOAT, (2 * n,), "use_sparse")


def string_parts(parts: Parts) -> None:
    """A STRING initializer big enough to pass the threshold: it must stay inline."""
    tensor = helper.make_tensor("strings", T.STRING, (300,),
                                [f"token {i} ü".encode() for i in range(300)])
    parts.inits.append(tensor)
    parts.nodes.append(helper.make_node("Identity", ["strings"], ["out_strings"],
                                        name="use_strings"))
    parts.outputs.append(helper.make_tensor_value_info("out_strings", T.STRING, (300,)))
    parts.runnable.append("out_strings")


def naming_parts(parts: Parts) -> None:
    """Awkward names, one payload under two names and two dtypes, a default-valued input."""
    n = count_for(T.FLOAT, THRESHOLD + 4)
    same = random_array(T.FLOAT, (n,), 400)
    for name in ("encoder/layer.0:weight ü", "../escape", "a b\tc", "名前/重み:0", "CON"):
        tensor = numpy_helper.from_array(same, name)  # same bytes under each name
        parts.inits.append(tensor)
        parts.output(name, T.FLOAT, (n,), f"use_{len(parts.nodes)}")
    as_int = numpy_helper.from_array(same.view(np.int32), "same_bytes_as_int32")
    parts.inits.append(as_int)
    parts.output(as_int.name, T.INT32, (n,), "use_same_bytes_int32")
    as_u8 = numpy_helper.from_array(same.view(np.uint8).reshape(-1, 4), "same_bytes_u8")
    parts.inits.append(as_u8)
    parts.output(as_u8.name, T.UINT8, (n, 4), "use_same_bytes_u8")
    default = numpy_helper.from_array(random_array(T.FLOAT, (n,), 401), "with_default")
    parts.inits.append(default)  # opset < 9 exporters list every initializer as an input
    parts.inputs.append(helper.make_tensor_value_info("with_default", T.FLOAT, (n,)))
    parts.output("with_default", T.FLOAT, (n,), "use_with_default")
    # a MatMul weight (onnxruntime packs it) whose bytes an int32 tensor listed first holds
    weight = random_array(T.FLOAT, (n, 2), 402)
    parts.inits.append(numpy_helper.from_array(weight.view(np.int32).reshape(-1), "mm_twin"))
    parts.output("mm_twin", T.INT32, (2 * n,), "use_mm_twin")
    parts.inits.append(numpy_helper.from_array(weight, "mm_weight"))
    parts.nodes.append(helper.make_node("MatMul", ["with_default", "mm_weight"], ["mm"],
                                        name="matmul"))
    parts.output("mm", T.FLOAT, (2,), "use_mm")


def shape_parts(parts: Parts) -> None:
    """Shape-like inputs reached through Identity nodes (exporters add them for shared
    constants): an initializer, a Constant through two Identities, a function's formal
    input through an Identity in its body. onnxruntime loads them only inline."""
    n = THRESHOLD // 4 + 1
    parts.inits.append(numpy_helper.from_array(np.array([n, 1], np.int64), "reshape_to"))
    parts.nodes += [
        helper.make_node("Identity", ["reshape_to"], ["reshape_to_id"], name="shape_id"),
        helper.make_node("Reshape", ["f32_above", "reshape_to_id"], ["reshaped"],
                         name="reshape"),
        helper.make_node("Constant", [], ["axes"], name="axes_c",
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Identity", ["axes"], ["axes_1"], name="axes_id1"),
        helper.make_node("Identity", ["axes_1"], ["axes_2"], name="axes_id2"),
        helper.make_node("Unsqueeze", ["reshaped", "axes_2"], ["unsqueezed"],
                         name="unsqueeze"),
        helper.make_node("Constant", [], ["fn_shape"], name="fn_shape_c",
                         value=numpy_helper.from_array(np.array([1, n], np.int64))),
        helper.make_node("ReshapeVia", ["f32_above", "fn_shape"], ["fn_reshaped"],
                         name="call_reshape", domain="local.fn"),
    ]
    parts.output("unsqueezed", T.FLOAT, (1, n, 1), "use_unsqueezed")
    parts.output("fn_reshaped", T.FLOAT, (1, n), "use_fn_reshaped")


def reshape_function() -> onnx.FunctionProto:
    return helper.make_function(
        "local.fn", "ReshapeVia", ["x", "shape"], ["y"],
        [helper.make_node("Identity", ["shape"], ["s"], name="fn_shape_id"),
         helper.make_node("Reshape", ["x", "s"], ["y"], name="fn_reshape")],
        [helper.make_opsetid("", OPSET)])


def sparse_initializer() -> onnx.SparseTensorProto:
    n = count_for(T.FLOAT, THRESHOLD + 4)
    values = numpy_helper.from_array(random_array(T.FLOAT, (n,), 500), "sparse_init")
    indices = numpy_helper.from_array(np.arange(n, dtype=np.int64) * 3, "sparse_init_idx")
    return helper.make_sparse_tensor(values, indices, [3 * n])


def _subgraph(tag: str, seed: int, data_type: int = T.FLOAT) -> tuple[onnx.GraphProto, int]:
    n = count_for(data_type, THRESHOLD + 4)
    init = raw_tensor(f"{tag}_init", data_type, (n,), seed)
    const = typed_tensor(f"{tag}_cv", data_type, (n,), seed + 1)
    nodes = [helper.make_node("Constant", [], [f"{tag}_c"], name=f"{tag}_const", value=const),
             helper.make_node("Add", [f"{tag}_init", f"{tag}_c"], [f"{tag}_out"],
                              name=f"{tag}_add")]
    graph = helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(
        f"{tag}_out", data_type, (n,))], [init])
    return graph, n


def control_flow_parts(parts: Parts) -> None:
    """Initializers and Constants in If branches, a Loop body, a Scan body."""
    then_g, n = _subgraph("then", 600)
    else_g, _ = _subgraph("else", 610)
    parts.nodes.append(helper.make_node("Constant", [], ["cond"], name="cond_const",
                                        value=helper.make_tensor("", T.BOOL, (), [True])))
    parts.nodes.append(helper.make_node("If", ["cond"], ["if_out"], name="branch",
                                        then_branch=then_g, else_branch=else_g))
    parts.output("if_out", T.FLOAT, (n,), "use_if")
    body, n = _subgraph("loop", 620)
    body.input.extend([helper.make_tensor_value_info("i", T.INT64, ()),
                       helper.make_tensor_value_info("c_in", T.BOOL, ())])
    body.node.append(helper.make_node("Identity", ["c_in"], ["c_out"], name="loop_cond"))
    body.output.insert(0, helper.make_tensor_value_info("c_out", T.BOOL, ()))
    parts.nodes.append(helper.make_node("Constant", [], ["trip"], name="trip_const",
                                        value=helper.make_tensor("", T.INT64, (), [2])))
    parts.nodes.append(helper.make_node("Loop", ["trip", "cond"], ["loop_out"], name="loop",
                                        body=body))
    parts.output("loop_out", T.FLOAT, (2, n), "use_loop")
    scan_n = count_for(T.FLOAT, THRESHOLD + 4)
    scan_w = raw_tensor("scan_w", T.FLOAT, (scan_n,), 630)
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "scan_w"], ["s_out"], name="scan_add"),
         helper.make_node("Identity", ["x_in"], ["x_out"], name="scan_id")],
        "scan_body",
        [helper.make_tensor_value_info("s_in", T.FLOAT, (scan_n,)),
         helper.make_tensor_value_info("x_in", T.FLOAT, (1,))],
        [helper.make_tensor_value_info("s_out", T.FLOAT, (scan_n,)),
         helper.make_tensor_value_info("x_out", T.FLOAT, (1,))], [scan_w])
    parts.nodes.append(helper.make_node("Constant", [], ["scan_init"], name="scan_init_c",
                                        value=raw_tensor("", T.FLOAT, (scan_n,), 631)))
    parts.nodes.append(helper.make_node("Constant", [], ["scan_xs"], name="scan_xs_c",
                                        value=raw_tensor("", T.FLOAT, (3, 1), 632)))
    parts.nodes.append(helper.make_node("Scan", ["scan_init", "scan_xs"],
                                        ["scan_final", "scan_ys"], name="scan",
                                        body=scan_body, num_scan_inputs=1))
    parts.output("scan_final", T.FLOAT, (scan_n,), "use_scan")


def local_function(n: int) -> onnx.FunctionProto:
    """A model-local function whose body holds a large Constant."""
    const = typed_tensor("fn_cv", T.FLOAT, (n,), 700)
    return helper.make_function(
        "local.fn", "AddBias", ["x"], ["y"],
        [helper.make_node("Constant", [], ["b"], name="fn_const", value=const),
         helper.make_node("Add", ["x", "b"], ["y"], name="fn_add")],
        [helper.make_opsetid("", OPSET)])


def training_info(n: int) -> onnx.TrainingInfoProto:
    init = raw_tensor("train_state", T.FLOAT, (n,), 800)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["train_c"], name="train_const",
                          value=raw_tensor("", T.FLOAT, (n,), 801))],
        "train_init", [], [helper.make_tensor_value_info("train_c", T.FLOAT, (n,))], [init])
    info = onnx.TrainingInfoProto()
    info.initialization.CopyFrom(graph)
    return info


def matrix_model(*, runnable_only: bool = False) -> onnx.ModelProto:
    """The whole matrix in one model. ``runnable_only`` leaves out the element types
    onnxruntime cannot run (complex, 6-bit floats, FLOAT4E2M1), so its outputs can be
    compared; the full model is for round trips, inspection and checks."""
    parts = Parts.empty()
    types = [t for t in ELEMENT_TYPES if t in _IDENTITY | _CAST] if runnable_only \
        else ELEMENT_TYPES
    element_type_parts(parts, types)
    threshold_parts(parts)
    constant_parts(parts)
    string_parts(parts)
    naming_parts(parts)
    control_flow_parts(parts)
    shape_parts(parts)
    n = count_for(T.FLOAT, THRESHOLD + 4)
    parts.nodes.append(helper.make_node("Constant", [], ["fn_x"], name="fn_x_c",
                                        value=raw_tensor("", T.FLOAT, (n,), 701)))
    parts.nodes.append(helper.make_node("AddBias", ["fn_x"], ["fn_y"], name="call_fn",
                                        domain="local.fn"))
    parts.output("fn_y", T.FLOAT, (n,), "use_fn")
    graph = helper.make_graph(parts.nodes, "matrix", parts.inputs, parts.outputs, parts.inits,
                              doc_string="the conformance matrix")
    graph.sparse_initializer.append(sparse_initializer())
    parts = Parts([], [], [], [], [])
    parts.output("sparse_init", T.FLOAT, (3 * n,), "use_sparse_init")
    graph.node.extend(parts.nodes)
    graph.output.extend(parts.outputs)
    graph.initializer[0].doc_string = "an initializer's doc"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("local.fn", 1)],
                              functions=[local_function(n), reshape_function()],
                              producer_name="conformance",
                              doc_string="every tensor shape", ir_version=8)
    helper.set_model_props(model, {"exporter": "conformance", "ü key": "ü value"})
    if not runnable_only:
        model.training_info.append(training_info(n))
    return model


def external_source(folder: Path) -> Path:
    """A model whose weights are already external data, as exporters write them: in a
    subfolder, several tensors of one file at offsets (the last without ``length``), one
    with a ``checksum``, one in a file of its own; plus inline tensors."""
    from weightstore.io.digests import digest_bytes

    n = count_for(T.FLOAT, THRESHOLD + 4)
    (folder / "weights").mkdir(parents=True, exist_ok=True)
    tensors = [raw_tensor(f"ext_{i}", T.FLOAT, (n,), 900 + i) for i in range(4)]
    blob = bytearray()
    for i, tensor in enumerate(tensors[:3]):
        blob += b"\x00" * (-len(blob) % 64) + b"pad" * i
        offset = len(blob)
        blob += tensor.raw_data
        entries = {"location": "weights/model.data", "offset": str(offset)}
        if i < 2:
            entries["length"] = str(len(tensor.raw_data))
        if i == 1:
            entries["checksum"] = "blake3:" + digest_bytes("blake3", tensor.raw_data)
        _make_external(tensor, entries)
    (folder / "weights" / "model.data").write_bytes(bytes(blob))
    (folder / "weights" / "own.bin").write_bytes(tensors[3].raw_data)
    _make_external(tensors[3], {"location": "weights/own.bin"})
    inline = [raw_tensor("inline_small", T.FLOAT, (4,), 950),
              typed_tensor("inline_typed", T.INT64, (count_for(T.INT64, THRESHOLD),), 951)]
    all_tensors = [*tensors, *inline]
    nodes = [helper.make_node("Identity", [t.name], [f"out_{t.name}"], name=f"use_{t.name}")
             for t in all_tensors]
    outputs = [helper.make_tensor_value_info(f"out_{t.name}", t.data_type, tuple(t.dims))
               for t in all_tensors]
    # a Constant, a subgraph initializer and a function's Constant, all external, the
    # last two without an offset (0), in one more file of the subfolder
    more = [raw_tensor("", T.FLOAT, (n,), 960 + i) for i in range(3)]
    (folder / "weights" / "more.bin").write_bytes(b"".join(t.raw_data for t in more))
    for i, t in enumerate(more):
        entries = {"location": "weights/more.bin", "length": str(len(t.raw_data))}
        if i == 0:
            entries["offset"] = "0"
        else:
            (folder / "weights" / f"more{i}.bin").write_bytes(t.raw_data)
            entries["location"] = f"weights/more{i}.bin"
        _make_external(t, entries)
    nodes.append(helper.make_node("Constant", [], ["ext_const"], name="ext_const",
                                  value=more[0]))
    more[1].name = "sub_w"
    branch = helper.make_graph([helper.make_node("Identity", ["sub_w"], ["sub_out"])], "sub",
                               [], [helper.make_tensor_value_info("sub_out", T.FLOAT, (n,))],
                               [more[1]])
    nodes.append(helper.make_node("Constant", [], ["ext_cond"], name="ext_cond",
                                  value=helper.make_tensor("", T.BOOL, (), [False])))
    nodes.append(helper.make_node("If", ["ext_cond"], ["ext_if"], name="ext_if",
                                  then_branch=branch, else_branch=branch))
    function = helper.make_function(
        "local.ext", "Bias", ["x"], ["y"],
        [helper.make_node("Constant", [], ["b"], value=more[2]),
         helper.make_node("Add", ["x", "b"], ["y"])], [helper.make_opsetid("", OPSET)])
    nodes.append(helper.make_node("Bias", ["ext_const"], ["ext_fn"], domain="local.ext"))
    outputs += [helper.make_tensor_value_info(v, T.FLOAT, (n,))
                for v in ("ext_const", "ext_if", "ext_fn")]
    graph = helper.make_graph(nodes, "external", [], outputs, all_tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("local.ext", 1)],
                              functions=[function], ir_version=8)
    path = folder / "external.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _make_external(tensor: T, entries: dict[str, str]) -> None:
    tensor.ClearField("raw_data")
    tensor.data_location = T.EXTERNAL
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)


def iter_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, T]]:
    """Every TensorProto of the model with its structural path."""
    from weightstore.catalogue.sites import iter_tensor_sites

    for site in iter_tensor_sites(model):
        yield site.key, site.tensor
