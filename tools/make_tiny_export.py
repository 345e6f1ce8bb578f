"""Make ``examples/tiny_bert_export``: ``torch.onnx.export`` run on a tiny random BERT.

Usage: ``python tools/make_tiny_export.py [--out DIR] [--venv DIR]``
(default ``--out``: ``examples/tiny_bert_export`` of this checkout).

The exporter needs torch and transformers, which the project does not install. Like
``tools/make_tiny_llm.py``, this script creates a virtual environment of its own (a
temporary folder removed at the end, unless ``--venv`` names one to create or reuse),
installs the pinned versions below into it and runs the rest of itself there:

1. a ``BertModel`` of random weights is made from a tiny config (``transformers``, seed
   :data:`SEED`, ``torch.manual_seed`` on CPU);
2. ``torch.onnx.export`` writes it the way a user does: the exporter's default (in torch
   2.13 the ``torch.export``-based one, ``dynamo=True``), dynamic batch and sequence axes,
   the weights where the exporter puts them (``model.onnx.data``, its external data file);
3. the exporter annotates each node with the Python stack that made it
   (``pkg.torch.onnx.stack_trace``), file names under the environment's
   ``site-packages`` folder: that folder is written ``<site-packages>`` instead, the one
   change made to the export, so the files name no machine's path and a rerun from any
   environment gives the same bytes;
4. the script counts the export's nodes, Constant nodes and initializers for the README.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pinned_env

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "examples" / "tiny_bert_export"

# torch's CPU build (no CUDA libraries); onnxscript is what the default exporter translates with.
PINS = (
    "torch==2.13.0",
    "transformers==5.25.0",
    "onnxscript==0.7.2",
    "onnx==1.23.2",
    "onnx-ir==1.1.0",
    "numpy==2.4.6",
)

SEED = 20261207
CONFIG = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
}
INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("last_hidden_state", "pooler_output")


def export(path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    model = BertModel(BertConfig(**CONFIG)).eval()
    input_ids = torch.randint(0, CONFIG["vocab_size"], (2, 8))
    attention_mask = torch.ones(2, 8, dtype=torch.int64)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(model, (input_ids, attention_mask), str(path),
                      input_names=list(INPUTS), output_names=list(OUTPUTS),
                      dynamic_shapes={"input_ids": axes, "attention_mask": axes})


def without_site_packages(path: Path) -> None:
    """``<site-packages>`` for the environment's folder in the nodes' stack traces."""
    import sysconfig

    import onnx

    folder = sysconfig.get_paths()["purelib"]
    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        for entry in node.metadata_props:
            entry.value = entry.value.replace(folder, "<site-packages>")
    onnx.save(model, str(path))


def shapes(path: Path) -> dict:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    ops = collections.Counter(node.op_type for node in graph.node)
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    return {
        "nodes": len(graph.node), "constant_nodes": ops.get("Constant", 0),
        "initializers": len(graph.initializer), "external_initializers": len(external),
        "ops": dict(sorted(ops.items())),
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "inputs": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                   for i in graph.input},
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {pin.split("==")[0]: version(pin.split("==")[0]) for pin in PINS}


def readme(facts: dict, sizes: dict[str, int]) -> str:
    pins = "\n".join(f"- {name} {v}" for name, v in facts["versions"].items())
    files = "\n".join(f"- `{name}`: {size} bytes" for name, size in sorted(sizes.items()))
    ops = textwrap.fill(", ".join(f"{op} {n}" for op, n in facts["ops"].items()), width=86,
                        initial_indent="- ops: ", subsequent_indent="  ")
    config = textwrap.fill(
        "- The model: transformers' `BertModel` from a `BertConfig` with "
        + ", ".join(f"`{k}` {v}" for k, v in CONFIG.items()) + " (the other fields "
        f"transformers' defaults), weights drawn with `torch.manual_seed({SEED})` on CPU, "
        "in eval mode.", width=88, subsequent_indent="  ")
    counts = (f"{facts['nodes']} nodes, {facts['constant_nodes']} Constant nodes, "
              f"{facts['initializers']} initializers ({facts['external_initializers']} of "
              "them in `model.onnx.data`)")
    opset = ", ".join(f"{domain} {v}" for domain, v in facts["opset"].items())
    inputs = ", ".join(f"`{name}` [{', '.join(map(str, dims))}]"
                       for name, dims in facts["inputs"].items())
    return f"""\
# tiny_bert_export: `torch.onnx.export` of a tiny random BERT

Test data: a transformer as a real exporter writes it, not built by hand. Made by
`python tools/make_tiny_export.py`, which states every step. Its weights are random.

{config}
- The export: `torch.onnx.export(model, (input_ids, attention_mask), "model.onnx",
  input_names=["input_ids", "attention_mask"],
  output_names=["last_hidden_state", "pooler_output"],
  dynamic_shapes={{"input_ids": {{0: "batch", 1: "sequence"}}, "attention_mask": {{0: "batch",
  1: "sequence"}}}})`, sample inputs of batch 2 and sequence 8. This is the exporter's
  default in torch 2.13 (`dynamo=True`, the `torch.export`-based exporter with its ONNX
  optimizer); it succeeded, so the legacy TorchScript exporter (`dynamo=False`) was not used.
  The files are as the exporter wrote them, `model.onnx` and its external data
  `model.onnx.data`, but for one change to annotations: in the stack trace the exporter
  records on each node (`pkg.torch.onnx.stack_trace`), the environment's `site-packages`
  folder is written `<site-packages>`, so the file names no machine's path.

## The export's shapes

- opset {opset}; inputs {inputs}
- {counts}
{ops}

What a hand-built graph does not have, and this one has: the exporter's optimizer folds
each `nn.Linear`'s transposed weight into a new initializer with a generated name
(`val_92`, ...) instead of the checkpoint's name; the attention's shape logic (Shape,
Slice, Concat, Reshape, Expand) runs around the MatMuls; the query/key product and the
attention-weights product are MatMuls of two activations (no weight); the pooler is a
Gemm with `transB=1` on the checkpoint's named weight. In this torch version the
exporter puts no weight in a Constant node (all weights are initializers).

The quantization tests compare the passes against onnxruntime's quantizers on it:
`MatMulNBitsQuantizer` quantizes the 12 weight MatMuls (six a layer) and leaves the Gemm
pooler float; `quantize_dynamic` quantizes the Gemm too, even when asked for MatMul only
(it rewrites it as a MatMul of the transposed weight first).

Made in a fresh virtual environment with:

{pins}

## Reproducing

`python tools/make_tiny_export.py` (torch's CPU wheel and transformers into a temporary
environment; `--venv DIR` keeps it for another run). With the pinned versions a rerun is
byte-identical, every file (two runs, in environments at different paths, were
compared). Other versions of torch, onnxscript or transformers may name, order or fold
nodes differently and draw other weights: a rerun with them gives other, equally valid
test data.

## Files

{files}
"""


def inside(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory(prefix="tiny-export-") as tmp:
        built = Path(tmp) / "model.onnx"
        export(built)
        without_site_packages(built)
        facts = shapes(built)
        facts["versions"] = versions()
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for path in sorted(Path(tmp).iterdir()):
            shutil.copy2(path, out / path.name)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    (out / "README.md").write_text(readme(facts, sizes), encoding="utf-8")
    print(json.dumps(facts, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return pinned_env.main(__file__, __doc__, DEFAULT_OUT, PINS, inside, argv)


if __name__ == "__main__":
    raise SystemExit(main())
