"""The committed onnxruntime-genai test data (``examples/tiny_llm``) and greedy generation.

``tools/make_tiny_llm.py`` made the folders with onnxruntime-genai's own builder and
recorded, in the builder's environment, the token ids each export generates greedily
(``expected_tokens.json``). :func:`generate` runs a folder the same way with the installed
onnxruntime-genai, so a test compares any folder (a package, a pull, an unpacked release)
against what the builder's own export generates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai (the genai extra) runs the runtime folders")

TINY_LLM = Path(__file__).resolve().parents[1] / "examples" / "tiny_llm"
EXPECTED = json.loads((TINY_LLM / "expected_tokens.json").read_text(encoding="utf-8"))
PRECISIONS = ("fp32", "int4")


def generate(folder: Path) -> tuple[list[int], list[int]]:
    """The prompt's token ids and the new ones a greedy generator writes from ``folder``."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    prompt_ids = [int(t) for t in tokenizer.encode(EXPECTED["prompt"])]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False,
                              max_length=len(prompt_ids) + EXPECTED["new_tokens"])
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt_ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)]
    return prompt_ids, tokens[len(prompt_ids):]


def assert_generates_as_builder(folder: Path, precision: str = "fp32") -> None:
    """``folder`` generates token for token what the builder's ``precision`` export does."""
    prompt_ids, new_ids = generate(folder)
    assert prompt_ids == EXPECTED["prompt_ids"]
    assert new_ids == EXPECTED[precision]["new_ids"]
