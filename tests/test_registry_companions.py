"""Companion files (configs, tokenizers, docs, code) through a registry, against the real
registry: each pushed as the ModelPack layer of its kind, pulled under its real name by
modelpack-client, oras-py and skopeo, byte-identical; ``weightstore pull`` (whole, of a
device, of a scenario) verifying every byte against the summary's digests through the
store; ``assemble`` of what generic clients pulled; another client's ModelPack artifact
with doc, config and code layers."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest

from weightstore.cli import main
from weightstore.errors import IntegrityError, RegistryDigestError
from weightstore.packaging.bundles import assemble as assemble_bundle
from weightstore.registry.artifact import FILEPATH, SUMMARY_NAME, TITLE, sha256_digest
from weightstore.registry.client import RegistryClient
from weightstore.registry.pull import pull
from weightstore.registry.push import bytes_pieces, push, upload_blob
from weightstore.registry.reference import parse_reference
from weightstore.store import WeightStore

from .helpers import file_tree, manifest_of
from .registry_proxy import Counter, misbehaving, relay
from .registry_server import needs_registry, running_registry
from .samples import make_encoder

pytestmark = needs_registry

SKOPEO = shutil.which("skopeo")
needs_skopeo = pytest.mark.skipif(SKOPEO is None, reason="skopeo is not installed (CI "
                                                         "installs it with apt)")
MEDIA = {"config": "application/vnd.cncf.model.weight.config.v1.raw",
         "doc": "application/vnd.cncf.model.doc.v1.raw",
         "code": "application/vnd.cncf.model.code.v1.raw",
         "dataset": "application/vnd.cncf.model.dataset.v1.raw",
         "weights": "application/vnd.cncf.model.weight.v1.raw"}
LAYOUTS = ("separate", "combined", "split")

RECIPE = """\
package: pk
version: "{version}"
store: {{path: {store}}}
files:
  - {{source: {hf}, path: "."}}
  - {{source: {hf}/tokenizer.json, path: extra/tokenizer.json}}
  - {{source: {more}/labels.csv, kind: dataset}}
  - {{source: {more}/adapter.safetensors}}
models:
  - name: encoder
    source: {src}
    scenarios:
      - {{name: half, passes: [cast-fp16, cleanup], requires: {{accelerator: npu}}}}
layouts:
  - {{name: separate, external_weight: separate}}
  - {{name: combined, external_weight: combined}}
  - {{name: split, external_weight: combined, split: scenario, alignment: 4096}}
devices:
  - name: npu
    capabilities: {{accelerator: npu}}
    scenario: auto
    files: [{{source: {npu}/genai_config.json, path: genai_config.json}}]
  - {{name: cpu, scenario: null}}
output: {out}
"""


def tokenizer_files(folder: Path, readme: str = "A tiny encoder.\n") -> None:
    """A runtime folder's companions, of realistic shape: a BPE tokenizer, its config,
    genai_config.json, a chat template, a licence, a model card, a helper script, an
    empty marker."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {f"tok{i}": i for i in range(400)}
    merges = [f"t o{i}" for i in range(200)]
    (folder / "tokenizer.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": merges}},
        indent=2))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 16}, indent=2))
    (folder / "genai_config.json").write_text(json.dumps(
        {"model": {"type": "llama", "context_length": 16, "decoder": {"filename": "m.onnx"}},
         "search": {"max_length": 16}}, indent=2))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}"
                                                "{% endfor %}\n")
    (folder / "LICENSE").write_text("MIT License\n\nPermission is hereby granted...\n")
    (folder / "README.md").write_text(readme)
    (folder / "helper.py").write_text("def encode(text):\n    return text.split()\n")
    (folder / "EMPTY.md").write_bytes(b"")


def build_versions(folder: Path) -> dict:
    """Package pk 1.0.0 in three layouts, with companions and a device override, and
    1.0.1 where only README.md changed; one store."""
    from weightstore.builder.run import BuildOptions, build

    model = make_encoder(vocab=200, hidden=32, heads=2, layers=1, ffn=64, max_seq=16)
    src = folder / "encoder.onnx"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(src))
    more = folder / "more"
    more.mkdir()
    (more / "labels.csv").write_text("id,label\n0,negative\n1,positive\n")
    (more / "adapter.safetensors").write_bytes(bytes(range(256)) * 8)
    npu = folder / "npu"
    npu.mkdir()
    (npu / "genai_config.json").write_text('{"model": {"type": "llama", "npu": true}}\n')
    out = {}
    for version, readme in (("1.0.0", "A tiny encoder.\n"),
                            ("1.0.1", "A tiny encoder, with a better card.\n")):
        hf = folder / f"hf-{version}"
        tokenizer_files(hf, readme)
        recipe = folder / f"recipe-{version}.yaml"
        recipe.write_text(RECIPE.format(version=version, store=folder / "store", hf=hf,
                                        more=more, npu=npu, src=src, out=folder / "out"))
        result = build(recipe, BuildOptions(jobs=2))
        out[version] = {p.layout: p.path for p in result.packages}
    return {"model": model, "store": WeightStore(folder / "store"), "v1": out["1.0.0"],
            "v2": out["1.0.1"]}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, registry):
    versions = build_versions(tmp_path_factory.mktemp("companions"))
    refs = {}
    for layout, path in versions["v1"].items():
        refs[layout] = f"{registry.host}/comp/{layout}:1.0.0"
        push(path, refs[layout], store=versions["store"])
    return {**versions, "host": registry.host, "refs": refs}


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _companions(package: Path) -> dict[str, dict]:
    """Every companion file the package holds (overrides at devices/<d>/<path>), with its
    summary entry."""
    summary = _summary(package)
    out = {c["path"]: c for c in summary["companions"]}
    listed = {c["path"] for c in summary["contents"]}
    for device in summary["devices"]:
        for c in device.get("companions", []):
            name = f"devices/{device['name']}/{c['path']}"
            if name in listed:
                out[name] = c
    return out


def _device(package: Path, name: str) -> dict:
    return next(d for d in _summary(package)["devices"] if d["name"] == name)


# -- push: ModelPack layers -----------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_companion_is_one_layer_of_its_kind(built, layout) -> None:
    package = built["v1"][layout]
    companions = _companions(package)
    assert {"tokenizer.json", "extra/tokenizer.json", "LICENSE", "README.md", "helper.py",
            "labels.csv", "adapter.safetensors", "EMPTY.md",
            "devices/npu/genai_config.json"} <= companions.keys()
    kinds = {name: c["kind"] for name, c in companions.items()}
    assert (kinds["LICENSE"], kinds["README.md"], kinds["helper.py"], kinds["labels.csv"],
            kinds["adapter.safetensors"], kinds["tokenizer.json"]) == (
        "doc", "doc", "code", "dataset", "weights", "config")
    layers = {x["annotations"][FILEPATH]: x for x in manifest_of(built["refs"][layout])["layers"]}
    for name, entry in companions.items():
        layer = layers[name]
        assert layer["mediaType"] == MEDIA[entry["kind"]], name
        assert layer["annotations"] == {FILEPATH: name, TITLE: name}
        assert layer["digest"] == sha256_digest((package / name).read_bytes())
        assert layer["size"] == entry["size"]
    # identical bytes are one blob, named by both paths
    assert layers["tokenizer.json"]["digest"] == layers["extra/tokenizer.json"]["digest"]
    from modelpack_client.constants import MODEL_LAYER_MEDIA_TYPES

    assert all(x["mediaType"] in MODEL_LAYER_MEDIA_TYPES for x in layers.values())


def test_identical_companions_are_one_blob_and_a_version_moves_only_its_changes(built) -> None:
    """Pushing 1.0.1, where only README.md changed, uploads the new README, the summary,
    the config and the device records that list the README's digest; no payload, no other
    companion."""
    v1, v2 = built["v1"]["combined"], built["v2"]["combined"]
    ref = f"{built['host']}/comp/update"
    first = push(v1, f"{ref}:1.0.0", store=built["store"])
    manifest = manifest_of(f"{ref}:1.0.0")
    assert first.blobs == len({x["digest"] for x in manifest["layers"]}) + 1  # + config
    assert len(manifest["layers"]) > len({x["digest"] for x in manifest["layers"]})
    report = push(v2, f"{ref}:1.0.1", store=built["store"])
    before = file_tree(v1)
    changed = sorted(name for name, data in file_tree(v2).items() if before.get(name) != data)
    assert "README.md" in changed and all(
        n in ("README.md", "summary.json") or n.endswith("bundle.json") for n in changed)
    assert report.uploaded == len(changed) + 1  # the config
    assert report.uploaded_weight_bytes == 0 and report.hashed_bytes == 0
    assert report.uploaded_bytes == sum(len(file_tree(v2)[n]) for n in changed) + manifest_of(
        f"{ref}:1.0.1")["config"]["size"]


# -- generic clients pull the files under their real names -----------------------------------

def _check_generic(built, layout: str, pulled: Path, tmp_path: Path) -> None:
    package = built["v1"][layout]
    tree = file_tree(pulled)
    for name in _companions(package):
        assert tree[name] == (package / name).read_bytes(), name
    assert main(["assemble", str(pulled), "--output", str(tmp_path / "pkg")]) == 0
    assert file_tree(tmp_path / "pkg") == file_tree(package)
    assert main(["verify", str(tmp_path / "pkg")]) == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_modelpack_client_pulls_the_companions(built, layout, tmp_path) -> None:
    from modelpack_client import ModelPackClient

    ModelPackClient(insecure=True).pull(built["refs"][layout], tmp_path / "mp")
    _check_generic(built, layout, tmp_path / "mp", tmp_path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_oras_pulls_the_companions(built, layout, tmp_path) -> None:
    from oras.client import OrasClient

    OrasClient(hostname=built["host"], insecure=True).pull(
        target=built["refs"][layout], outdir=str(tmp_path / "oras"))
    _check_generic(built, layout, tmp_path / "oras", tmp_path)


@needs_skopeo
@pytest.mark.parametrize("layout", LAYOUTS)
def test_skopeo_copies_the_companions_to_an_oci_layout(built, layout, tmp_path) -> None:
    """``skopeo copy`` to ``oci:DIR``: each companion's layer has its kind's media type and
    its path, and its blob is the file's bytes (by ``sha256sum``); ``assemble DIR`` gives
    the package."""
    oci = tmp_path / "oci"
    subprocess.run([SKOPEO, "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{built['refs'][layout]}", f"oci:{oci}"], check=True,
                   capture_output=True, timeout=60)
    index = json.loads((oci / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((oci / "blobs" / "sha256" / digest).read_bytes())
    layers = {x["annotations"][FILEPATH]: x for x in manifest["layers"]}
    package = built["v1"][layout]
    for name, entry in _companions(package).items():
        layer = layers[name]
        assert layer["mediaType"] == MEDIA[entry["kind"]]
        assert layer["annotations"][TITLE] == name
        blob = oci / "blobs" / "sha256" / layer["digest"].split(":")[1]
        summed = subprocess.run(["sha256sum", str(blob), str(package / name)], check=True,
                                capture_output=True, text=True).stdout.split()
        assert summed[0] == summed[2] == layer["digest"].split(":")[1], name
    assert main(["assemble", str(oci), "--output", str(tmp_path / "pkg")]) == 0
    assert file_tree(tmp_path / "pkg") == file_tree(package)
    assert main(["verify", str(tmp_path / "pkg")]) == 0


# -- weightstore pull -----------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_pull_brings_the_companions_through_the_store(built, layout, tmp_path) -> None:
    """A whole pull is the package byte for byte; each companion entered the store under
    the summary's digest (the folder is a root holding them), and a later version's pull
    fetches only the companion that changed."""
    package = built["v1"][layout]
    store = WeightStore(tmp_path / "store")
    report = pull(built["refs"][layout], tmp_path / "out", store=store)
    assert file_tree(tmp_path / "out") == file_tree(package)
    assert main(["verify", str(tmp_path / "out"), "--store", str(store.root)]) == 0
    keys = {c["digest"] for c in _companions(package).values() if c["size"]}
    assert set(store.locate(sorted(keys))) == keys
    assert store.verify().ok
    assert report.fetched_bytes <= report.payload_bytes
    # 1.0.1: README.md changed, every other companion and payload is in the store
    ref2 = built["refs"][layout].replace(":1.0.0", ":1.0.1")
    push(built["v2"][layout], ref2, store=built["store"])
    update = pull(ref2, tmp_path / "out2", store=store)
    assert update.fetched == 1
    assert update.fetched_bytes == len((built["v2"][layout] / "README.md").read_bytes())
    assert file_tree(tmp_path / "out2") == file_tree(built["v2"][layout])


def test_device_pull_gets_the_devices_companions_at_its_root(built, tmp_path) -> None:
    """``pull --device npu``: the device's set (its own genai_config.json) at the folder's
    root, beside its models; ``--device cpu`` and ``--scenario half`` the package's."""
    package = built["v1"]["split"]
    ref = built["refs"]["split"]
    store = WeightStore(tmp_path / "store")
    for device in ("npu", "cpu"):
        out = tmp_path / device
        pull(ref, out, store=store, device=device)
        entries = _device(package, device)["companions"]
        assert entries
        for c in entries:
            data = (out / c["path"]).read_bytes()
            assert len(data) == c["size"]
            own = package / "devices" / device / c["path"]
            assert data == (own if own.exists() else package / c["path"]).read_bytes()
        bundle = json.loads((out / "bundle.json").read_text())
        assert bundle["companions"] == entries and bundle["format_version"] == 3
        # what `weightstore bundle` writes for the device: the same record and files
        assemble_bundle(package, device, tmp_path / f"bundled-{device}")
        bundled = file_tree(tmp_path / f"bundled-{device}")
        assert {n: file_tree(out)[n] for n in bundled if n != "bundle.json"
                and not n.startswith("pk.")} == {n: d for n, d in bundled.items()
                                                 if n != "bundle.json"
                                                 and not n.startswith("pk.")}
        assert json.loads(bundled["bundle.json"]) == bundle
    npu = (tmp_path / "npu" / "genai_config.json").read_bytes()
    assert npu == (package / "devices" / "npu" / "genai_config.json").read_bytes()
    assert npu != (tmp_path / "cpu" / "genai_config.json").read_bytes()
    # 1.0.1 on the device: only the model card travels
    ref2 = f"{built['host']}/comp/device:1.0.1"
    push(built["v2"]["split"], ref2, store=built["store"])
    update = pull(ref2, tmp_path / "npu2", store=store, device="npu")
    assert update.fetched == 1
    assert update.fetched_bytes == len((built["v2"]["split"] / "README.md").read_bytes())
    assert (tmp_path / "npu2" / "README.md").read_bytes() == (
        built["v2"]["split"] / "README.md").read_bytes()
    pull(ref, tmp_path / "half", store=store, scenario="half")
    for c in _summary(package)["companions"]:
        assert (tmp_path / "half" / c["path"]).read_bytes() == (package / c["path"]).read_bytes()
    record = json.loads((tmp_path / "half" / "bundle.json").read_text())
    assert record["companions"] == _summary(package)["companions"]


def test_small_blobs_download_alongside_the_big_ones(built, tmp_path) -> None:
    """A pull starts its payload blobs the largest and the smallest in turn: the
    companion files and small weights no longer all wait for the big ones to finish,
    where nothing hides their request, sync and commit (largest first, the smallest
    came last)."""
    ref = built["refs"]["separate"]
    counter = Counter()
    with misbehaving(built["host"], counter) as proxy:
        pull(ref.replace(built["host"], proxy), tmp_path / "out",
             store=WeightStore(tmp_path / "store"), jobs=1)
    manifest = manifest_of(ref)
    names = {x["digest"]: x.get("annotations", {}).get(FILEPATH, "") for x in
             manifest["layers"]}
    first = {n for n in names.values()  # the metadata, fetched before the payloads
             if n == SUMMARY_NAME or n.endswith((".onnx", "bundle.json"))}
    sizes = {x["digest"]: x["size"] for x in manifest["layers"]}
    fetched = [sizes[d] for m, p in counter.seen if m == "GET" and "/blobs/sha256:" in p
               and (d := p.rsplit("/", 1)[1]) in names and names[d] not in first]
    # the order they start in (two threads take turns on one slot, so not to the blob):
    # the largest first and the smallest right behind, not last
    assert max(fetched) in fetched[:2]
    assert fetched.index(min(fetched)) < len(fetched) // 4
    assert len(fetched) > 8
    assert file_tree(tmp_path / "out") == file_tree(built["v1"]["separate"])


def test_a_pulls_metadata_files_download_side_by_side(built, tmp_path) -> None:
    """The model files and device records a whole pull fetches before its payloads
    download several at a time (each was a request and a sync queued behind the one
    before): the registry, slowed down, sees them in flight together."""
    import threading
    import time

    ref = built["refs"]["separate"]
    names = {x["digest"]: x.get("annotations", {}).get(FILEPATH, "")
             for x in manifest_of(ref)["layers"]}
    metadata = {d for d, n in names.items() if n.endswith((".onnx", "bundle.json"))}
    assert len(metadata) >= 3
    lock, flying, most = threading.Lock(), [0], [0]

    def slow(handler, body: bytes) -> bool:
        if handler.command != "GET" or handler.path.rsplit("/", 1)[-1] not in metadata:
            return False
        with lock:
            flying[0] += 1
            most[0] = max(most[0], flying[0])
        time.sleep(0.3)
        try:
            relay(handler, built["host"], body)
        finally:
            with lock:
                flying[0] -= 1
        return True

    with misbehaving(built["host"], slow) as proxy:
        pull(ref.replace(built["host"], proxy), tmp_path / "out",
             store=WeightStore(tmp_path / "store"))
    assert most[0] >= 2
    assert file_tree(tmp_path / "out") == file_tree(built["v1"]["separate"])


def test_a_pulls_config_and_summary_download_side_by_side(built, tmp_path) -> None:
    """The config and the summary, two documents of bounded size, do not queue one
    behind the other (on a registry far away, each wait is a round trip); the models
    still come before any payload (a model layer the artifact lacks is refused before a
    payload is fetched, and a progress bar counts payload bytes only). The registry,
    slowed down, sees the pair in flight together; the pull is byte-identical."""
    import threading
    import time

    ref = built["refs"]["separate"]
    manifest = manifest_of(ref)
    names = {x["digest"]: x.get("annotations", {}).get(FILEPATH, "")
             for x in manifest["layers"]}
    kinds = {manifest["config"]["digest"]: "config"}
    for digest, name in names.items():
        kinds[digest] = ("summary" if name == SUMMARY_NAME else
                         "model" if name.endswith(".onnx") else
                         "payload" if name.startswith("weight_") else "other")
    lock, flying, together = threading.Lock(), set(), set()

    def slow(handler, body: bytes) -> bool:
        kind = kinds.get(handler.path.rsplit("/", 1)[-1])
        if handler.command != "GET" or kind in (None, "other"):
            return False
        with lock:
            together.update(frozenset({kind, other}) for other in flying if other != kind)
            flying.add(kind)
        time.sleep(0.3)
        try:
            relay(handler, built["host"], body)
        finally:
            with lock:
                flying.discard(kind)
        return True

    with misbehaving(built["host"], slow) as proxy:
        pull(ref.replace(built["host"], proxy), tmp_path / "out",
             store=WeightStore(tmp_path / "store"))
    assert frozenset({"config", "summary"}) in together
    assert frozenset({"model", "payload"}) not in together
    assert file_tree(tmp_path / "out") == file_tree(built["v1"]["separate"])


def test_a_pull_syncs_no_file_it_removes_at_once(built, tmp_path, monkeypatch) -> None:
    """The artifact's config blob is read and removed as soon as it is checked: it is
    not fsynced (a sync on the way to every pull's first byte), while every file the
    pull publishes and every store object still is."""
    import os

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    pull(built["refs"]["separate"], tmp_path / "out", store=WeightStore(tmp_path / "store"))
    assert not [p for p in synced if p.endswith("/.config")]
    assert [p for p in synced if p.endswith("/summary.json")]
    assert file_tree(tmp_path / "out") == file_tree(built["v1"]["separate"])


def test_a_registry_serving_other_bytes_for_a_companion_is_refused(built, tmp_path,
                                                                    monkeypatch) -> None:
    """A registry whose companion blob is altered in transit: the digest is named, nothing
    published, nothing of it in the store. A mirror doing so is refused and the origin's
    bytes taken."""
    package = built["v1"]["separate"]
    ref = built["refs"]["separate"]
    layers = {x["annotations"][FILEPATH]: x for x in manifest_of(ref)["layers"]}
    target = layers["tokenizer_config.json"]["digest"]

    def flip(handler, body: bytes) -> bool:
        if handler.command == "GET" and handler.path.endswith(target):
            def change(data: bytes) -> bytes:
                return data[:-1] + bytes([data[-1] ^ 1]) if data else data
            relay(handler, built["host"], body, change)
            return True
        return False

    store = WeightStore(tmp_path / "store")
    with misbehaving(built["host"], flip) as proxy:
        with pytest.raises(RegistryDigestError) as info:
            pull(ref.replace(built["host"], proxy), tmp_path / "out", store=store)
        assert info.value.context["digest"] == target
        assert not (tmp_path / "out").exists()
        key = _companions(package)["tokenizer_config.json"]["digest"]
        assert not store.locate([key])
        # the same proxy named a mirror of the registry: refused, the origin's bytes used
        conf = tmp_path / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{built["host"]}"\n'
                        f'[[registry.mirror]]\nlocation = "{proxy}"\ninsecure = true\n')
        monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
        pull(ref, tmp_path / "mirrored", store=store)
    assert file_tree(tmp_path / "mirrored") == file_tree(package)


def test_a_manifest_naming_other_bytes_for_a_companion_is_refused(built, tmp_path) -> None:
    """Someone with push rights points a companion's layer at other bytes of its size (a
    consistent sha256): the summary's digest refuses them before the folder exists."""
    package = built["v1"]["separate"]
    src = parse_reference(built["refs"]["separate"])
    client = RegistryClient(src.host, push=True)
    manifest = manifest_of(built["refs"]["separate"])
    layer = next(x for x in manifest["layers"]
                 if x["annotations"][FILEPATH] == "genai_config.json")
    evil = bytearray((package / "genai_config.json").read_bytes())
    evil[2] ^= 1
    digest = sha256_digest(bytes(evil))
    ref = parse_reference(f"{built['host']}/comp/evil:1")
    for x in [manifest["config"], *manifest["layers"]]:  # mounted from the original
        upload_blob(client, ref, x["digest"], x["size"], bytes_pieces(b""), [src.repository])
    upload_blob(client, ref, digest, len(evil), bytes_pieces(bytes(evil)), [])
    layer["digest"] = digest
    client.put_manifest(ref, "1", json.dumps(manifest).encode())
    store = WeightStore(tmp_path / "store")
    with pytest.raises(IntegrityError, match="do not match the key") as info:
        pull(str(ref), tmp_path / "out", store=store)
    assert info.value.context["key"] == _companions(package)["genai_config.json"]["digest"]
    assert not (tmp_path / "out").exists()
    assert main(["pull", str(ref), str(tmp_path / "cli"), "--store", str(store.root)]) == 2
    assert not (tmp_path / "cli").exists()


# -- another client's artifact ----------------------------------------------------------------

def test_a_modelpack_client_artifact_keeps_its_doc_config_and_code_files(registry, tmp_path,
                                                                         ) -> None:
    """modelpack-client pushes a runtime folder with config, doc, code and dataset layers
    (raw, and a doc folder as a tar layer); ``weightstore pull`` writes every file under
    its path, byte-identical."""
    from modelpack_client import ModelLayer, ModelPackClient, ModelPackConfig
    from modelpack_client.models import ModelDescriptor, ModelTechnicalConfig

    src = tmp_path / "src"
    tokenizer_files(src)
    (src / "docs").mkdir()
    (src / "docs" / "usage.md").write_text("Run it.\n")
    (src / "docs" / "NOTICE").write_text("Notices.\n")
    (src / "eval.csv").write_text("a,b\n1,2\n")
    onnx.save(make_encoder(vocab=50, hidden=16, heads=2, layers=1, ffn=32, max_seq=8),
              str(src / "model.onnx"))
    kinds = {"model.onnx": "weight", "tokenizer.json": "weight.config",
             "tokenizer_config.json": "weight.config", "genai_config.json": "weight.config",
             "chat_template.jinja": "weight.config", "LICENSE": "doc", "README.md": "doc",
             "EMPTY.md": "doc", "helper.py": "code", "eval.csv": "dataset"}
    layers = [ModelLayer(src / name, media_type=f"application/vnd.cncf.model.{kind}.v1.raw",
                         artifact_path=name) for name, kind in kinds.items()]
    layers.append(ModelLayer(src / "docs", media_type="application/vnd.cncf.model.doc.v1.tar",
                             artifact_path="docs"))
    ref = f"{registry.host}/mp/runtime:1"
    config = ModelPackConfig(descriptor=ModelDescriptor(name="tiny"),
                             config=ModelTechnicalConfig(format="onnx"))
    ModelPackClient(insecure=True).push(ref, layers, config)
    assert main(["pull", ref, str(tmp_path / "out"), "--store", str(tmp_path / "store")]) == 0
    assert file_tree(tmp_path / "out") == file_tree(src)
    for name in kinds:
        digest = hashlib.sha256((src / name).read_bytes()).hexdigest()
        assert hashlib.sha256((tmp_path / "out" / name).read_bytes()).hexdigest() == digest


def test_an_oras_artifact_keeps_its_runtime_folder(registry, tmp_path, monkeypatch) -> None:
    """oras-py pushes a runtime folder file by file (titles, its own media types) and a
    subfolder as a tar+gzip layer; ``weightstore pull`` writes it byte-identical."""
    from oras.client import OrasClient

    src = tmp_path / "src"
    tokenizer_files(src)
    (src / "docs").mkdir()
    (src / "docs" / "usage.md").write_text("Run it.\n")
    onnx.save(make_encoder(vocab=50, hidden=16, heads=2, layers=1, ffn=32, max_seq=8),
              str(src / "model.onnx"))
    ref = f"{registry.host}/oras/runtime:1"
    monkeypatch.chdir(src)  # oras-py takes paths relative to the working folder
    OrasClient(insecure=True).push(target=ref, files=sorted(p.name for p in src.iterdir()))
    assert main(["pull", ref, str(tmp_path / "out"), "--store", str(tmp_path / "store")]) == 0
    assert file_tree(tmp_path / "out") == file_tree(src)


# -- the build cache ----------------------------------------------------------------------------

CACHED = """\
package: pk
version: "1.0.0"
store: {path: store}
files:
  - {source: hf, path: "."}
models:
  - {name: encoder, source: encoder.onnx}
layouts:
  - {name: combined, external_weight: combined}
devices:
  - name: cpu
    scenario: null
    files: [{source: cpu/genai_config.json, path: genai_config.json}]
output: out
"""


def _runner(root: Path, readme: str = "A tiny encoder.\n") -> Path:
    """A checkout: the recipe, its model and its companions, relative to it."""
    root.mkdir(parents=True)
    onnx.save(make_encoder(vocab=100, hidden=32, heads=2, layers=1, ffn=64, max_seq=16),
              str(root / "encoder.onnx"))
    tokenizer_files(root / "hf", readme)
    (root / "cpu").mkdir()
    (root / "cpu" / "genai_config.json").write_text('{"model": {"cpu": true}}\n')
    (root / "recipe.yaml").write_text(CACHED)
    return root / "recipe.yaml"


def test_a_cache_entry_carries_the_companions(registry, tmp_path, monkeypatch) -> None:
    """Runner A builds and fills the cache; runner B, with an empty store, is answered by
    it: the package with its companions, byte-identical, and the store holding them, so a
    later build of the removed folder materializes them from the store. A companion
    edited in B's checkout is another build: a miss."""
    from weightstore.builder.run import BuildOptions, build
    from weightstore.signing.keys import TRUSTED_KEYS_ENV, generate

    key = generate(tmp_path / "ci.pem")
    repo = f"{registry.host}/cache/companions"
    built = build(_runner(tmp_path / "a"), BuildOptions(jobs=2, cache_to=repo,
                                                        cache_key=str(tmp_path / "ci.pem")))
    (package,) = built.packages
    assert _summary(package.path)["companions"]
    assert (package.path / "devices" / "cpu" / "genai_config.json").is_file()
    monkeypatch.setenv(TRUSTED_KEYS_ENV, key.text)
    recipe = _runner(tmp_path / "b")
    fetched = build(recipe, BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in fetched.packages] == [repo]
    (hit,) = fetched.packages
    assert file_tree(hit.path) == file_tree(package.path)
    store = WeightStore(recipe.parent / "store")
    keys = {c["digest"] for c in _companions(hit.path).values() if c["size"]}
    assert set(store.locate(sorted(keys))) == keys
    assert main(["verify", str(hit.path), "--store", str(store.root)]) == 0
    shutil.rmtree(hit.path)
    again = build(recipe, BuildOptions(jobs=2))
    assert again.packages[0].cache is None
    assert file_tree(again.packages[0].path) == file_tree(package.path)
    # a companion edited: another action key, so the entry does not answer it
    other = _runner(tmp_path / "c", readme="Another card.\n")
    missed = build(other, BuildOptions(jobs=2, cache_from=(repo,)))
    assert missed.packages[0].cache is None
    assert (missed.packages[0].path / "README.md").read_text() == "Another card.\n"


def test_a_device_companion_at_a_models_path_is_refused(built, tmp_path, capsys) -> None:
    """A summary whose device lists a companion file at its model's path (the model's own
    bytes, so every digest agrees): a device pull would write one file over the other, and
    is refused in one line, nothing written."""
    package = tmp_path / "pkg"
    shutil.copytree(built["v1"]["split"], package)
    summary = _summary(package)
    model = next(c for c in summary["contents"] if c["path"] == "devices/npu/encoder.onnx")
    device = next(d for d in summary["devices"] if d["name"] == "npu")
    device["companions"] = sorted([*device["companions"], {
        "path": "encoder.onnx", "size": model["size"], "digest": model["digest"],
        "kind": "config"}], key=lambda c: c["path"])
    (package / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    ref = f"{built['host']}/comp/clash:1"
    push(package, ref, store=WeightStore(tmp_path / "push-store"))
    capsys.readouterr()  # the push's line: proven only internally consistent
    code = main(["pull", ref, str(tmp_path / "npu"), "--device", "npu", "--store",
                 str(tmp_path / "store")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "companion file has the path of another file" in err
    assert "encoder.onnx" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "npu").exists()


@pytest.mark.parametrize("path, other", [("pk.default.data/notes.txt", "pk.default.data"),
                                         ("PK.HALF.DATA", "pk.half.data"),
                                         ("Encoder.onnx", "encoder.onnx")])
def test_a_device_companion_at_a_folder_or_case_of_another_file_is_refused(
        built, tmp_path, capsys, path, other) -> None:
    """A device's own companion file whose path makes a weight file a folder, or differs
    from one only in case (one file on macOS and Windows): a device pull is refused in one
    line naming both, nothing written."""
    from weightstore.io.digests import digest_bytes, make_key

    package = tmp_path / "pkg"
    shutil.copytree(built["v1"]["split"], package)
    summary = _summary(package)
    data = b"a note\n"
    key = make_key(summary["hash"], digest_bytes(summary["hash"], data))
    own = package / "devices" / "npu" / path
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_bytes(data)
    device = next(d for d in summary["devices"] if d["name"] == "npu")
    device["files"].append(f"devices/npu/{path}")
    device["companions"] = sorted([*device["companions"], {
        "path": path, "size": len(data), "digest": key, "kind": "doc"}],
        key=lambda c: c["path"])
    summary["contents"] = sorted([*summary["contents"], {
        "path": f"devices/npu/{path}", "size": len(data), "digest": key}],
        key=lambda c: c["path"])
    (package / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    ref = f"{built['host']}/comp/folder-clash:{path.replace('/', '-').lower()}"
    push(package, ref, store=WeightStore(tmp_path / "push-store"))
    capsys.readouterr()
    code = main(["pull", ref, str(tmp_path / "npu"), "--device", "npu", "--store",
                 str(tmp_path / "store")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "companion file" in err and len(err.splitlines()) == 1
    assert path in err and other in err
    assert not (tmp_path / "npu").exists()


@pytest.mark.parametrize("variant, file", [({"device": "cpu"}, "devices/cpu/encoder.onnx"),
                                           ({"scenario": "half"}, "encoder.onnx")])
def test_a_variant_pull_refuses_a_model_the_summary_does_not_list(built, tmp_path, variant,
                                                                  file) -> None:
    """Someone with push rights points a model's layer at another model (a consistent
    sha256): the summary's digest of that file refuses it in a device's or a scenario's
    pull, as a whole pull does, before the folder exists."""
    package = built["v1"]["separate"]
    src = parse_reference(built["refs"]["separate"])
    client = RegistryClient(src.host, push=True)
    manifest = manifest_of(built["refs"]["separate"])
    layer = next(x for x in manifest["layers"]
                 if x["annotations"][FILEPATH] == file)
    model = onnx.load(str(package / file), load_external_data=False)
    model.producer_name = model.producer_name.swapcase()  # other bytes, the same size
    evil = model.SerializeToString()
    assert evil != (package / file).read_bytes()
    digest = sha256_digest(evil)
    ref = parse_reference(f"{built['host']}/comp/evil-{file.replace('/', '-')}:1")
    for x in [manifest["config"], *manifest["layers"]]:  # mounted from the original
        upload_blob(client, ref, x["digest"], x["size"], bytes_pieces(b""), [src.repository])
    upload_blob(client, ref, digest, len(evil), bytes_pieces(evil), [])
    layer["digest"], layer["size"] = digest, len(evil)
    client.put_manifest(ref, "1", json.dumps(manifest).encode())
    store = WeightStore(tmp_path / "store")
    with pytest.raises(IntegrityError) as info:
        pull(str(ref), tmp_path / "out", store=store, **variant)
    assert info.value.context["file"] == file
    assert not (tmp_path / "out").exists()
