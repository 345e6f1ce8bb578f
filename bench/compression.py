"""zstd settings for release archives, measured on weights: level x long-distance matching.

Usage: ``python bench/compression.py [--corpus DIR] [--synthetic-mb 64] [--runs 3] [--json]``

Data sets (weight bytes only, concatenated in model order):

* ``real fp32``: every distinct float tensor of the ``*.onnx`` models in ``--corpus``
  (default: the ``shared/corpus`` folder beside the checkout; skipped when absent), each
  once, as a package stores it;
* ``real fp16``: the same values cast to float16;
* ``real int8``: the same values quantized per tensor (symmetric, scale = max|x| / 127);
* ``synthetic fp32/fp16/int8``: ``--synthetic-mb`` MB of normal(0, 0.02) values, the
  distribution of freshly initialized weights (less regular than trained ones), in the
  three types (``--synthetic-mb 0``: none).

For levels 1, 3, 9 and 19, long-distance matching off and on (128 MiB window), and with
zstd 1.5.7's block pre-splitter as releases set it, at libzstd's default (0) and off (1),
the compression runs as ``weightstore release`` runs it (multi-threaded, one worker per
CPU, pinned job size, checksum and content size), in this process, timed alone with
``time.perf_counter``; medians of ``--runs`` runs (level 19: one run on synthetic data).
Figures: ratio (compressed / raw; lower is better), compression and decompression MB/s.
The machine may be shared: expect noise in the speeds, not in the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LEVELS = (1, 3, 9, 19)
# (long-distance matching, ZSTD_c_blockSplitterLevel): None is the release's own setting;
# 0 is libzstd's default pre-splitter, 1 none at all (zstd before 1.5.7)
SETTINGS = ((False, None), (False, 0), (False, 1), (True, None))


def real_weights(corpus: Path) -> bytes:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    parts: list[bytes] = []
    seen: set[bytes] = set()  # a package stores each payload once: so does this data set

    def walk(graph: onnx.GraphProto) -> None:
        tensors = list(graph.initializer)
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.TENSOR:
                    tensors.append(a.t)
        for t in tensors:
            if t.data_type == onnx.TensorProto.FLOAT:
                data = numpy_helper.to_array(t).astype(np.float32).tobytes()
                if data not in seen:
                    seen.add(data)
                    parts.append(data)

    for path in sorted(corpus.glob("*.onnx")):
        walk(onnx.load(str(path)).graph)
    return b"".join(parts)


def as_types(fp32: bytes, chunk: int = 1 << 20) -> dict[str, bytes]:
    """fp32 bytes -> fp32, fp16 and per-chunk symmetric int8 bytes."""
    import numpy as np

    x = np.frombuffer(fp32, dtype=np.float32)
    fp16 = x.astype(np.float16).tobytes()
    int8 = bytearray()
    for i in range(0, len(x), chunk):
        part = x[i:i + chunk]
        scale = float(np.abs(part).max()) / 127 or 1.0
        int8 += np.clip(np.round(part / scale), -127, 127).astype(np.int8).tobytes()
    return {"fp32": fp32, "fp16": fp16, "int8": bytes(int8)}


def synthetic(mb: int) -> bytes:
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal(mb * 250_000).astype(np.float32) * 0.02).tobytes()


def measure(data: bytes, level: int, ldm: bool, splitter: int | None, runs: int,
            ) -> dict[str, Any]:
    import zstandard

    from weightstore.release.compression import Compression
    from weightstore.release.zstd_frame import compress

    params = [(k, splitter if k == "blockSplitterLevel" and splitter is not None else v)
              for k, v in Compression(level, ldm).parameters(os.cpu_count() or 1)]
    comp, decomp, size = [], [], 0
    for _ in range(runs):
        t = time.perf_counter()
        out = compress(params, data)
        comp.append(time.perf_counter() - t)
        t = time.perf_counter()
        back = zstandard.ZstdDecompressor().decompress(out)
        decomp.append(time.perf_counter() - t)
        assert back == data
        size = len(out)
    mb = len(data) / 1e6
    splitter = dict(params)["blockSplitterLevel"]
    return {"level": level, "long": ldm, "splitter": splitter, "ratio": size / len(data),
            "compress_mb_s": mb / statistics.median(comp),
            "decompress_mb_s": mb / statistics.median(decomp)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    p.add_argument("--synthetic-mb", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sets: dict[str, bytes] = {}
    if args.corpus.is_dir() and any(args.corpus.glob("*.onnx")):
        sets.update({f"real {k}": v for k, v in as_types(real_weights(args.corpus)).items()})
    else:
        print(f"note: no models in {args.corpus}; real weights skipped", file=sys.stderr)
    if args.synthetic_mb > 0:
        sets.update({f"synthetic {k}": v
                     for k, v in as_types(synthetic(args.synthetic_mb)).items()})
    rows = []
    for name, data in sets.items():
        for level in LEVELS:
            for ldm, splitter in SETTINGS:
                runs = 1 if level == 19 and name.startswith("synthetic") else args.runs
                print(f"{name} level {level} long {ldm} pre-splitter {splitter} ...",
                      file=sys.stderr, flush=True)
                rows.append({"data": name, "bytes": len(data),
                             **measure(data, level, ldm, splitter, runs)})
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))
        return 0
    print(f"{os.cpu_count()} CPU(s); ratio = compressed / raw (lower is better)")
    print(f"{'data':<16}{'MB':>8}{'level':>6}{'long':>6}{'split':>6}{'ratio':>8}"
          f"{'comp MB/s':>11}{'dec MB/s':>10}")
    for r in rows:
        long = "on" if r["long"] else "off"
        print(f"{r['data']:<16}{r['bytes'] / 1e6:>8.1f}{r['level']:>6}{long:>6}"
              f"{r['splitter']:>6}"
              f"{r['ratio']:>8.4f}{r['compress_mb_s']:>11.0f}{r['decompress_mb_s']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
