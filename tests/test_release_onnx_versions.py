"""Releases made under two onnx versions: the same archives, ``SHA256SUMS`` and, but for the
tool versions it records, the same ``release.json``.

The other interpreter comes from ``$WEIGHTSTORE_OTHER_PYTHON`` (CI: a venv with every
runtime dependency at its declared floor); it runs this checkout's source through
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.release_helpers import make_checkout, released_files
from weightstore.packaging.diff import first_member_difference

REPO = Path(__file__).resolve().parents[1]
ENV_VAR = "WEIGHTSTORE_OTHER_PYTHON"
# The only fields of release.json allowed to differ: predicate.runDetails.builder.version.<key>
TOOL_VERSION_FIELDS = ("onnx", "protobuf", "numpy", "zstandard", "blake3", "python")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WEIGHTSTORE_DIR", None)
    return env


def _tool_versions(python: str) -> dict[str, str]:
    code = ("import json; from weightstore.release.provenance import tool_versions; "
            "print(json.dumps(tool_versions()))")
    done = subprocess.run([python, "-c", code], env=_env(), check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def other_python() -> tuple[str, dict[str, str]]:
    python = os.environ.get(ENV_VAR)
    if not python:
        pytest.skip(f"${ENV_VAR} names no other interpreter (CI sets it to a venv with "
                    "every runtime dependency at its floor)")
    theirs, ours = _tool_versions(python), _tool_versions(sys.executable)
    if theirs["onnx"] == ours["onnx"]:
        pytest.skip(f"${ENV_VAR} ({python}) has the same onnx as this one ({ours['onnx']})")
    return python, theirs


def _release(python: str, checkout: Path) -> dict[str, bytes]:
    done = subprocess.run([python, "-m", "weightstore", "release", "recipe.yaml", "--jobs", "2"],
                          cwd=checkout, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return released_files(checkout)


def _without_tool_versions(doc: dict[str, Any], expected: dict[str, str]) -> dict[str, Any]:
    versions = doc["predicate"]["runDetails"]["builder"]["version"]
    for key in TOOL_VERSION_FIELDS:
        assert versions.pop(key) == expected[key]  # what that interpreter has, nothing else
    return doc


def test_release_is_the_same_under_another_onnx(encoder_model, tmp_path, other_python):
    python, theirs = other_python
    ours = _tool_versions(sys.executable)
    make_checkout(tmp_path / "a", encoder_model)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same model bytes; a store each
    mine, other = _release(sys.executable, tmp_path / "a"), _release(python, tmp_path / "b")
    assert sorted(mine) == sorted(other)
    for name in mine:
        if name.endswith(".tar.zst"):
            assert mine[name] == other[name], (
                f"{name} ({ours['onnx']} vs {theirs['onnx']}): " + first_member_difference(
                    tmp_path / "a/out/releases/pkg-1.0.0" / name,
                    tmp_path / "b/out/releases/pkg-1.0.0" / name))
    assert mine["SHA256SUMS"] == other["SHA256SUMS"]
    docs = json.loads(mine["release.json"]), json.loads(other["release.json"])
    assert _without_tool_versions(docs[0], ours) == _without_tool_versions(docs[1], theirs)
