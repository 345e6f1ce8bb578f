"""An embedded layout's package records its devices as every layout does: ``devices/<name>/``
with each model as the device runs it (its scenario replayed and pruned) and its record.
GE's mode 0 needs no weight file: a device model holds its live weights inline, the very
weights the separate layout's device model reads from its files, and computes the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from weightstore.builder.run import BuildOptions, build
from weightstore.caches import build_actions, build_stamp
from weightstore.cli import main
from weightstore.packaging.bundles import assemble
from weightstore.packaging.check import check_package
from weightstore.packaging.inventory import verify_package
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.store import WeightStore
from weightstore.store.location import user_cache_dir

from .helpers import file_tree
from .registry_server import needs_registry, running_registry
from .samples import make_encoder, run_onnxruntime, sample_inputs

SCENARIOS = {"half": ["cast-fp16", "cleanup"], "fused": ["fuse-qkv", "cleanup"]}
DEVICES = {"cpu": None, "half": "half", "fused": "fused"}
OPTIONS = b'{"npu": 1}'


def write_recipe(folder: Path) -> Path:
    """The encoder with two scenarios, an embedded and a separate layout, three devices
    (the default graph, fp16, fused attention), the fp16 device with a file of its own."""
    onnx.save(make_encoder(), str(folder / "encoder.onnx"))
    (folder / "half").mkdir(exist_ok=True)
    (folder / "half" / "options.json").write_bytes(OPTIONS)
    recipe = folder / "recipe.yaml"  # JSON is YAML
    recipe.write_text(json.dumps({
        "package": "pk", "version": "1", "store": {"path": str(folder / "store")},
        "models": [{"name": "encoder", "source": str(folder / "encoder.onnx"),
                    "scenarios": [{"name": n, "passes": p} for n, p in SCENARIOS.items()]}],
        "layouts": [{"name": "embedded", "external_weight": "embedded"},
                    {"name": "separate", "external_weight": "separate"}],
        "devices": [{"name": d, "scenario": s,
                     **({"files": [{"source": str(folder / "half" / "options.json")}]}
                        if d == "half" else {})} for d, s in DEVICES.items()],
        "output": str(folder / "out")}))
    return recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embdev")
    recipe = write_recipe(folder)
    packages = {p.layout: p.path for p in build(recipe, BuildOptions(jobs=2)).packages}
    inputs = sample_inputs(onnx.load(str(folder / "encoder.onnx")), seed=5)
    return folder, recipe, packages, inputs


def _outputs_equal(expected, actual) -> bool:
    return all(e.dtype == a.dtype and e.tobytes() == a.tobytes()
               for e, a in zip(expected, actual, strict=True))


def _weights(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    return {t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
            for t in model.graph.initializer}


def test_the_summary_lists_the_devices_of_an_embedded_layout(built):
    _, _, packages, _ = built
    embedded = json.loads((packages["embedded"] / "summary.json").read_text())
    separate = json.loads((packages["separate"] / "summary.json").read_text())
    assert [(d["name"], d["scenario"]) for d in embedded["devices"]] == list(DEVICES.items())
    listed = {c["path"] for c in embedded["contents"]}
    for device, entry in zip(DEVICES, embedded["devices"], strict=True):
        assert (packages["embedded"] / "devices" / device / "bundle.json").is_file()
        assert set(entry["files"]) <= listed
        record = json.loads((packages["embedded"] / "devices" / device / "bundle.json")
                            .read_text())
        assert record["files"] == []  # no weight file: every live weight is inline
        assert [m["scenario"] for m in record["models"]] == [DEVICES[device]]
    # the device's companions, as the separate layout lists them
    assert [d.get("companions") for d in embedded["devices"]] == [
        d.get("companions") for d in separate["devices"]]
    assert (packages["embedded"] / "devices" / "half" / "options.json").read_bytes() \
        == OPTIONS
    assert verify_package(packages["embedded"]).ok


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_an_embedded_device_computes_as_the_separate_one(built, tmp_path, device):
    """The package's device model runs as it is (no weight file to find), bit-identical to
    the separate layout's device; ``run --device`` of either package gives those bytes."""
    _, _, packages, inputs = built
    assemble(packages["separate"], device, tmp_path / "separate")
    expected = run_onnxruntime(tmp_path / "separate" / "encoder.onnx", inputs)
    own = packages["embedded"] / "devices" / device / "encoder.onnx"
    assert _outputs_equal(expected, run_onnxruntime(own, inputs))
    np.savez(tmp_path / "inputs.npz", **inputs)
    for layout in ("embedded", "separate"):
        out = tmp_path / f"{layout}.npz"
        assert main(["run", str(packages[layout]), "--device", device, "--inputs",
                     str(tmp_path / "inputs.npz"), "--output", str(out), "-q"]) == 0
        ran = np.load(out)
        assert _outputs_equal(expected, [ran[n] for n in ran.files])


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_an_embedded_device_model_holds_only_its_live_weights(built, device):
    """Exactly the weights the separate layout's device model reads, inline: a cast
    weight's float32 copy and the matrices fused away are not there."""
    _, _, packages, _ = built
    own = onnx.load(str(packages["embedded"] / "devices" / device / "encoder.onnx"))
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in own.graph.initializer)
    separate = onnx.load(str(packages["separate"] / "devices" / device / "encoder.onnx"),
                         load_external_data=False)
    # its external data names package files, beside the package's root
    onnx.load_external_data_for_model(separate, str(packages["separate"]))
    assert _weights(own) == _weights(separate)
    read = {i for n in own.graph.node for i in n.input}
    assert {t.name for t in own.graph.initializer} <= read
    whole = _weights(onnx.load(str(packages["embedded"] / "encoder.onnx")))
    float32 = sum(len(b) for t, _, b in whole.values() if t == onnx.TensorProto.FLOAT)
    if device == "half":  # the fp16 copies only, half the bytes
        assert not any(t == onnx.TensorProto.FLOAT and len(b) > 1024
                       for t, _, b in _weights(own).values())
        assert sum(len(b) for _, _, b in _weights(own).values()) < 0.6 * float32
    if device == "fused":  # q, k and v fused: their own matrices are dead
        fused = {n for n in whole if n.endswith(("query.weight", "key.weight"))}
        assert fused and not fused & set(_weights(own))


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_check_resolve_and_bundle_an_embedded_device(built, tmp_path, capsys, device):
    _, _, packages, inputs = built
    package = str(packages["embedded"])
    capsys.readouterr()
    assert main(["check", package, "--device", device]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"encoder.onnx: scenario {DEVICES[device] or '(default)'}, every live weight inside "
        "the model (no weight file)", "ok"]
    assert main(["check", str(packages["separate"]), "--device", device]) == 0
    assert " live weights in weight files (" in capsys.readouterr().out
    assert main(["check", package, "--device", device, "--verify"]) == 0
    assert main(["resolve", package, "--device", device]) == 0
    capsys.readouterr()
    out = tmp_path / "bundle"
    assert main(["bundle", package, device, "--output", str(out)]) == 0
    files = file_tree(out)
    assert set(files) == {"encoder.onnx", "bundle.json"} | (
        {"options.json"} if device == "half" else set())
    assert files["encoder.onnx"] == (packages["embedded"] / "devices" / device
                                     / "encoder.onnx").read_bytes()
    assert check_package(out, verify=True).ok
    expected = run_onnxruntime(packages["embedded"] / "devices" / device / "encoder.onnx",
                               inputs)
    assert _outputs_equal(expected, run_onnxruntime(out / "encoder.onnx", inputs))
    assert main(["bundle", package, device, "--output", str(tmp_path / "again")]) == 0
    assert file_tree(tmp_path / "again") == files  # deterministic


@needs_registry
def test_push_and_pull_device_of_an_embedded_package(built, tmp_path):
    """``pull --device`` downloads the device's model, not the package's (every weight of
    every scenario), and writes the folder ``bundle`` writes."""
    folder, _, packages, _ = built
    package = packages["embedded"]
    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/emb/pk:1"
        push(package, ref, store=WeightStore(folder / "store"))
        for device in DEVICES:
            out = tmp_path / "pulled" / device
            report = pull(ref, out, store=WeightStore(tmp_path / f"store-{device}"),
                          device=device)
            assemble(package, device, tmp_path / "bundled" / device)
            assert file_tree(out) == file_tree(tmp_path / "bundled" / device)
            model = (package / "devices" / device / "encoder.onnx").stat().st_size
            whole = (package / "encoder.onnx").stat().st_size
            assert report.received_bytes < model + whole / 4, (device, report.to_dict())
            assert check_package(out, verify=True).ok
        whole = tmp_path / "whole"
        pull(ref, whole, store=WeightStore(tmp_path / "store-whole"))
        assert file_tree(whole) == file_tree(package)


def test_rebuild_is_identical_and_up_to_date(built, tmp_path):
    folder, recipe, _, _ = built
    before = file_tree(folder / "out")
    assert "pk/1/embedded/devices/half/encoder.onnx" in before
    # the module's build signed its records under another test's key: rebuilt, same bytes
    build(recipe, BuildOptions(jobs=2))
    assert file_tree(folder / "out") == before
    again = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date"] * 2
    cold = build(recipe, BuildOptions(store=str(tmp_path / "cold"), jobs=1, force=True))
    assert [p.status for p in cold.packages] == ["built"] * 2
    assert file_tree(folder / "out") == before


def _without_devices(package: Path) -> None:
    """Rewrite an embedded package as weightstore wrote it before its devices were
    recorded: no ``devices/`` folder, none in the summary."""
    shutil.rmtree(package / "devices")
    summary_path = package / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["devices"] = []
    summary["contents"] = [c for c in summary["contents"]
                           if not c["path"].startswith("devices/")]
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def test_an_embedded_package_without_devices_is_read_and_rebuilt_with_them(tmp_path,
                                                                            capsys):
    recipe = write_recipe(tmp_path)
    package = build(recipe, BuildOptions(jobs=2)).packages[0].path
    before = file_tree(package)
    _without_devices(package)
    summary = json.loads((package / "summary.json").read_text())
    # the store's record names that summary: the folder is proven to be that build; the
    # build stamp that version wrote is of a format this one does not read
    build_actions.record(WeightStore(tmp_path / "store"), package, summary)
    shutil.rmtree(user_cache_dir() / build_stamp.FOLDER)
    assert verify_package(package).ok
    assert main(["check", str(package), "--scenario", "half", "--verify"]) == 0
    assert main(["check", str(package), "--device", "half"]) == 2
    assert "no such device in the package" in capsys.readouterr().err
    # a rebuild writes what this version writes: its devices too
    result = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in result.packages] == ["built", "up-to-date"]
    assert file_tree(package) == before
