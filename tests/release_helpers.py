"""Shared by the release tests: a small checkout (model + recipe) and hostile archives."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import onnx

RECIPE = """\
package: pkg
version: "1.0.0"
store: {{path: store, hash: {hash}}}
models:
  - {{name: encoder, source: models/encoder.onnx}}
layouts:
  - {{name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}}
  - {{name: separate, external_weight: separate, size_threshold: 1024}}
devices:
  - {{name: cpu, scenario: null}}
output: out
"""


def make_checkout(root: Path, model: onnx.ModelProto, hash_algo: str = "blake3") -> Path:
    """A recipe and its model under ``root``; returns the recipe path."""
    (root / "models").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(root / "models" / "encoder.onnx"))
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(hash=hash_algo))
    return recipe


def tar_zst(members: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """An archive made by hand, hostile members included (for unpack tests)."""
    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(buf.getvalue())


def entry(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE,
          **fields) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    if data is not None:
        info.size = len(data)
    for k, v in fields.items():
        setattr(info, k, v)
    return info, data
