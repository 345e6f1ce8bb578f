"""`weightstore build` end to end: packages run bit-identically, dedup, determinism."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.convert import convert_to_inline
from weightstore.errors import PackageError
from weightstore.store import WeightStore

from .helpers import package_objects, store_index
from .samples import run_onnxruntime, sample_inputs

ALL_LAYOUTS = """
  - {name: embedded, external_weight: embedded}
  - {name: separate, external_weight: separate, size_threshold: 1024}
  - {name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}
  - {name: combined-4k, external_weight: combined, alignment: 4096, size_threshold: 0}
  - {name: ge-separate, external_weight: separate, constants: file-constant}
  - {name: ge-combined, external_weight: combined, constants: file-constant}
"""


def write_recipe(folder: Path, models: dict[str, Path], layouts: str = ALL_LAYOUTS,
                 extra: str = "") -> Path:
    lines = ["package: pkg", 'version: "1.0.0"', "store: {hash: blake3}", "models:"]
    lines += [f"  - {{name: {n}, source: {p}}}" for n, p in models.items()]
    text = "\n".join(lines) + "\nlayouts:" + layouts + "output: out\n" + extra
    path = folder / "recipe.yaml"
    path.write_text(text)
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def runnable(package_dir: Path, model_file: str, tmp_path: Path) -> Path:
    """FileConstant packages are for GE-like runtimes: inline them to run in onnxruntime."""
    path = package_dir / model_file
    model = onnx.load(str(path), load_external_data=False)
    if any(o.domain == "weightstore" for o in model.opset_import):
        inlined = tmp_path / f"{package_dir.name}-{model_file}"
        convert_to_inline(path, inlined)
        return inlined
    return path


@pytest.fixture
def built(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    return result, encoder_model


def test_every_layout_runs_bit_identical(built, tmp_path):
    result, model = built
    assert [p.status for p in result.packages] == ["built"] * 6
    for use_pooler in (True, False):
        inputs = sample_inputs(model, seed=7)
        inputs["use_pooler"] = np.array(use_pooler)
        expected = run_onnxruntime(model, inputs)
        for package in result.packages:
            actual = run_onnxruntime(runnable(package.path, "encoder.onnx", tmp_path), inputs)
            for e, a in zip(expected, actual, strict=True):
                assert e.tobytes() == a.tobytes(), package.layout


def test_checker_and_alignment(built):
    result, _ = built
    for package in result.packages:
        path = package.path / "encoder.onnx"
        onnx.checker.check_model(str(path), full_check=True)
        layout = package.summary["layout"]
        weights = package.summary["models"][0]["external_weights"]
        if layout["external_weight"] == "embedded":
            assert weights == [] and sorted(os.listdir(package.path)) == [
                "encoder.onnx", "summary.json"]
            continue
        assert weights
        for w in weights:
            data = (package.path / w["location"]).read_bytes()
            assert len(data) >= w["offset"] + w["size"]
            if layout["external_weight"] == "combined":
                assert w["offset"] % layout["alignment"] == 0
                assert w["location"] == "encoder_weight_combined"
            else:
                assert w["location"] == "weight_" + w["id"].split(":")[1] and w["offset"] == 0
        for f in package.summary["files"]:
            assert (package.path / f["name"]).stat().st_size == f["size"]


def test_weight_files_are_real_files(built):
    result, _ = built
    for package in result.packages:
        for p in package.path.iterdir():
            assert p.is_file() and not p.is_symlink() and p.stat().st_nlink == 1


def test_summary_totals(built):
    result, _ = built
    package = next(p for p in result.packages if p.layout == "combined-4k")
    s = package.summary
    on_disk = json.loads((package.path / "summary.json").read_text())
    assert on_disk == s and s["format_version"] == 4
    t = s["totals"]
    weights = s["models"][0]["external_weights"]
    assert t["external_weights"] == len(weights)
    assert t["referenced_bytes"] == sum(w["size"] for w in weights)
    assert t["unique_payloads"] == len({w["id"] for w in weights})
    assert t["weight_file_bytes"] == t["stored_payload_bytes"] + t["padding_bytes"]
    assert t["dedup_saved_bytes"] == t["referenced_bytes"] - t["stored_payload_bytes"]


def test_rebuild_is_up_to_date_and_byte_identical(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    first = build(recipe, BuildOptions(store=str(tmp_path / "s1"), jobs=1))
    before = tree(tmp_path / "out")
    again = build(recipe, BuildOptions(store=str(tmp_path / "s1"), jobs=1))
    assert all(p.status == "up-to-date" for p in again.packages)
    assert again.store_report == dict.fromkeys(
        ("written_objects", "written_bytes", "reused_objects", "reused_bytes", "padding_bytes"),
        0)
    assert tree(tmp_path / "out") == before
    # a warm store, more threads, another output: the same bytes
    os.rename(tmp_path / "out", tmp_path / "out-first")
    build(recipe, BuildOptions(store=str(tmp_path / "s1"), jobs=4, force=True))
    assert tree(tmp_path / "out") == before
    # a cold store in another place: the same bytes
    os.rename(tmp_path / "out", tmp_path / "out-second")
    build(recipe, BuildOptions(store=str(tmp_path / "s2"), jobs=3))
    assert tree(tmp_path / "out") == before
    assert first.packages[0].summary == json.loads(
        (tmp_path / "out/pkg/1.0.0/embedded/summary.json").read_text())


def test_changed_source_refuses_then_force(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    build(recipe, BuildOptions(jobs=1))
    before = tree(tmp_path / "out")
    encoder_model.graph.initializer[0].raw_data = bytes(
        len(encoder_model.graph.initializer[0].raw_data))
    save_model(encoder_model, "models/encoder.onnx")
    with pytest.raises(PackageError) as err:
        build(recipe, BuildOptions(jobs=1))
    assert "different build" in str(err.value)
    assert tree(tmp_path / "out") == before
    result = build(recipe, BuildOptions(jobs=1, force=True))
    assert all(p.status == "built" for p in result.packages)
    assert tree(tmp_path / "out") != before


def test_damaged_package_is_rebuilt_only_with_force(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    build(recipe, BuildOptions(jobs=1))
    victim = tmp_path / "out/pkg/1.0.0/combined/encoder_weight_combined"
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(PackageError):
        build(recipe, BuildOptions(jobs=1))
    build(recipe, BuildOptions(jobs=1, force=True))
    assert victim.stat().st_size > 100


def test_dedup_across_models_and_builds(shared_pair, save_model, tmp_path):
    a, b = shared_pair
    paths = {"a": save_model(a, "a.onnx"), "b": save_model(b, "b.onnx")}
    layouts = "\n  - {name: c, external_weight: combined, alignment: 512}\n"
    recipe = write_recipe(tmp_path, paths, layouts)
    store_dir = tmp_path / "store"
    result = build(recipe, BuildOptions(store=str(store_dir), jobs=2))
    summary = result.packages[0].summary
    ids = {m["name"]: {w["id"]: w["size"] for w in m["external_weights"]}
           for m in summary["models"]}
    shared = ids["a"].keys() & ids["b"].keys()
    assert shared and ids["a"].keys() != ids["b"].keys()
    unique = {**ids["a"], **ids["b"]}
    files = package_objects(result.packages[0].path)  # models and summary, for its record
    stats = WeightStore(store_dir).stats()
    assert stats.objects == len(unique) + len(files)
    assert stats.payload_bytes == sum(unique.values()) + sum(files.values())
    assert stats.bytes_on_disk == stats.payload_bytes + stats.padding_bytes
    report = result.store_report
    assert report["written_objects"] == len(unique) + len(files)
    assert report["reused_objects"] == len(shared)  # b's shared payloads were already in
    # a second recipe over the same store writes nothing new but its summary (layout d)
    other = tmp_path / "again"
    other.mkdir()
    recipe2 = write_recipe(other, paths, layouts.replace("name: c", "name: d"))
    again = build(recipe2, BuildOptions(store=str(store_dir), jobs=2))
    assert again.store_report["written_objects"] == len(
        package_objects(again.packages[0].path).keys() - files.keys()) == 1
    assert WeightStore(store_dir).verify().ok


def test_separate_layout_shares_files_between_models(shared_pair, save_model, tmp_path):
    a, b = shared_pair
    paths = {"a": save_model(a, "a.onnx"), "b": save_model(b, "b.onnx")}
    recipe = write_recipe(tmp_path, paths, "\n  - {name: s, external_weight: separate}\n")
    summary = build(recipe, BuildOptions(jobs=2)).packages[0].summary
    t = summary["totals"]
    assert t["dedup_saved_bytes"] > 0
    assert t["weight_files"] == t["unique_payloads"]


def _build_in_process(args: tuple[str, str]) -> dict:
    recipe, store = args
    return build(recipe, BuildOptions(store=store, jobs=2)).store_report


def test_concurrent_processes_share_one_store(shared_pair, save_model, tmp_path):
    a, b = shared_pair
    recipes = []
    for i in range(4):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        model = save_model(a if i % 2 else b, f"r{i}/m.onnx")
        kind = "combined" if i < 2 else "separate"
        recipes.append(str(write_recipe(folder, {"m": model},
                                        f"\n  - {{name: l, external_weight: {kind}}}\n")))
    store = tmp_path / "store"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        reports = pool.map(_build_in_process, [(r, str(store)) for r in recipes])
    ws = WeightStore(store)
    index = store_index(ws)
    for recipe in recipes:
        summary = json.loads((Path(recipe).parent / "out/pkg/1.0.0/l/summary.json").read_text())
        for w in summary["models"][0]["external_weights"]:
            assert w["id"] in index
    assert sum(r["written_objects"] for r in reports) == len(index)
    assert ws.verify().ok


def test_packages_identical_to_store_bytes(built):
    result, _ = built
    store = WeightStore(result.store)
    package = next(p for p in result.packages if p.layout == "separate")
    for w in package.summary["models"][0]["external_weights"]:
        obj = store.lookup(w["id"])
        assert store.read(obj) == (package.path / w["location"]).read_bytes()


def test_failed_build_leaves_no_partial_package(encoder_model, save_model, tmp_path,
                                                monkeypatch):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    import weightstore.packaging.write as build_module

    calls = {"n": 0}
    real = build_module.atomic_write_bytes

    def failing(path, data, **kwargs):
        if path.name.endswith(".onnx"):  # the third layout's model
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(28, "No space left on device", str(path))
        return real(path, data, **kwargs)

    monkeypatch.setattr(build_module, "atomic_write_bytes", failing)
    with pytest.raises(OSError):
        build(recipe, BuildOptions(jobs=1))
    version_dir = tmp_path / "out/pkg/1.0.0"
    names = sorted(n for n in os.listdir(version_dir) if not n.endswith(".lock"))
    assert names == ["embedded", "separate"]  # the third package never appeared


def test_embedded_refuses_models_over_protobuf_limit(encoder_model, save_model, tmp_path,
                                                     monkeypatch):
    import weightstore.io.models as model_io

    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src},
                          "\n  - {name: e, external_weight: embedded}\n")
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 100_000)  # stands for 2 GiB
    with pytest.raises(PackageError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert "2 GiB" in str(err.value) and err.value.context["layout"] == "e"
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert not (tmp_path / "store").exists()


def test_embedded_layouts_need_no_store(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src},
                          "\n  - {name: e, external_weight: embedded}\n")
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert result.store_report["written_objects"] == 0
    assert not any((tmp_path / "store").glob("weight_*"))
    assert not any((tmp_path / "store").glob("*_weight_combined"))


def test_sha256_store_and_packages(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src},
                          "\n  - {name: c, external_weight: combined}\n")
    recipe.write_text(recipe.read_text().replace("hash: blake3", "hash: sha256"))
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    summary = result.packages[0].summary
    assert summary["hash"] == "sha256"
    ids = [w["id"] for w in summary["models"][0]["external_weights"]]
    assert ids and all(i.startswith("sha256:") for i in ids)
    model = onnx.load(str(result.packages[0].path / "encoder.onnx"), load_external_data=False)
    # the summary keys each range; the model's external data names only the range
    ranges = {(w["location"], w["offset"]) for w in summary["models"][0]["external_weights"]}
    external = [{e.key: e.value for e in t.external_data} for t in model.graph.initializer
                if t.external_data]
    assert external and all(set(e) == {"location", "offset", "length"} for e in external)
    assert {(e["location"], int(e["offset"])) for e in external} <= ranges
    assert all(k.startswith("sha256:") for k in store_index(WeightStore(result.store)))
    inputs = sample_inputs(encoder_model)
    expected = run_onnxruntime(encoder_model, inputs)
    actual = run_onnxruntime(result.packages[0].path / "encoder.onnx", inputs)
    assert all(e.tobytes() == a.tobytes() for e, a in zip(expected, actual, strict=True))


def test_package_files_are_listed_without_reading_them_again(encoder_model, save_model,
                                                             tmp_path, monkeypatch):
    """The summary's file digests come from the pass that writes and verifies the files:
    no package file is read again to list it, and every digest is the file's own."""
    import weightstore.packaging.inventory as inventory
    from weightstore.io.digests import digest_file, make_key

    src = save_model(encoder_model, "models/encoder.onnx")
    recipe = write_recipe(tmp_path, {"encoder": src})
    read_again: list[str] = []
    real = inventory.digest_file

    def watched(algo, path):
        read_again.append(str(path))
        return real(algo, path)

    monkeypatch.setattr(inventory, "digest_file", watched)
    result = build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    assert read_again == []
    for package in result.packages:
        listed = package.summary["contents"]
        assert [c["path"] for c in listed] == inventory.package_files(package.path)
        for c in listed:
            path = package.path / c["path"]
            assert c["size"] == path.stat().st_size
            assert c["digest"] == make_key("blake3", digest_file("blake3", path))
