"""Inputs that onnxruntime needs as inline constants.

onnxruntime refuses to load a model whose shape-like input (Reshape's ``shape``, Slice's
``starts``, ...) is external data, so tensors feeding such inputs stay inline whatever their
size. The table is by (domain, op_type) -> input positions.
"""

from __future__ import annotations

import onnx

from .graphs import iter_nodes

SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Range": (0, 1, 2),
    "OneHot": (1,),
    "Split": (1,),
    "CenterCropPad": (1, 2),
    "NonMaxSuppression": (2, 3, 4),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
    "Trilu": (1,),
    "CumSum": (1,),
    "DFT": (1, 2),
    "STFT": (1, 2, 3),
    "AffineGrid": (1,),
    "Col2Im": (1, 2),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Loop": (0, 1),
}


def shape_input_names(model: onnx.ModelProto) -> frozenset[str]:
    """Names of every value consumed at a shape-like input anywhere in the model.

    Names are collected across all graphs and functions: scoping could only make a name
    shadowed, and keeping one extra tensor inline is the safe side.
    """
    names: set[str] = set()
    for node in iter_nodes(model):
        if node.domain not in ("", "ai.onnx"):
            continue
        for i in SHAPE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i]:
                names.add(node.input[i])
    return frozenset(names)
