"""A script that runs itself in a throwaway virtual environment of pinned packages.

``tools/make_tiny_llm.py`` and ``tools/make_tiny_export.py`` need torch and transformers,
which the project does not install. :func:`main` parses ``--out`` and ``--venv``; without
``--inside`` it creates the environment (``python -m venv``; a temporary folder removed at
the end, unless ``--venv`` names one to create or reuse), installs the pins into it and
runs the script again there with ``--inside``, which calls the script's own function.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def outside(script: str, pins: Sequence[str], args: argparse.Namespace, prefix: str) -> int:
    """Create (or reuse) the environment, then run ``script --inside`` in it."""
    venv = Path(args.venv) if args.venv else Path(tempfile.mkdtemp(prefix=prefix))
    python = venv / "bin" / "python"
    try:
        if not python.exists():
            run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", *pins])
        run([str(python), str(Path(script).resolve()), "--inside", "--out", str(args.out)])
    finally:
        if not args.venv:
            shutil.rmtree(venv, ignore_errors=True)
    return 0


def main(script: str, doc: str, default_out: Path, pins: Sequence[str],
         inside: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=str(default_out), help="output folder")
    parser.add_argument("--venv", help="the environment to create or reuse (kept)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.inside:
        return inside(args)
    return outside(script, pins, args, prefix=f"{Path(script).stem}-venv-")
