"""The parameters each rewrite pass takes in a recipe: one pydantic model per pass.

A scenario names its passes in order, each by its bare name (``cleanup``) or as a mapping
of its name and parameters (``{name: quantize-weights, bits: 4, block_size: 32}``). The
models here validate those parameters (unknown keys refused, types strict, ranges
checked) and double as the JSON Schema, so an editor lists them. They sit in the recipe
layer, below the passes that take them (``weightstore.passes.registry`` pairs each pass
class with its model here; a test checks that the two agree).

A pass's *canonical* form is what a scenario's digest, the build's fingerprint and the
scenario's stored record hold: the bare name for a pass without parameters, else the
mapping of its name and every parameter, defaults filled (:func:`canonical`), so that
``cast-fp16`` and ``{name: cast-fp16, min_elements: 1024}`` are one and the same pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ScenarioError


class PassParams(BaseModel):
    """A pass without parameters (and the base of every pass's parameters): unknown keys
    are errors, values immutable, YAML types kept (``bits: "4"`` is refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CastFP16Params(PassParams):
    """``cast-fp16``: which float32 weights get a float16 copy."""

    min_elements: int = Field(
        1024, ge=0,
        description="A weight of one dimension (a bias, a norm's scale) is cast only from "
                    "this many elements on; weights of two or more dimensions always are.")


class QuantizeDynamicParams(PassParams):
    """``quantize-dynamic``: MatMul weights as onnxruntime's ``quantize_dynamic`` stores
    them (per tensor; the activations in uint8, quantized while running)."""

    weight_type: Literal["int8", "uint8"] = Field(
        "int8",
        description="The quantized weights' type, quantize_dynamic's weight_type: int8 "
                    "(symmetric, zero point 0) or uint8 (with a zero point).")
def _regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
    return value


# the block sizes onnxruntime's quantization kernels (MlasQuantizeBlockwise) take
BLOCK_SIZES = (16, 32, 64, 128, 256)


class QuantizeWeightsParams(PassParams):
    """``quantize-weights``: MatMul weights to com.microsoft MatMulNBits, quantized block by
    block with onnxruntime's round-to-nearest kernels, as its ``MatMulNBitsQuantizer``
    does with the same settings (the defaults are that quantizer's)."""

    bits: Literal[4, 8] = Field(4, description="Bits per quantized weight: 4 or 8.")
    block_size: int = Field(
        128, ge=BLOCK_SIZES[0], le=BLOCK_SIZES[-1],
        description="Weights per quantization block along K: 16, 32, 64, 128 or 256 (a "
                    "power of two; onnxruntime's quantization kernels take no other).")
    symmetric: bool = Field(
        False, description="true: symmetric blocks without zero points; false: asymmetric "
                           "blocks, each with its zero point.")
    accuracy_level: int = Field(
        0, ge=0, le=4,
        description="MatMulNBits' accuracy_level (0: the attribute is omitted; 1 fp32, "
                    "2 fp16, 3 bf16, 4 int8 compute).")
    nodes: str | None = Field(
        None, description="Regular expression (searched) a MatMul node's name must match to "
                          "be quantized; default: every MatMul.")
    exclude: str | None = Field(
        None, description="Regular expression (searched): MatMul nodes whose names match "
                          "stay as they are.")
    min_elements: int = Field(
        0, ge=0, description="Weights with fewer elements stay as they are.")

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("block_size must be a power of two")
        return value

    @field_validator("nodes", "exclude")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return _regex(value)


# every pass a recipe may name -> the model of its parameters
PASS_PARAMS: dict[str, type[PassParams]] = {
    "fuse-qkv": PassParams,
    "cast-fp16": CastFP16Params,
    "gemm-transpose-b": PassParams,
    "fold-batchnorm": PassParams,
    "fold-constant-if": PassParams,
    "cleanup": PassParams,
    "quantize-dynamic": QuantizeDynamicParams,
    "quantize-weights": QuantizeWeightsParams,
}

PassStep = tuple[str, dict[str, Any]]  # a pass's name and its canonical parameters


def takes_parameters(name: str) -> bool:
    return bool(PASS_PARAMS[name].model_fields)


def validate_params(name: str, params: Mapping[str, Any] | None = None) -> PassParams:
    """The validated parameters of pass ``name``; a bad name, key or value is one
    :class:`ScenarioError` naming the pass and the parameter."""
    if name not in PASS_PARAMS:
        raise ScenarioError("unknown pass", name=name, known=", ".join(PASS_PARAMS))
    try:
        return PASS_PARAMS[name].model_validate(dict(params or {}))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown parameter"
        raise ScenarioError(f"bad parameter of pass '{name}': {message}", parameter=where,
                            known=", ".join(PASS_PARAMS[name].model_fields) or "none",
                            ) from None


def step(name: str, params: Mapping[str, Any] | None = None) -> PassStep:
    """``(name, canonical parameters)``: every parameter, defaults filled, as JSON values."""
    return name, validate_params(name, params).model_dump(mode="json")


def canonical(name: str, params: Mapping[str, Any] | None = None) -> str | dict[str, Any]:
    """The pass as a scenario's digest and records hold it: the bare name for a pass
    without parameters, else ``{"name": ..., <every parameter>}``."""
    name, values = step(name, params)
    return {"name": name, **values} if takes_parameters(name) else name


def canonical_text(steps: list[str | dict[str, Any]]) -> str:
    """Canonical passes as sorted, compact JSON (what a scenario record stores)."""
    return json.dumps(steps, sort_keys=True, separators=(",", ":"))


def parse_step(item: str | Mapping[str, Any]) -> PassStep:
    """A bare name or ``{name, <parameters>}`` (a recipe's form) as a step."""
    if isinstance(item, str):
        return step(item)
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise ScenarioError("a pass is a name or a mapping with its name and parameters",
                            value=repr(item)[:60])
    params = dict(item)
    return step(params.pop("name"), params)
