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


def test_committed_data_is_what_the_script_states(monkeypatch):
    """The folder was made by tools/make_tiny_llm.py as it stands: its prompt, token count
    and pinned versions, and the README it writes lists every committed file."""
    import importlib.util

    tools = TINY_LLM.parents[1] / "tools"
    monkeypatch.syspath_prepend(str(tools))  # as `python tools/make_tiny_llm.py` has it
    path = tools / "make_tiny_llm.py"
    spec = importlib.util.spec_from_file_location("make_tiny_llm", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (EXPECTED["prompt"], EXPECTED["new_tokens"]) == (script.PROMPT, script.NEW_TOKENS)
    pins = dict(pin.split("==") for pin in script.PINS)
    assert {k: v.split("+")[0] for k, v in EXPECTED["versions"].items()} == pins
    assert all(EXPECTED[p]["min_margin"] >= script.MIN_MARGIN for p in PRECISIONS)
    readme = (TINY_LLM / "README.md").read_text(encoding="utf-8")
    for p in sorted(TINY_LLM.rglob("*")):
        if p.is_file() and p.name != "README.md":
            assert f"`{p.relative_to(TINY_LLM).as_posix()}`: {p.stat().st_size} bytes" in readme
