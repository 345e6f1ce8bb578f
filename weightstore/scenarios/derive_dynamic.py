"""Dynamic int8 weights: a MatMul weight as onnxruntime's ``quantize_dynamic`` stores it.

Three derived operations, each over one float32 or float16 weight and with the attribute
``weight_type`` (``int8`` or ``uint8``), and ``transposed`` (``true``) for the weight of a
Gemm with ``transB`` 1, which ``quantize_dynamic`` transposes before it quantizes it:

==============================  =================================================
operation                       result
==============================  =================================================
``dynamic-int8-weight``         the quantized weight, the source's shape (reversed
                                when ``transposed``)
``dynamic-int8-scale``          its scale, a scalar of the source's float type
``dynamic-int8-zero-point``     its zero point, a scalar of ``weight_type``
==============================  =================================================

The numbers come from onnxruntime itself: ``onnxruntime.quantization.quant_utils.
quantize_data`` over the flattened weight, per tensor, with the symmetry its quantizer
gives a weight type (a signed type is symmetric, ``BaseQuantizer.is_weight_symmetric``)
and no reduced range (``quantize_dynamic``'s defaults); the scale and the zero point are
encoded with ``onnx.helper.make_tensor`` from the values' list, as
``BaseQuantizer.quantize_initializer_impl`` writes them. The three are parts of one
computation (``derive.JOINT``): a weight is quantized once for all three.
"""

from __future__ import annotations

import numpy as np

from ..catalogue.descriptors import DerivedWeightRecipe
from ..errors import ScenarioError
from ..io.onnx_arrays import np_dtype, to_array
from ..io.onnx_proto import TensorProto

WEIGHT_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
FLOAT_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def settings_of(recipe: DerivedWeightRecipe) -> tuple[str, bool]:
    """(weight type, transposed) of a recipe."""
    attrs = dict(recipe.attributes)
    if sorted(attrs) not in (["weight_type"], ["transposed", "weight_type"]):
        raise ScenarioError("derived weight attributes do not fit its operation",
                            operation=recipe.operation, attributes=sorted(attrs),
                            expected=["weight_type", "transposed (optional)"])
    if attrs["weight_type"] not in WEIGHT_TYPES:
        raise ScenarioError("dynamic quantization weight type is int8 or uint8",
                            operation=recipe.operation, weight_type=attrs["weight_type"])
    if attrs.get("transposed", "true") != "true":
        raise ScenarioError("a dynamic int8 weight's transposed attribute is true or absent",
                            operation=recipe.operation, transposed=attrs["transposed"])
    return attrs["weight_type"], "transposed" in attrs


def dynamic_int8(recipe: DerivedWeightRecipe, src: list[np.ndarray],
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight, scale, zero point) of ``src[0]`` as ``quantize_dynamic`` stores them."""
    weight_type, transposed = settings_of(recipe)
    source = src[0]
    if source.dtype not in FLOAT_TYPES:
        raise ScenarioError("dynamic quantization reads a float32 or float16 weight",
                            operation=recipe.operation, dtype=str(source.dtype))
    if transposed:
        if source.ndim != 2:
            raise ScenarioError("a transposed dynamic int8 weight is a matrix",
                                operation=recipe.operation, shape=list(source.shape))
        source = np.ascontiguousarray(source.T)
    try:
        from onnxruntime.quantization.quant_utils import quantize_data
    except ImportError:
        raise ScenarioError("dynamic int8 weights are computed by onnxruntime: install it "
                            "(pip install 'weightstore[quantize]')") from None
    from onnx import helper  # quant_utils has imported onnx

    qtype = WEIGHT_TYPES[weight_type]
    symmetric = qtype == TensorProto.INT8  # BaseQuantizer.is_weight_symmetric
    zero_point, scale, q = quantize_data(source.flatten(), qtype, symmetric,
                                         reduce_range=False, min_real_range=None)
    weight = np.asarray(q, dtype=np_dtype(qtype)).reshape(source.shape)
    scale_tensor = helper.make_tensor("scale", FLOAT_TYPES[source.dtype], [],
                                      scale.reshape((-1,)).tolist())
    zero_tensor = helper.make_tensor("zero_point", qtype, [], zero_point.reshape((-1,)).tolist())
    return weight, to_array(scale_tensor), to_array(zero_tensor)
