"""Make ``examples/tiny_llm``: onnxruntime-genai's builder run on a tiny random Llama.

Usage: ``python tools/make_tiny_llm.py [--out DIR] [--venv DIR]``
(default ``--out``: ``examples/tiny_llm`` of this checkout).

The builder needs torch and transformers, which the project does not install. This script
creates a virtual environment of its own (``python -m venv``; a temporary folder removed at
the end, unless ``--venv`` names one to create or reuse), installs the pinned versions below
into it and runs the rest of itself there:

1. a byte-level BPE tokenizer is trained offline (``tokenizers``) on the text below;
2. a Llama checkpoint of random weights is made from a config (``transformers``, seed
   :data:`SEED`) and saved with the tokenizer as a Hugging Face folder (``hf/``);
3. onnxruntime-genai's own builder exports it twice, ``-p fp32 -e cpu`` (``fp32/``) and
   ``-p int4 -e cpu`` (``int4/``), greedy search (``do_sample: false``) in its
   ``genai_config.json``;
4. both exports generate :data:`NEW_TOKENS` tokens greedily from :data:`PROMPT` with
   onnxruntime-genai in that environment; the token ids go to ``expected_tokens.json``,
   which the tests compare against the committed folders run by the installed runtime.

The committed ``hf/`` folder holds the checkpoint's config and tokenizer, not its weights
(the seed and the pinned torch make them again).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pinned_env
from pinned_env import run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "examples" / "tiny_llm"

# The environment the builder runs in. torch's CPU build is the one wanted (no CUDA
# libraries); pip takes the newest 2.13.0 build it finds, ``+cpu`` where one is offered.
PINS = (
    "torch==2.13.0",
    "transformers==5.25.0",
    "tokenizers==0.23.3",
    "onnxruntime==1.32.0",
    "onnxruntime-genai==0.18.0",
    "onnx==1.23.2",
    "onnx-ir==1.1.0",
    "numpy==2.4.6",
    "safetensors==0.8.0",
)

SEED = 20261207
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,  # int4: onnxruntime's default block size (32) divides it
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head size 16: GroupQueryAttention wants a multiple of 16
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    # wider than the usual 0.02, so that a random model's greedy choice is clear-cut
    # (each step's best logit well above the second) and the same on every CPU kernel
    "initializer_range": 0.5,
    "torch_dtype": "float32",
}
VOCAB_SIZE = 320  # 256 bytes, 3 special tokens, 61 merges
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
PROMPT = "The small model reads"
NEW_TOKENS = 12
# Each greedy step's best logit must beat the second by this much, far above the rounding
# differences between onnxruntime's CPU kernels (about 1e-5 here), so every runtime picks
# the same tokens.
MIN_MARGIN = 0.01

# The tokenizer's training text: a short public-domain passage (the opening of the
# Apache License's definitions would do as well; any text gives a working tokenizer).
TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox
reads a small book about models. A model reads the text, one token at a time, and writes
the next token it thinks will come. Small models are quick to build and quick to test;
they say nothing wise, but they say it the same way every time. The runtime loads the
model, the tokenizer turns the text into tokens, and the generator picks the token with
the highest score at every step. Every step reads what came before and writes what comes
next. The fox and the dog read the same book, and the book was about a quick brown model.
"""


def train_tokenizer(hf: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        clean_up_tokenization_spaces=False)
    fast.save_pretrained(hf)


def make_checkpoint(hf: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"), pad_token_id=None,
        **{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    model = LlamaForCausalLM(config).eval()
    model.generation_config.do_sample = False
    model.save_pretrained(hf, safe_serialization=True)


def build(hf: Path, out: Path, precision: str, cache: Path) -> None:
    run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
         "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache / precision)])
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config["search"].get("do_sample") is not False:
        config["search"]["do_sample"] = False
        config_path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")


def generate(folder: Path) -> dict:
    """Greedy generation with onnxruntime-genai, and each step's margin (best - second)."""
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    prompt_ids = [int(t) for t in tokenizer.encode(PROMPT)]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt_ids], dtype=np.int32))
    margins = []
    while not generator.is_done():
        logits = np.asarray(generator.get_output("logits"), dtype=np.float64)[0, -1]
        top = np.sort(logits)[-2:]
        margins.append(float(top[1] - top[0]))
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)]
    new = tokens[len(prompt_ids):]
    if len(new) != NEW_TOKENS:
        raise SystemExit(f"{folder.name}: {len(new)} new tokens (end of text?), not {NEW_TOKENS}")
    if min(margins) < MIN_MARGIN:
        raise SystemExit(f"{folder.name}: a step's best logit is within {min(margins)} of the "
                         "second: choose another seed or prompt")
    return {"prompt_ids": prompt_ids, "new_ids": new, "min_margin": round(min(margins), 4)}


def transformers_greedy(hf: Path, prompt_ids: list[int]) -> list[int]:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False)
    return [int(t) for t in out[0, len(prompt_ids):]]


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {pin.split("==")[0]: version(pin.split("==")[0]) for pin in PINS}


def readme(expected: dict, sizes: dict[str, int]) -> str:
    c = CONFIG
    model = textwrap.fill(
        f"The model: Llama, hidden size {c['hidden_size']}, intermediate size "
        f"{c['intermediate_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']} attention heads ({c['num_key_value_heads']} key/value "
        f"head), {c['max_position_embeddings']} positions, initializer range "
        f"{c['initializer_range']}, seed {SEED} (`torch.manual_seed`, CPU). Greedy search: "
        "`do_sample` is false in `genai_config.json`. `transformers_fp32` in "
        "`expected_tokens.json` is transformers' own greedy output of the checkpoint, which "
        "the fp32 export matches token for token.", width=88)
    pins = "\n".join(f"- {name} {v}" for name, v in expected["versions"].items())
    files = "\n".join(f"- `{name}`: {size} bytes" for name, size in sorted(sizes.items()))
    return f"""\
# tiny_llm: onnxruntime-genai's builder output for a tiny random Llama

Test data for runtime folders (model, external data, `genai_config.json`, tokenizer),
made by `python tools/make_tiny_llm.py`, which states every step. Its weights are random:
the model writes nonsense, the same nonsense every time.

- `hf/`: the Hugging Face checkpoint's `config.json`, `generation_config.json` and
  tokenizer files (no weights: seed {SEED} and the pinned torch make them again). The
  tokenizer is a byte-level BPE of {VOCAB_SIZE} tokens trained offline with `tokenizers`
  on the short text in the script.
- `fp32/`: `python -m onnxruntime_genai.models.builder -i hf -o fp32 -p fp32 -e cpu`
- `int4/`: `python -m onnxruntime_genai.models.builder -i hf -o int4 -p int4 -e cpu`
  (MatMulNBits, block size 32, the builder's defaults)
- `expected_tokens.json`: the token ids each export generates greedily
  ({NEW_TOKENS} new tokens after the prompt {PROMPT!r}), run with onnxruntime-genai in the
  builder's environment right after building; `min_margin` is the smallest gap between the
  best and the second logit over the steps, so a runtime whose kernels round differently
  still picks the same tokens. `tests/test_tiny_llm.py` checks that the committed folders,
  run by the installed onnxruntime-genai, generate exactly these ids.

{model}

Made in a fresh virtual environment with:

{pins}

## Reproducing

`python tools/make_tiny_llm.py` (a few hundred MB of wheels into a temporary environment;
`--venv DIR` keeps it for another run). With the pinned versions a rerun is
byte-identical, every file (two runs, each in a fresh environment, were compared):
the tokenizer's training, the seeded weights, the builder's graphs and external data and
the greedy tokens are all deterministic on CPU. What is not guaranteed is the same bytes
from other versions: another builder may name, order or fuse nodes and lay out
initializers differently, and torch's random generator may draw other weights in
another release. A rerun with other versions gives other, equally valid test data;
commit it together with its `expected_tokens.json`, which the script writes from it.

## Files

{files}
"""


def inside(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory(prefix="tiny-llm-") as tmp:
        work = Path(tmp)
        hf = work / "hf"
        train_tokenizer(hf)
        make_checkpoint(hf)
        built = work / "out"
        for precision in ("fp32", "int4"):
            build(hf, built / precision, precision, work / "cache")
        expected = {"prompt": PROMPT, "new_tokens": NEW_TOKENS}
        for precision in ("fp32", "int4"):
            result = generate(built / precision)
            expected.setdefault("prompt_ids", result.pop("prompt_ids"))
            expected[precision] = result
        expected["transformers_fp32"] = transformers_greedy(hf, expected["prompt_ids"])
        expected["versions"] = versions()
        if expected["transformers_fp32"] != expected["fp32"]["new_ids"]:
            raise SystemExit("transformers' greedy tokens differ from the fp32 export's")

        for name in ("hf", "fp32", "int4"):
            shutil.rmtree(out / name, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(hf, out / "hf", ignore=shutil.ignore_patterns("*.safetensors"))
        for precision in ("fp32", "int4"):
            shutil.copytree(built / precision, out / precision)
        (out / "expected_tokens.json").write_text(
            json.dumps(expected, indent=2) + "\n", encoding="utf-8")
        sizes = {str(p.relative_to(out)): p.stat().st_size
                 for p in sorted(out.rglob("*")) if p.is_file() and p.name != "README.md"}
        (out / "README.md").write_text(readme(expected, sizes), encoding="utf-8")
    print(json.dumps(expected, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return pinned_env.main(__file__, __doc__, DEFAULT_OUT, PINS, inside, argv)


if __name__ == "__main__":
    raise SystemExit(main())
