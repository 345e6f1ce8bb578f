"""Write the tiny BERT-like example model (about 1.3 MB).

Usage: python examples/tiny_bert/generate.py [--output PATH] [--seed N] [--finetuned]

``--finetuned`` writes its fine-tuned sibling instead (``finetuned.onnx``): the last layer
and the pooler retrained, every other weight byte-identical to ``model.onnx``.

The output is deterministic: the same seed always gives the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE.parents[1]))  # the generators live in the checkout's tests/
from tests.samples import make_encoder  # noqa: E402

CONFIG = {"vocab": 2000, "hidden": 64, "heads": 4, "layers": 4, "ffn": 256, "max_seq": 64}
RETRAINED = ("encoder.layer.3.", "pooler.")


def main(argv: list[str] | None = None) -> int:
    """Generate the model and save it as a single self-contained file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--finetuned", action="store_true",
                        help="the sibling sharing all but the last layer and the pooler")
    args = parser.parse_args(argv)
    if args.finetuned:
        model = make_encoder(**CONFIG, seed=args.seed, name="tiny-bert-finetuned",
                             retrained=RETRAINED)
    else:
        model = make_encoder(**CONFIG, seed=args.seed, name="tiny-bert")
    if args.output is None:
        args.output = HERE / ("finetuned.onnx" if args.finetuned else "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(model.SerializeToString())
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
