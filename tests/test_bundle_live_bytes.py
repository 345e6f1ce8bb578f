"""A device's folder (``bundle``, ``pull --device`` / ``--scenario``) carries its live bytes
only: weight files of its own holding the payloads its models read, not the package's
shared files whole, in real files (no sparse holes), byte-identical on every rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.packaging.bundles import assemble
from weightstore.packaging.check import check_package
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import WeightStore

from .registry_server import needs_registry, running_registry
from .samples import make_encoder, run_onnxruntime, sample_inputs

# the bench's case (bench/split.py), small: base, fp16 and fused variants in one package
# split by scenario, three devices; and a CPU running int4 MatMulNBits weights
INT4 = {"name": "quantize-weights", "bits": 4, "block_size": 32, "symmetric": True}
SCENARIOS = {"half": (["cast-fp16", "cleanup"], {"accelerator": "npu"}),
             "fused": (["fuse-qkv", "cleanup"], {"kernels": "fused-attention"}),
             "int4": ([INT4, "cleanup"], {"cpu": "int4"})}
LAYOUT = {"name": "split", "external_weight": "combined", "alignment": 512,
          "size_threshold": 1024, "constants": "external-data", "split": "scenario"}
# an alignment past a file-system block: the padding must be written, not left a hole
WIDE = {**LAYOUT, "name": "wide", "alignment": 65536}
DEVICES = {"npu": "half", "server": "fused", "reference": None, "cpu-int4": "int4"}
LIMIT = 1.1  # a device folder's bytes against its live bytes


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live-bytes")
    # big enough that the models' graphs and records are small beside their weights
    model = make_encoder(vocab=2000, hidden=128, ffn=512, layers=2)
    onnx.save(model, str(folder / "encoder.onnx"))
    recipe = folder / "recipe.yaml"  # JSON is YAML
    recipe.write_text(json.dumps({
        "package": "pk", "version": "1", "store": {"path": str(folder / "store")},
        "models": [{"name": "encoder", "source": str(folder / "encoder.onnx"),
                    "scenarios": [{"name": name, "passes": passes, "requires": requires}
                                  for name, (passes, requires) in SCENARIOS.items()]}],
        "layouts": [LAYOUT, WIDE],
        "devices": [{"name": device, "scenario": "auto" if scenario else None,
                     "capabilities": SCENARIOS[scenario][1] if scenario else {}}
                    for device, scenario in DEVICES.items()],
        "output": str(folder / "out")}))
    built = {p.layout: p.path for p in build(recipe, BuildOptions(jobs=2)).packages}
    inputs = sample_inputs(model, seed=3)
    expected = {s: run_onnxruntime(runnable_variant(built["split"] / "encoder.onnx", s),
                                   inputs)
                for s in set(DEVICES.values())}
    return built["split"], folder / "store", inputs, expected, built["wide"]


def _live(package: Path, device: str) -> int:
    record = json.loads((package / "devices" / device / "bundle.json").read_text())
    return sum(m["live_bytes"] for m in record["models"])


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _carries_live_bytes_and_runs(folder: Path, package: Path, device: str, inputs,
                                 expected) -> None:
    """``folder`` holds ``device``'s models and at most 1.1x their live bytes, every file
    without holes; it checks (every payload re-hashed) and runs as the package does."""
    _dense_and_runs(folder, device, inputs, expected)
    live = _live(package, device)
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    shared = sum((package / f["name"]).stat().st_size for f in json.loads(
        (package / "devices" / device / "bundle.json").read_text())["files"])
    if device in ("npu", "cpu-int4"):  # the package's files, whole, would not do
        assert shared > 1.5 * live
    assert total <= LIMIT * live, (device, total, live)


def _dense_and_runs(folder: Path, device: str, inputs, expected) -> None:
    """Every file of ``folder`` is real bytes (no hole); the folder checks (every payload
    re-hashed) and runs as the package does."""
    for p in folder.rglob("*"):
        if p.is_file():
            st = p.stat()
            assert st.st_blocks * 512 >= st.st_size, f"{p.name} is sparse"
    assert check_package(folder, verify=True).ok
    actual = run_onnxruntime(folder / "encoder.onnx", inputs)
    for e, a in zip(expected[DEVICES[device]], actual, strict=True):
        assert e.tobytes() == a.tobytes(), device


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_a_bundle_carries_only_its_live_bytes(package, tmp_path, device):
    path, _, inputs, expected, _ = package
    record = assemble(path, device, tmp_path / "a")
    _carries_live_bytes_and_runs(tmp_path / "a", path, device, inputs, expected)
    assert record["models"][0]["scenario"] == DEVICES[device]
    assert {f["name"]: f["size"] for f in record["files"]} == {
        f["name"]: (tmp_path / "a" / f["name"]).stat().st_size for f in record["files"]}
    # deterministic: the same package gives the same folder, byte for byte
    assemble(path, device, tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_a_bundle_s_padding_is_written_whatever_the_alignment(package, tmp_path, device):
    """At an alignment of 64 KiB the padding between live payloads spans whole blocks:
    it is written as zeros, so the folder has no holes."""
    _, _, inputs, expected, wide = package
    assemble(wide, device, tmp_path / "a")
    _dense_and_runs(tmp_path / "a", device, inputs, expected)
    assemble(wide, device, tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_the_report_shows_each_device_s_bundle_bytes(package, tmp_path, capsys):
    """Each device's row: its live bytes and the weight bytes its folder carries."""
    path, _, _, _, _ = package
    assert main(["report", str(path), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)["views"]["package"]
    rows = {r["name"]: r for r in view["variants"] if r["kind"] == "device"}
    for device in DEVICES:
        assemble(path, device, tmp_path / device)
        weights = sum((tmp_path / device / f["name"]).stat().st_size for f in json.loads(
            (tmp_path / device / "bundle.json").read_text())["files"])
        assert rows[device]["live_bytes"] == _live(path, device)
        assert rows[device]["bundle_bytes"] == weights


@needs_registry
def test_pull_device_downloads_and_carries_only_live_bytes(package, tmp_path):
    path, store, inputs, expected, wide = package
    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/live/pk:1"
        push(path, ref, store=WeightStore(store))
        for device in DEVICES:
            out = tmp_path / "pulled" / device
            report = pull(ref, out, store=WeightStore(tmp_path / f"store-{device}"),
                          device=device)
            live = _live(path, device)
            assert report.received_bytes <= LIMIT * live, (device, report.to_dict(), live)
            _carries_live_bytes_and_runs(out, path, device, inputs, expected)
            # the same folder as ``bundle`` writes
            assemble(path, device, tmp_path / "bundled" / device)
            assert _files(out) == _files(tmp_path / "bundled" / device)
        push(wide, f"{registry.host}/live/wide:1", store=WeightStore(store))
        out = tmp_path / "wide"
        pull(f"{registry.host}/live/wide:1", out, store=WeightStore(tmp_path / "s-wide"),
             device="npu")
        _dense_and_runs(out, "npu", inputs, expected)
        # a scenario's folder: the device's, as a scenario names it
        scenario = pull(ref, tmp_path / "half", store=WeightStore(tmp_path / "s-half"),
                        scenario="half")
        assert scenario.received_bytes <= LIMIT * _live(path, "npu")
        _carries_live_bytes_and_runs(tmp_path / "half", path, "npu", inputs, expected)
