"""Real models from ../shared/corpus, when that folder is present (skipped otherwise)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from weightstore.convert import convert_to_external, convert_to_inline

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
MODELS = sorted(CORPUS.glob("*.onnx")) if CORPUS.is_dir() else []

pytestmark = pytest.mark.skipif(not MODELS, reason="no ../shared/corpus beside the repo")


@pytest.mark.parametrize("form", ["external-data", "file-constant"])
@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_corpus_round_trip(model, form, tmp_path):
    out = tmp_path / "out.onnx"
    report = convert_to_external(model, out, form=form, threshold=0)
    assert report.external_tensors > 0
    onnx.checker.check_model(str(out), full_check=True)
    if form == "external-data":
        import onnxruntime as ort

        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    original = onnx.load(str(model)).SerializeToString(deterministic=True)
    assert back.read_bytes() == original
