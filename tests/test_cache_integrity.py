"""A damaged or tampered cache never yields a wrong package.

Every cache file the store holds (``payload-keys/*.json``, ``source-digests.json``) is
corrupted in every way we can think of: entries swapped, moved between sources, truncated,
garbage, pointing at objects of other sizes, forged for a changed file. The next build must
give a package byte-identical to a clean build of the same sources.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from weightstore.builder.run import BuildOptions, build
from weightstore.caches.payload_keys import FOLDER
from weightstore.errors import PackageError
from weightstore.package import fingerprint
from weightstore.package.fingerprint import CACHE_NAME

from .test_build import tree, write_recipe

LAYOUTS = ("\n  - {name: c, external_weight: combined}"
           "\n  - {name: sh, external_weight: combined, combined: shared}"
           "\n  - {name: s, external_weight: separate}\n")
Q = "encoder.layer.0.attention.self.query.weight"
K = "encoder.layer.0.attention.self.key.weight"


@pytest.fixture(autouse=True)
def _cache_everything(monkeypatch):
    """Files written by the test are seconds old: let the digest cache take them."""
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", 0)


def _build(recipe: Path, store: Path) -> dict[str, bytes]:
    build(recipe, BuildOptions(store=str(store), jobs=2, force=True))
    return tree(recipe.parent / "out")


def _ids(out: Path, model: str = "m") -> dict[str, tuple[str, int]]:
    """tensor name -> (key, size) in the combined package of ``model``."""
    summary = json.loads((out / "pkg/1.0.0/c/summary.json").read_text())
    entry = next(m for m in summary["models"] if m["name"] == model)
    return {w["name"]: (w["id"], w["size"]) for w in entry["external_weights"]}


def _key_files(store: Path) -> list[Path]:
    return sorted((store / FOLDER).iterdir())


def _edit_keys(path: Path, change: Callable[[dict[str, str], dict[str, tuple[str, int]]], None],
               ids: dict[str, tuple[str, int]]) -> None:
    doc = json.loads(path.read_text())
    change(doc["keys"], ids)
    path.write_text(json.dumps(doc))


def _path_of(keys: dict[str, str], key: str) -> str:
    return next(p for p, k in keys.items() if k == key)


def _swap(keys, ids):
    a, b = _path_of(keys, ids[Q][0]), _path_of(keys, ids[K][0])
    keys[a], keys[b] = keys[b], keys[a]


def _duplicate(keys, ids):
    keys[_path_of(keys, ids[Q][0])] = ids[K][0]


def _rotate_same_size(keys, ids):
    by_size: dict[int, list[str]] = {}
    for key, size in ids.values():
        by_size.setdefault(size, []).append(key)
    for group in by_size.values():
        paths = [_path_of(keys, k) for k in group]
        for p, k in zip(paths, group[1:] + group[:1], strict=True):
            keys[p] = k


def _other_sizes(keys, ids):
    sizes = {k: s for k, s in ids.values()}
    for p, k in keys.items():
        keys[p] = next(o for o in sizes if sizes[o] != sizes[k])


def _unknown(keys, ids):
    for p in keys:
        keys[p] = "blake3:" + "0" * 64


def _other_algorithm(keys, ids):
    for p in keys:
        keys[p] = "sha256:" + keys[p].split(":")[1]


@pytest.mark.parametrize("change", [_swap, _duplicate, _rotate_same_size, _other_sizes,
                                    _unknown, _other_algorithm])
def test_edited_payload_keys(change, encoder_model, save_model, tmp_path):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")}, LAYOUTS)
    store = tmp_path / "store"
    clean = _build(recipe, store)
    (entry,) = _key_files(store)
    _edit_keys(entry, change, _ids(tmp_path / "out"))
    assert _build(recipe, store) == clean
    assert _build(recipe, store) == clean  # and the entry written back is sound


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],
    lambda b: b"",
    lambda b: os.urandom(len(b)),
    lambda b: b"[1, 2, 3]",
    lambda b: b'{"format_version": 1, "keys": ["a", "b"]}',
    lambda b: b'{"format_version": 1, "keys": {"0.0": 7}}',
], ids=["truncated", "empty", "garbage", "list", "keys-list", "key-not-string"])
def test_damaged_payload_key_file(damage, encoder_model, save_model, tmp_path):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")}, LAYOUTS)
    store = tmp_path / "store"
    clean = _build(recipe, store)
    (entry,) = _key_files(store)
    entry.write_bytes(damage(entry.read_bytes()))
    assert _build(recipe, store) == clean


def test_payload_keys_of_another_model(shared_pair, save_model, tmp_path):
    """Two models of one architecture: every path and size matches, the bytes do not."""
    a, b = shared_pair
    recipe = write_recipe(tmp_path, {"a": save_model(a, "a.onnx"),
                                     "b": save_model(b, "b.onnx")}, LAYOUTS)
    store = tmp_path / "store"
    clean = _build(recipe, store)
    first, second = _key_files(store)
    text_first, text_second = first.read_text(), second.read_text()
    first.write_text(text_second)
    second.write_text(text_first)
    assert _build(recipe, store) == clean


def _near_twins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Make K equal to Q except in bytes no sampled page covers."""
    from weightstore.caches.payload_keys import sample_ranges

    inits = {t.name: t for t in model.graph.initializer}
    q = numpy_helper.to_array(inits[Q]).copy()
    k = q.copy()
    covered = np.zeros(q.nbytes, dtype=bool)
    for off, n in sample_ranges(q.nbytes):
        covered[off:off + n] = True
    hole = int(np.flatnonzero(~covered)[0]) // 4 + 1  # a float wholly outside the samples
    k.reshape(-1)[hole] += np.float32(1.0)
    inits[K].CopyFrom(numpy_helper.from_array(k, K))
    return model


def test_swap_that_every_sample_agrees_with(encoder_model, save_model, tmp_path, monkeypatch):
    """Only a full check of the bytes can see this swap; the package must still be right."""
    from weightstore.packaging import write as packaging

    retries = []
    real = packaging.distrust_cached_keys
    monkeypatch.setattr(packaging, "distrust_cached_keys",
                        lambda *a: retries.append(a) or real(*a))
    model = _near_twins(encoder_model)
    recipe = write_recipe(tmp_path, {"m": save_model(model, "m.onnx")}, LAYOUTS)
    store = tmp_path / "store"
    clean = _build(recipe, store)
    ids = _ids(tmp_path / "out")
    assert ids[Q][0] != ids[K][0]
    (entry,) = _key_files(store)
    _edit_keys(entry, _swap, ids)
    assert _build(recipe, store) == clean
    assert len(retries) == 1  # found while copying, not by the samples
    assert _build(recipe, store) == clean
    assert len(retries) == 1


# -- source-digests.json ---------------------------------------------------------------------

def _pair_recipe(shared_pair, save_model, tmp_path) -> tuple[Path, Path, dict[str, Path]]:
    a, b = shared_pair
    paths = {"a": save_model(a, "a.onnx"), "b": save_model(b, "b.onnx")}
    return write_recipe(tmp_path, paths, LAYOUTS), tmp_path / "store", paths


def _entries(store: Path) -> dict:
    return json.loads((store / CACHE_NAME).read_text())


def _write_entries(store: Path, doc: dict) -> None:
    (store / CACHE_NAME).write_text(json.dumps(doc))


@pytest.mark.parametrize("fields", [("digest",), ("digest", "mac")])
def test_swapped_source_digests(fields, shared_pair, save_model, tmp_path):
    recipe, store, paths = _pair_recipe(shared_pair, save_model, tmp_path)
    clean = _build(recipe, store)
    doc = _entries(store)
    ea, eb = (doc["entries"][str(paths[n].resolve())] for n in ("a", "b"))
    for f in fields:
        ea[f], eb[f] = eb[f], ea[f]
    _write_entries(store, doc)
    assert _build(recipe, store) == clean


def test_source_digest_entry_moved_to_another_file(shared_pair, save_model, tmp_path):
    recipe, store, paths = _pair_recipe(shared_pair, save_model, tmp_path)
    clean = _build(recipe, store)
    doc = _entries(store)
    ea, eb = (doc["entries"][str(paths[n].resolve())] for n in ("a", "b"))
    stamp = {k: ea[k] for k in ("size", "ino", "dev", "mtime_ns", "ctime_ns")}
    doc["entries"][str(paths["a"].resolve())] = {**eb, **stamp}
    _write_entries(store, doc)
    assert _build(recipe, store) == clean


def test_forged_entry_for_a_changed_source(shared_pair, save_model, tmp_path):
    """The source changed; the cache claims it did not: the build must see the change."""
    recipe, store, paths = _pair_recipe(shared_pair, save_model, tmp_path)
    build(recipe, BuildOptions(store=str(store), jobs=2))
    old = _entries(store)["entries"][str(paths["a"].resolve())]
    onnx.save(shared_pair[1], paths["a"])  # a now holds b's weights
    st = os.stat(paths["a"])
    doc = _entries(store)
    doc["entries"][str(paths["a"].resolve())] = {
        **old, "size": st.st_size, "ino": st.st_ino, "dev": st.st_dev,
        "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
    _write_entries(store, doc)
    with pytest.raises(PackageError, match="different build"):  # not "up-to-date"
        build(recipe, BuildOptions(store=str(store), jobs=2))
    _build(recipe, store)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    clean = _build(write_recipe(fresh, paths, LAYOUTS), tmp_path / "fresh-store")
    assert clean == tree(tmp_path / "out")


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],
    lambda b: os.urandom(len(b)),
    lambda b: b'{"format_version": 2, "entries": []}',
    lambda b: b'{"format_version": 2, "entries": {"x": 1}}',
], ids=["truncated", "garbage", "entries-list", "entry-not-object"])
def test_damaged_source_digest_file(damage, shared_pair, save_model, tmp_path):
    recipe, store, _ = _pair_recipe(shared_pair, save_model, tmp_path)
    clean = _build(recipe, store)
    cache = store / CACHE_NAME
    cache.write_bytes(damage(cache.read_bytes()))
    assert _build(recipe, store) == clean


def test_wrong_size_in_source_digest_entry(shared_pair, save_model, tmp_path):
    recipe, store, _ = _pair_recipe(shared_pair, save_model, tmp_path)
    clean = _build(recipe, store)
    doc = _entries(store)
    for entry in doc["entries"].values():
        entry["size"] += 1
    _write_entries(store, doc)
    assert _build(recipe, store) == clean


def test_cache_key_must_be_private(tmp_path, monkeypatch):
    """A key others can read authenticates nothing: no entry is trusted or written."""
    from weightstore.store import mac as cache_mac

    src = tmp_path / "model.bin"
    src.write_bytes(b"z" * 100)
    key = cache_mac.key_path()
    assert cache_mac.entry_mac({"a": 1}) is not None  # created on first use
    assert key.stat().st_mode & 0o777 == 0o600
    cache_mac._key.cache_clear()
    key.chmod(0o644)
    assert cache_mac.entry_mac({"a": 1}) is None
    cache = tmp_path / "digests.json"
    digests = fingerprint.FileDigests(cache)
    digests.of(src)
    digests.save()
    assert not cache.exists()
    cache_mac._key.cache_clear()


DEEP = b"[" * 200_000 + b"]" * 200_000  # deeper than the JSON parser follows


def test_deeply_nested_caches_are_ignored_and_rewritten(shared_pair, save_model, tmp_path):
    """``source-digests.json`` and every ``payload-keys/*.json`` nested too deep to parse:
    the build ignores them, gives the same package and writes them anew."""
    recipe, store, _ = _pair_recipe(shared_pair, save_model, tmp_path)
    clean = _build(recipe, store)
    caches = [store / CACHE_NAME, *_key_files(store)]
    assert len(caches) > 1
    for cache in caches:
        cache.write_bytes(DEEP)
    assert _build(recipe, store) == clean
    for cache in caches:
        assert isinstance(json.loads(cache.read_bytes()), dict), cache


def test_every_cache_reader_ignores_a_deeply_nested_file(tmp_path):
    from weightstore.caches import build_actions, build_stamp
    from weightstore.caches.derived_keys import DerivedKeyCache
    from weightstore.caches.payload_keys import PayloadKeyCache

    identity = {"source_digest": "blake3:" + "0" * 64, "external": {}}
    payload, derived = PayloadKeyCache(tmp_path), DerivedKeyCache(tmp_path)
    fp = "blake3:" + "1" * 64
    stamp = build_stamp.Invocation(tmp_path / "r.yaml", (), (), tmp_path / "store")
    files = [payload._path(identity, "blake3"), derived._path(identity, "blake3"),
             build_actions.record_path(tmp_path, fp), tmp_path / CACHE_NAME,
             stamp.path()]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(DEEP)
    assert payload.load(identity, "blake3") == {}
    assert derived.load(identity, "blake3") == {}
    assert build_actions.load(tmp_path, fp) is None
    assert build_stamp.load(stamp, b"") is None
    assert fingerprint.FileDigests(tmp_path / CACHE_NAME)._saved == {}
