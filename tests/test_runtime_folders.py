"""A runtime folder packaged as it is: onnxruntime-genai's builder output (``model.onnx``
beside ``genai_config.json`` and the tokenizer) built into a package whose model keeps the
file name the runtime opens and whose companion files are the builder's. The real
runtime, ``onnxruntime_genai.Model(folder)``, then generates token for token what the
builder's own folder generates, from the package folder, from a generic client's pull
(oras-py), from ``weightstore pull`` (the whole package, and a device's folder) and from
an unpacked release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightstore.cli import main

from .helpers import file_tree
from .registry_server import needs_registry, running_registry
from .tiny_llm import TINY_LLM, assert_generates_as_builder

COMPANIONS = ("genai_config.json", "tokenizer.json", "tokenizer_config.json")
LAYOUTS = ("separate", "combined")

RECIPE = """\
package: tiny-llm
version: "1.0.0"
store: {{path: {store}}}
files:
{files}
models:
  - {{name: decoder, source: {source}/model.onnx, file: model.onnx}}
layouts:
  - {{name: separate, external_weight: separate}}
  - {{name: combined, external_weight: combined}}
devices:
  - {{name: cpu}}
output: {out}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The builder's fp32 folder built by a recipe, each layout's package folder."""
    root = tmp_path_factory.mktemp("runtime")
    source = TINY_LLM / "fp32"
    recipe = root / "tiny-llm.yaml"
    recipe.write_text(RECIPE.format(
        store=root / "store", source=source, out=root / "out",
        files="\n".join(f"  - source: {source / name}" for name in COMPANIONS)))
    assert main(["build", str(recipe), "--jobs", "2"]) == 0
    version = root / "out" / "tiny-llm" / "1.0.0"
    return {"root": root, "recipe": recipe, "store": root / "store",
            **{layout: version / layout for layout in LAYOUTS}}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_package_folder_is_the_builders_runtime_folder(built, layout) -> None:
    package = built[layout]
    tree = file_tree(package)
    for name in COMPANIONS:  # the builder's own bytes, at the package root
        assert tree[name] == (TINY_LLM / "fp32" / name).read_bytes(), name
    summary = json.loads(tree["summary.json"])
    assert [c["path"] for c in summary["companions"]] == sorted(COMPANIONS)
    assert "model.onnx" in tree and "decoder.onnx" not in tree
    assert main(["verify", str(package)]) == 0
    assert_generates_as_builder(package)


@needs_registry
def test_pulls_generate_as_the_builders_folder(built, tmp_path) -> None:
    """A generic client (oras-py) pulls the separate layout, whose every file is a whole
    layer, into a fresh folder; ``weightstore pull`` into a fresh folder with a fresh
    store. Both are the package, byte for byte, and run as the builder's folder; so does
    the cpu device's folder that ``weightstore pull --device`` writes."""
    from oras.client import OrasClient

    package = built["separate"]
    with running_registry(tmp_path / "registry") as server:
        ref = f"{server.host}/tiny-llm:1.0.0"
        assert main(["push", str(package), ref, "--store", str(built["store"])]) == 0
        OrasClient(hostname=server.host, insecure=True).pull(
            target=ref, outdir=str(tmp_path / "oras"))
        assert main(["pull", ref, str(tmp_path / "pulled"),
                     "--store", str(tmp_path / "fresh-store")]) == 0
        assert main(["pull", ref, str(tmp_path / "device"), "--device", "cpu",
                     "--store", str(tmp_path / "device-store")]) == 0
    assert file_tree(tmp_path / "oras") == file_tree(package)
    assert_generates_as_builder(tmp_path / "oras")
    assert file_tree(tmp_path / "pulled") == file_tree(package)
    assert main(["verify", str(tmp_path / "pulled")]) == 0
    assert_generates_as_builder(tmp_path / "pulled")
    device = file_tree(tmp_path / "device")
    for name in COMPANIONS:
        assert device[name] == (TINY_LLM / "fp32" / name).read_bytes(), name
    assert_generates_as_builder(tmp_path / "device")


def test_unpacked_release_generates_as_the_builders_folder(built, tmp_path) -> None:
    release = tmp_path / "release"
    assert main(["release", str(built["combined"]), "--output", str(release),
                 "--store", str(built["store"])]) == 0
    archive = release / "tiny-llm-1.0.0-combined.tar.zst"
    assert main(["unpack", str(archive), str(tmp_path / "unpacked")]) == 0
    unpacked = tmp_path / "unpacked"
    assert file_tree(unpacked) == file_tree(built["combined"])
    assert_generates_as_builder(unpacked)
