"""Derived weights computed by several threads: a build quantizes its weights with
``--jobs`` threads (onnxruntime's kernels and the hashes run without the interpreter
lock). Each weight's source is still read once and quantized once, however the threads
interleave, and the package is byte for byte the one a single thread builds."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.catalogue.descriptors import DerivedWeightRecipe
from weightstore.scenarios.derive import resolver

from .test_build import tree
from .test_quantize_weights import BERT, RECIPE, copy_model, kernel_calls  # noqa: F401

WEIGHTS = 12
ATTRIBUTES = (("bits", "4"), ("block_size", "32"), ("symmetric", "true"))


def _derivations() -> dict[str, DerivedWeightRecipe]:
    return {f"w{i}_{part}": DerivedWeightRecipe(f"matmul-nbits-{part}", (f"w{i}",), ATTRIBUTES)
            for i in range(WEIGHTS) for part in ("weight", "scales")}


def test_threads_read_and_quantize_each_weight_once(kernel_calls) -> None:  # noqa: F811
    rng = np.random.default_rng(5)
    base = {f"w{i}": rng.standard_normal((256, 192)).astype(np.float32)
            for i in range(WEIGHTS)}
    reads: list[str] = []

    def source_value(name: str) -> np.ndarray:
        reads.append(name)
        return base[name]

    expected = {name: resolver(_derivations(), base.__getitem__)(name).tobytes()
                for name in _derivations()}
    kernel_calls.clear()
    for round_ in range(5):  # threads asking for both parts of a weight at once
        reads.clear()
        kernel_calls.clear()
        value = resolver(_derivations(), source_value)
        names = [*_derivations()] * 3
        random.Random(round_).shuffle(names)
        with ThreadPoolExecutor(4) as pool:
            got = [array.tobytes() for array in pool.map(value, names)]
        assert got == [expected[name] for name in names]
        assert sorted(reads) == sorted(base)  # each source read once
        assert kernel_calls == [4] * WEIGHTS  # each weight quantized once


@pytest.mark.parametrize("jobs", [2, 4])
def test_a_threaded_build_is_the_single_threaded_one(tmp_path, kernel_calls,  # noqa: F811
                                                     jobs) -> None:
    source = copy_model(BERT, tmp_path / "src")
    trees = {}
    for n in (1, jobs):
        folder = tmp_path / f"jobs-{n}"
        folder.mkdir()
        recipe = folder / "recipe.yaml"
        recipe.write_text(RECIPE.format(source=source))
        kernel_calls.clear()
        build(recipe, BuildOptions(store=str(folder / "store"), jobs=n))
        assert kernel_calls == [4] * 25  # 25 weights, each quantized once
        trees[n] = tree(folder / "out")
    assert trees[1] == trees[jobs]
