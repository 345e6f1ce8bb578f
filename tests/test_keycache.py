"""Payload keys of unchanged sources come from the cache; bad entries are never trusted."""

from __future__ import annotations

import json

import weightstore.convert.weights as weights_module
from weightstore.builder.run import BuildOptions, build
from weightstore.caches.payload_keys import FOLDER

from .test_build import tree, write_recipe

LAYOUT = "\n  - {name: l, external_weight: combined}\n"


def _count_hashing(monkeypatch) -> list:
    calls: list = []
    real = weights_module.ModelWeights.digest

    def counting(self, weight, algo):
        calls.append(weight)
        return real(self, weight, algo)

    monkeypatch.setattr(weights_module.ModelWeights, "digest", counting)
    return calls


def test_unchanged_source_is_not_rehashed(encoder_model, save_model, tmp_path, monkeypatch):
    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    store = tmp_path / "store"
    calls = _count_hashing(monkeypatch)
    build(recipe, BuildOptions(store=str(store), jobs=2))
    first = len(calls)
    assert first > 0 and list((store / FOLDER).iterdir())
    before = tree(tmp_path / "out")
    build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    assert len(calls) == first  # every key came from the cache
    assert tree(tmp_path / "out") == before


def test_wrong_cache_entries_are_ignored(encoder_model, save_model, tmp_path, monkeypatch):
    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    store = tmp_path / "store"
    build(recipe, BuildOptions(store=str(store), jobs=2))
    before = tree(tmp_path / "out")
    entry = next((store / FOLDER).iterdir())
    doc = json.loads(entry.read_text())
    keys = doc["keys"]
    paths = sorted(keys)
    sizes = {}
    for w in json.loads((tmp_path / "out/pkg/1.0.0/l/summary.json").read_text())[
            "models"][0]["external_weights"]:
        sizes[w["id"]] = w["size"]
    # point every entry at an object of another size, and one at an unknown key
    by_size = sorted(set(keys.values()), key=lambda k: sizes[k])
    for p in paths:
        keys[p] = next(k for k in by_size if sizes[k] != sizes[keys[p]])
    keys[paths[0]] = "blake3:" + "0" * 64
    entry.write_text(json.dumps(doc))
    calls = _count_hashing(monkeypatch)
    build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    assert len(calls) == len(paths)  # everything re-hashed
    assert tree(tmp_path / "out") == before
    entry.write_text("{broken")
    build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    assert tree(tmp_path / "out") == before
