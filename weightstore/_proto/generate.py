"""Regenerate ``weightstore_pb2.py`` from ``schemas/weightstore.proto``.

Usage: ``python -m weightstore._proto.generate [OUT_DIR]`` (default: this package).

The schema imports ``onnx/onnx-ml.proto`` from the installed onnx wheel, so the generated
module imports ``onnx.onnx_ml_pb2`` and its messages embed onnx's own classes. protoc is
the one bundled with grpcio-tools; its version is pinned because it is written into the
generated file (header and runtime version guard), and a different protoc would make the
committed file drift without any change to the schema.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from ..errors import WeightstoreError

# libprotoc 35.1 is bundled by grpcio-tools 1.83 to 1.85 and emits gencode 7.35.1, which
# requires a protobuf runtime >= 7.35.1 and < 8.
PROTOC_VERSION = "35.1"
PACKAGE_DIR = Path(__file__).resolve().parent
SCHEMA = PACKAGE_DIR.parents[1] / "schemas" / "weightstore.proto"
OUTPUT = "weightstore_pb2.py"
# The schema is compiled under the module's own path, so the generated classes know their
# real module (``weightstore._proto.weightstore_pb2``) and pickle.
VIRTUAL_DIR = "weightstore/_proto"


def onnx_include_dir() -> Path:
    """The folder holding ``onnx/onnx-ml.proto`` (onnx's wheel ships the .proto files)."""
    root = Path(onnx.__file__).resolve().parent.parent
    if not (root / "onnx" / "onnx-ml.proto").is_file():
        raise WeightstoreError("the installed onnx does not ship onnx/onnx-ml.proto",
                               folder=str(root))
    return root


def _protoc(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *args],
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        raise WeightstoreError(f"cannot run protoc: {exc}") from None


def protoc_version() -> str:
    """The bundled protoc's version, e.g. ``"35.1"``."""
    done = _protoc("--version")
    if done.returncode != 0:
        raise WeightstoreError("protoc is not available: install grpcio-tools "
                               "(pip install -e '.[test]')", stderr=done.stderr.strip())
    return done.stdout.strip().removeprefix("libprotoc ").strip()


def regenerate(out_dir: str | Path = PACKAGE_DIR) -> Path:
    """Write ``weightstore_pb2.py`` into ``out_dir`` and return its path."""
    if not SCHEMA.is_file():
        raise WeightstoreError("schema not found: run from a source checkout",
                               file=str(SCHEMA))
    found = protoc_version()
    if found != PROTOC_VERSION:
        raise WeightstoreError(f"the generated code is pinned to libprotoc {PROTOC_VERSION} "
                               f"(grpcio-tools 1.83 to 1.85); found libprotoc {found}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".protoc.", dir=out) as tmp:
        done = _protoc(f"-I{VIRTUAL_DIR}={SCHEMA.parent}", f"-I{onnx_include_dir()}",
                       f"--python_out={tmp}", f"{VIRTUAL_DIR}/{SCHEMA.name}")
        if done.returncode != 0:
            raise WeightstoreError("protoc failed", file=str(SCHEMA),
                                   stderr=done.stderr.strip())
        os.replace(Path(tmp, VIRTUAL_DIR, OUTPUT), out / OUTPUT)  # same file system
    return out / OUTPUT


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = regenerate(*args[:1])
    except WeightstoreError as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
