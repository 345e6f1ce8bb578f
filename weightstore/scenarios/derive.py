"""Computing derived weights: the bytes a scenario's recipes stand for.

A pass never reads a large payload: it declares a new initializer (name, type, dims, no
bytes) and a :class:`~weightstore.catalogue.descriptors.DerivedWeightRecipe` over source
weights named as in the model the pass received. Only when a runnable model or a package
is written are the bytes computed here, from the *base* model's values.

Operations (attributes are strings, as the recipe stores them):

=========================  =========================================  ====================
operation                  sources                                    attributes
=========================  =========================================  ====================
``concat``                 2 or more arrays                           ``axis``
``cast``                   1 array                                    ``to`` (onnx dtype)
``transpose``              1 array                                    ``perm`` (JSON list)
``copy``                   1 array (a weight renamed while moving)    none
``fold-batchnorm-weight``  W, scale, var                              ``epsilon``
``fold-batchnorm-bias``    [B,] scale, bias, mean, var                ``epsilon``
``matmul-nbits-weight``    a MatMul's weight [K, N] (float32/16)      ``bits``,
``matmul-nbits-scales``    the same                                   ``block_size``,
``matmul-nbits-zero-points``  the same                                ``symmetric``
=========================  =========================================  ====================

``dynamic-int8-weight``, ``dynamic-int8-scale`` and ``dynamic-int8-zero-point`` (1 float
weight, attribute ``weight_type``) are a weight as onnxruntime's ``quantize_dynamic``
stores it, computed by onnxruntime (:mod:`weightstore.scenarios.derive_dynamic`), once
for all three like the ``matmul-nbits-*`` parts below.

Results are computed deterministically (fixed operation order, float64 for the batch-norm
folds, numpy's round-to-nearest-even casts), so the same base gives the same bytes.

The three ``matmul-nbits-*`` operations are the parts of one computation, onnxruntime's
own block quantization (``quantize_matmul_4bits`` / ``quantize_matmul_8bits``, called
exactly as its ``MatMulNBitsQuantizer``'s default RTN algorithm calls them: K padded with
zeros to whole blocks, the packed weight ``[N, blocks, block_size * bits / 8]`` uint8,
the scales ``[N, blocks]`` in the weight's type, the zero points ``[N, ceil(blocks * bits
/ 8)]`` uint8). A :func:`resolver` computes it once per source weight and settings, and
hands out each part as it is asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ..catalogue.descriptors import DerivedWeightRecipe
from ..convert.encoding import clear_payload
from ..errors import ScenarioError
from ..io.files import parse_json
from ..io.onnx_arrays import from_array, np_dtype, to_array
from ..io.onnx_proto import AttributeProto, FunctionProto, GraphProto, ModelProto, TensorProto
from ..passes.base import has_payload
from .derive_dynamic import dynamic_int8

SourceValue = Callable[[str], np.ndarray]

__all__ = ["OPERATIONS", "base_values", "compute", "materialize"]


def _attrs(recipe: DerivedWeightRecipe, required: tuple[str, ...]) -> dict[str, str]:
    attrs = dict(recipe.attributes)
    if sorted(attrs) != sorted(required):
        raise ScenarioError("derived weight attributes do not fit its operation",
                            operation=recipe.operation, attributes=sorted(attrs),
                            expected=list(required))
    return attrs


def _int(value: str, what: str, recipe: DerivedWeightRecipe) -> int:
    try:
        return int(value)
    except ValueError:
        raise ScenarioError("derived weight attribute is not an integer",
                            operation=recipe.operation, attribute=what, value=value) from None


def _float(value: str, what: str, recipe: DerivedWeightRecipe) -> float:
    try:
        return float(value)
    except ValueError:
        raise ScenarioError("derived weight attribute is not a number",
                            operation=recipe.operation, attribute=what, value=value) from None


def _concat(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    axis = _int(_attrs(recipe, ("axis",))["axis"], "axis", recipe)
    first = src[0]
    if any(a.dtype != first.dtype or a.ndim != first.ndim for a in src):
        raise ScenarioError("concat sources differ in type or rank",
                            shapes=[a.shape for a in src])
    if not -first.ndim <= axis < first.ndim:
        raise ScenarioError("concat axis out of range", axis=axis, rank=first.ndim)
    axis %= first.ndim
    others = [tuple(d for i, d in enumerate(a.shape) if i != axis) for a in src]
    if len(set(others)) != 1:
        raise ScenarioError("concat sources differ in shape off the axis",
                            shapes=[a.shape for a in src], axis=axis)
    return np.concatenate(src, axis=axis)


def _cast(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    to = _int(_attrs(recipe, ("to",))["to"], "to", recipe)
    try:
        dtype = np_dtype(to)
    except (KeyError, ValueError):
        raise ScenarioError("cast to an unknown onnx type", to=to) from None
    _check_range(recipe, src[0], np.dtype(dtype))
    return src[0].astype(dtype)


def _check_range(recipe: DerivedWeightRecipe, source: np.ndarray, target: np.dtype) -> None:
    """Refuse a float cast that would turn a finite value into inf (a -1e5 attention mask
    cast to float16); infinities and NaNs of the source stay as they are."""
    if target.kind != "f" or source.dtype.kind not in "iuf" or not source.size:
        return
    limit = float(np.finfo(target).max)
    if source.dtype.kind == "f" and float(np.finfo(source.dtype).max) <= limit:
        return  # every finite source value fits
    wide = source.astype(np.float64)
    over = np.isfinite(wide) & (np.abs(wide) > limit)
    if over.any():
        raise ScenarioError("cast would overflow: a finite value is out of the target "
                            "type's range", operation=recipe.operation,
                            source=recipe.sources[0], to=target.name, limit=limit,
                            value=float(wide[over][0]), count=int(over.sum()))


def _transpose(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    raw = _attrs(recipe, ("perm",))["perm"]
    try:
        perm = parse_json(raw)
    except ValueError:
        perm = None
    if (not isinstance(perm, list) or not all(isinstance(p, int) for p in perm)
            or sorted(perm) != list(range(src[0].ndim))):
        raise ScenarioError("transpose perm is not a permutation of the source's axes",
                            perm=raw, rank=src[0].ndim)
    return np.ascontiguousarray(np.transpose(src[0], perm))


def _copy(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    _attrs(recipe, ())
    return src[0]


def _bn_factor(recipe: DerivedWeightRecipe, scale: np.ndarray, var: np.ndarray,
               channels: int) -> np.ndarray:
    eps = _float(_attrs(recipe, ("epsilon",))["epsilon"], "epsilon", recipe)
    if scale.shape != (channels,) or var.shape != (channels,):
        raise ScenarioError("batch-norm parameters do not match the channels",
                            channels=channels, scale=scale.shape, var=var.shape)
    return scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)


def _fold_weight(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    w, scale, var = src
    if w.ndim < 1:
        raise ScenarioError("a convolution weight has at least one axis", shape=w.shape)
    factor = _bn_factor(recipe, scale, var, w.shape[0])
    folded = w.astype(np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))
    return folded.astype(w.dtype)


def _fold_bias(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> np.ndarray:
    conv_bias = src[0] if len(src) == 5 else None
    scale, bias, mean, var = src[-4:]
    channels = scale.shape[0] if scale.ndim == 1 else -1
    factor = _bn_factor(recipe, scale, var, channels)
    for label, a in (("bias", bias), ("mean", mean), ("conv bias", conv_bias)):
        if a is not None and a.shape != (channels,):
            raise ScenarioError("batch-norm parameters do not match the channels",
                                parameter=label, channels=channels, shape=a.shape)
    start = conv_bias.astype(np.float64) if conv_bias is not None else 0.0
    folded = (start - mean.astype(np.float64)) * factor + bias.astype(np.float64)
    return folded.astype((conv_bias if conv_bias is not None else scale).dtype)


def _flag(value: str, what: str, recipe: DerivedWeightRecipe) -> bool:
    if value not in ("true", "false"):
        raise ScenarioError("derived weight attribute is not true or false",
                            operation=recipe.operation, attribute=what, value=value)
    return value == "true"


def _matmul_nbits(recipe: DerivedWeightRecipe, src: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """(packed weight, scales, zero points) of a MatMul weight, by onnxruntime's kernels
    with the layout of ``DefaultWeightOnlyQuantizer.qbits_block_quant`` (QOperator)."""
    try:
        from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits
    except ImportError:
        raise ScenarioError("quantized weights are computed by onnxruntime's kernels: "
                            "install it (pip install 'weightstore[quantize]')") from None
    attrs = _attrs(recipe, ("bits", "block_size", "symmetric"))
    bits = _int(attrs["bits"], "bits", recipe)
    block_size = _int(attrs["block_size"], "block_size", recipe)
    symmetric = _flag(attrs["symmetric"], "symmetric", recipe)
    weight = src[0]
    from ..recipe.pass_params import BLOCK_SIZES

    if bits not in (4, 8) or block_size not in BLOCK_SIZES:
        raise ScenarioError("matmul-nbits takes 4 or 8 bits and a block size of "
                            f"{', '.join(map(str, BLOCK_SIZES))}", bits=bits,
                            block_size=block_size)
    if weight.ndim != 2 or weight.dtype not in (np.float32, np.float16):
        raise ScenarioError("matmul-nbits quantizes a float32 or float16 matrix",
                            shape=list(weight.shape), dtype=str(weight.dtype))
    rows, cols = weight.shape
    kpack = 8 // bits
    blocks = (rows + block_size - 1) // block_size
    padded = np.zeros((blocks * block_size, cols), dtype=weight.dtype)
    padded[:rows] = weight
    packed = np.zeros((cols, blocks, (block_size + kpack - 1) // kpack), dtype=np.uint8)
    zero_points = np.zeros((cols, (blocks + kpack - 1) // kpack), dtype=np.uint8)
    scales = np.zeros((cols, blocks), dtype=weight.dtype)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    kernel(packed, padded, scales, zero_points, block_size, cols, rows, symmetric)
    return packed, scales, zero_points


Operation = Callable[[DerivedWeightRecipe, list[np.ndarray]], np.ndarray]
Joint = Callable[[DerivedWeightRecipe, list[np.ndarray]], tuple[np.ndarray, ...]]

# operations that are parts of one computation: operation -> (the computation, its part)
JOINT: dict[str, tuple[Joint, int]] = {
    "matmul-nbits-weight": (_matmul_nbits, 0),
    "matmul-nbits-scales": (_matmul_nbits, 1),
    "matmul-nbits-zero-points": (_matmul_nbits, 2),
    "dynamic-int8-weight": (dynamic_int8, 0),
    "dynamic-int8-scale": (dynamic_int8, 1),
    "dynamic-int8-zero-point": (dynamic_int8, 2),
}

def _part(operation: str) -> Operation:
    function, part = JOINT[operation]
    return lambda recipe, src: function(recipe, src)[part]


# operation -> (function, allowed source counts)
OPERATIONS: dict[str, tuple[Operation, Callable[[int], bool]]] = {
    "concat": (_concat, lambda n: n >= 2),
    "cast": (_cast, lambda n: n == 1),
    "transpose": (_transpose, lambda n: n == 1),
    "copy": (_copy, lambda n: n == 1),
    "fold-batchnorm-weight": (_fold_weight, lambda n: n == 3),
    "fold-batchnorm-bias": (_fold_bias, lambda n: n in (4, 5)),
    **{name: (_part(name), lambda n: n == 1) for name in JOINT},
}


class Memo:
    """The results of computations with several parts (:data:`JOINT`) by key, each
    computed once, also when threads ask for its parts at the same time."""

    def __init__(self) -> None:
        self._results: dict[tuple, tuple[np.ndarray, ...]] = {}
        self._locks: dict[tuple, threading.RLock] = {}
        self._guard = threading.Lock()

    def get(self, key: tuple, make: Callable[[], tuple[np.ndarray, ...]],
            ) -> tuple[np.ndarray, ...]:
        with self._guard:
            lock = self._locks.setdefault(key, threading.RLock())
        with lock:
            if key not in self._results:
                self._results[key] = make()
            return self._results[key]


def compute(recipe: DerivedWeightRecipe,
            sources: list[np.ndarray] | Callable[[], list[np.ndarray]],
            memo: Memo | None = None) -> np.ndarray:
    """The array ``recipe`` produces from ``sources`` (in the recipe's source order; or a
    function giving them, called only when they are needed).

    ``memo`` keeps the results of a computation with several parts (:data:`JOINT`) by
    its sources' names and attributes: the other parts of one source's quantization are
    then taken from it, not computed again (nor their sources read again).
    """
    if recipe.operation not in OPERATIONS:
        raise ScenarioError("unknown derived weight operation", operation=recipe.operation)
    function, count_ok = OPERATIONS[recipe.operation]
    if not count_ok(len(recipe.sources)):
        raise ScenarioError("wrong number of sources for a derived weight",
                            operation=recipe.operation, sources=len(recipe.sources))

    def arrays() -> list[np.ndarray]:
        given = sources() if callable(sources) else sources
        if len(given) != len(recipe.sources):
            raise ScenarioError("wrong number of sources for a derived weight",
                                operation=recipe.operation, sources=len(given))
        return [np.asarray(s) for s in given]

    if memo is None or recipe.operation not in JOINT:
        return function(recipe, arrays())
    joint, part = JOINT[recipe.operation]
    key = (joint.__name__, recipe.sources, recipe.attributes)
    return memo.get(key, lambda: joint(recipe, arrays()))[part]


# -- filling a model ------------------------------------------------------------------------

def _graphs(model: ModelProto) -> Iterator[GraphProto | FunctionProto]:
    stack: list[GraphProto | FunctionProto] = [model.graph, *model.functions]
    while stack:
        g = stack.pop(0)
        yield g
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)


def _value_tensors(model: ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(value name, tensor) for every initializer and Constant ``value`` in every graph."""
    for g in _graphs(model):
        for t in getattr(g, "initializer", ()):
            yield t.name, t
        for node in g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                for a in node.attribute:
                    if a.name == "value" and a.type == AttributeProto.TENSOR:
                        yield node.output[0], a.t


def base_values(model: ModelProto) -> SourceValue:
    """A ``source_value`` reading ``model``'s initializers and Constant tensors by value name.

    A name that two different tensors carry (in different scopes) is refused when asked
    for, rather than answered with either of them.
    """
    index: dict[str, list[TensorProto]] = {}
    for name, tensor in _value_tensors(model):
        index.setdefault(name, []).append(tensor)

    def source_value(name: str) -> np.ndarray:
        found = index.get(name)
        if not found:
            raise ScenarioError("no weight of the base model has this name", source=name)
        if any(t.SerializeToString() != found[0].SerializeToString() for t in found[1:]):
            raise ScenarioError("several weights of the base model have this name",
                                source=name, count=len(found))
        if not has_payload(found[0]):
            raise ScenarioError("the base model holds no payload for this weight", source=name)
        return to_array(found[0])

    return source_value


def _fill(tensor: TensorProto, array: np.ndarray, name: str) -> None:
    expected = tuple(int(d) for d in tensor.dims)
    try:
        dtype = np_dtype(tensor.data_type)
    except (KeyError, ValueError):
        raise ScenarioError("derived weight has an unsupported type", name=name,
                            data_type=tensor.data_type) from None
    if array.dtype != dtype:
        raise ScenarioError("derived weight type differs from its declaration", name=name,
                            declared=TensorProto.DataType.Name(tensor.data_type),
                            computed=str(array.dtype))
    if tuple(array.shape) != expected:
        raise ScenarioError("derived weight shape differs from its declaration", name=name,
                            declared=list(expected), computed=list(array.shape))
    encoded = from_array(np.ascontiguousarray(array))
    clear_payload(tensor)
    tensor.raw_data = encoded.raw_data


def materialize(model: ModelProto, derivations: Mapping[str, DerivedWeightRecipe],
                source_value: SourceValue, *, strict: bool = True) -> None:
    """Give every omitted payload of ``model`` its bytes, in place.

    A tensor named in ``derivations`` (an initializer in any graph, or a Constant's value)
    is computed by its recipe; a source that is itself derived (a later pass building on an
    earlier one's result) is computed first, any other from ``source_value`` (the base
    model's values). A tensor without payload and without recipe is a weight that moved
    under its own name (a folded If's branch weights) and is read from ``source_value``.

    With ``strict``, a recipe whose tensor is not in ``model`` and that no other recipe
    needs is an error: the records and the model disagree.
    """
    targets: dict[str, list[TensorProto]] = {}
    for name, tensor in _value_tensors(model):
        if not has_payload(tensor):
            targets.setdefault(name, []).append(tensor)
    needed = {s for r in derivations.values() for s in r.sources}
    for name in sorted(derivations):
        if name not in targets and strict and name not in needed:
            raise ScenarioError("derived weight is not in the model", name=name)
    value = resolver(derivations, source_value)
    for name in sorted(targets):
        for tensor in targets[name]:
            _fill(tensor, value(name), name)


def resolver(derivations: Mapping[str, DerivedWeightRecipe], source_value: SourceValue,
             ) -> SourceValue:
    """The value of any weight by name: derived ones computed (sources first, each once),
    any other read from ``source_value`` (the base model's values). Threads may ask for
    values at the same time (a joint computation still runs once)."""
    cache: dict[str, np.ndarray] = {}
    memo = Memo()
    local = threading.local()  # the names this thread is computing: a cycle's trail

    def value(name: str) -> np.ndarray:
        if name in cache:
            return cache[name]
        active: list[str] = local.__dict__.setdefault("active", [])
        if name in active:
            raise ScenarioError("derived weights depend on each other in a cycle",
                                names=[*active, name])
        recipe = derivations.get(name)
        if recipe is None:
            return source_value(name)
        active.append(name)
        try:
            result = compute(recipe, lambda: [source_value(s) if s == name else value(s)
                                              for s in recipe.sources], memo)
        except ScenarioError as exc:
            exc.context.setdefault("name", name)
            raise
        finally:
            active.pop()
        cache[name] = result
        return result

    return value
