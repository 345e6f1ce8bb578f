"""The committed builder output runs in the installed onnxruntime-genai as it ran where
it was built: the same tokenizer ids and the same greedy tokens, fp32 and int4."""

from __future__ import annotations

import json

import pytest

from tests.tiny_llm import EXPECTED, PRECISIONS, TINY_LLM, assert_generates_as_builder, og


@pytest.mark.parametrize("precision", PRECISIONS)
def test_builder_folder_generates_the_recorded_tokens(precision):
    assert_generates_as_builder(TINY_LLM / precision, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_builder_folder_is_a_greedy_runtime_folder(precision):
    folder = TINY_LLM / precision
    config = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
    assert config["search"]["do_sample"] is False
    model_file = folder / config["model"]["decoder"]["filename"]
    assert model_file.is_file() and (folder / f"{model_file.name}.data").is_file()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}


def test_tokenizer_round_trips_the_prompt():
    tokenizer = og.Tokenizer(og.Model(str(TINY_LLM / "fp32")))
    assert tokenizer.decode(EXPECTED["prompt_ids"]) == EXPECTED["prompt"]


def test_int4_export_differs_from_fp32():
    """The two exports are different models (the int4 one is MatMulNBits, smaller), so a
    folder mixing them up is caught by the token comparison."""
    assert EXPECTED["int4"]["new_ids"] != EXPECTED["fp32"]["new_ids"]
    size = {p: (TINY_LLM / p / "model.onnx.data").stat().st_size for p in PRECISIONS}
    assert size["int4"] < size["fp32"] / 2


def test_committed_data_is_small():
    total = sum(p.stat().st_size for p in TINY_LLM.rglob("*") if p.is_file())
    assert total < 512 * 1024, total
