"""Keys of scenario-derived weights: remembered for unchanged sources, believed only when
authentic (a MAC under the user's own secret)."""

from __future__ import annotations

import json

import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.caches.derived_keys import FOLDER

from .test_build import tree
from .test_many_models import count_derivations, write_many

SCENARIO = ", scenarios: [{name: half, passes: [cast-fp16, cleanup]}]}"
LAYOUT = "\n  - {name: c, external_weight: combined, combined: shared}\n"


@pytest.fixture
def computed(monkeypatch) -> list[str]:
    return count_derivations(monkeypatch)


@pytest.fixture
def built(tmp_path, computed):
    recipe = write_many(tmp_path, 2, LAYOUT, shared_weight=False)
    recipe.write_text(recipe.read_text().replace(".onnx}", ".onnx" + SCENARIO))
    build(recipe, BuildOptions(jobs=2))
    assert len(computed) == 4
    computed.clear()
    return recipe, tree(tmp_path / "out"), sorted((tmp_path / "store" / FOLDER).iterdir())


def test_unchanged_sources_reuse_their_derived_keys(built, computed, tmp_path):
    recipe, before, entries = built
    assert len(entries) == 2  # one per source
    written = {e: e.stat().st_ino for e in entries}
    build(recipe, BuildOptions(jobs=2, force=True))
    assert computed == []
    assert tree(tmp_path / "out") == before
    assert {e: e.stat().st_ino for e in entries} == written  # nothing new: not rewritten


@pytest.mark.parametrize("damage", ["swap", "no-mac", "other-secret", "garbage"])
def test_entries_that_are_not_authentic_are_recomputed(built, computed, tmp_path,
                                                       monkeypatch, damage):
    recipe, before, entries = built
    entry = entries[0]
    doc = json.loads(entry.read_text())
    if damage == "swap":  # both fp16 copies have one size: a swap passes the size check
        ids = sorted(doc["keys"])
        doc["keys"][ids[0]], doc["keys"][ids[1]] = doc["keys"][ids[1]], doc["keys"][ids[0]]
        entry.write_text(json.dumps(doc))
    elif damage == "no-mac":
        del doc["mac"]
        entry.write_text(json.dumps(doc))
    elif damage == "other-secret":  # written by another user of the store
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
        import weightstore.store.mac as cache_mac

        cache_mac._key.cache_clear()
    else:
        entry.write_bytes(b"\x00{not json")
    build(recipe, BuildOptions(jobs=2, force=True))
    expected = 4 if damage == "other-secret" else 2  # every entry, or the damaged one
    assert len(computed) == expected
    assert tree(tmp_path / "out") == before
