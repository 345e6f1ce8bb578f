"""weightstore's artifacts read by clients no one on the project wrote: modelpack-client,
oras-py and skopeo (to an OCI layout, then its blobs by file path), against the real
registry; the config checked with jsonschema against the ModelPack config schema;
``weightstore assemble`` making the package from what they pulled; artifacts of format 1
still pulled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import onnx
import pytest

from weightstore.cli import main
from weightstore.errors import RegistryNotFoundError
from weightstore.registry.artifact import FILEPATH, PAYLOAD
from weightstore.registry.client import RegistryClient
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.registry.reference import parse_reference
from weightstore.store import WeightStore

from .helpers import empty_store, every_layout, file_tree, manifest_of
from .registry_formats import push_format1
from .registry_server import needs_registry, running_registry
from .samples import make_encoder, run_onnxruntime, sample_inputs

TITLE = "org.opencontainers.image.title"

pytestmark = needs_registry

SKOPEO = shutil.which("skopeo")
needs_skopeo = pytest.mark.skipif(SKOPEO is None, reason="skopeo is not installed (CI "
                                                         "installs it with apt)")

# every layout the recipes make: weights inline, one file per weight (at the root or in
# scenario groups), combined files (per model, shared, or one per scenario group)
LAYOUTS = ("embedded", "separate", "combined", "shared", "split", "split-sep")
WHOLE = {"embedded", "separate", "split-sep"}  # a generic pull is the package itself


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("interop")
    model = make_encoder()
    packages = every_layout(folder, model, "1.0.0")
    with running_registry(folder / "registry") as server:
        store = WeightStore(folder / "store")
        refs = {}
        for layout, path in packages.items():
            refs[layout] = f"{server.host}/interop/{layout}:1.0.0"
            push(path, refs[layout], store=store)
        yield {"model": model, "store": store, "host": server.host, "refs": refs,
               "packages": packages}


def _runs_as(folder: Path, package: Path, model: onnx.ModelProto) -> None:
    """The folder's models give the package's outputs, bit for bit, in onnxruntime."""
    inputs = sample_inputs(model, seed=5)
    for e, a in zip(run_onnxruntime(package / "encoder.onnx", inputs),
                    run_onnxruntime(folder / "encoder.onnx", inputs), strict=True):
        assert e.tobytes() == a.tobytes()


def _check_generic(built, layout: str, pulled: Path, tmp_path: Path) -> None:
    """What a generic client pulled: the package itself for layouts of whole files; for
    combined and split layouts every layer's file (the package's records and models,
    summary.json, each payload's own file), which ``weightstore assemble`` turns into
    the package, byte for byte."""
    package = built["packages"][layout]
    manifest = manifest_of(built["refs"][layout])
    paths = {layer["annotations"][FILEPATH] for layer in manifest["layers"]}
    assert set(file_tree(pulled)) == paths
    if layout in WHOLE:
        assert file_tree(pulled) == file_tree(package)
        _runs_as(pulled, package, built["model"])
        return
    assert any(p.startswith("payloads/weight_") for p in paths)
    assert main(["assemble", str(pulled), "--output", str(tmp_path / "pkg")]) == 0
    assert file_tree(tmp_path / "pkg") == file_tree(package)
    _runs_as(tmp_path / "pkg", package, built["model"])
    assert main(["verify", str(tmp_path / "pkg")]) == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layer_is_a_modelpack_file_and_the_config_validates(built, layout) -> None:
    from modelpack_client.constants import MODEL_LAYER_MEDIA_TYPES
    from modelpack_client.schema import CONFIG_SCHEMA

    ref = parse_reference(built["refs"][layout])
    client = RegistryClient(ref.host)
    manifest = manifest_of(built["refs"][layout])
    with client.open_blob(ref, manifest["config"]["digest"]) as resp:
        config = json.loads(resp.read(1 << 20))
    jsonschema.validate(config, CONFIG_SCHEMA, format_checker=jsonschema.FormatChecker())
    assert config["modelfs"]["diffIds"] == [x["digest"] for x in manifest["layers"]]
    paths = []
    for layer in manifest["layers"]:
        notes = layer["annotations"]
        assert layer["mediaType"] in MODEL_LAYER_MEDIA_TYPES
        assert notes[FILEPATH] == notes[TITLE]
        paths.append(notes[FILEPATH])
        kind = ("weight" if PAYLOAD in notes or notes[FILEPATH].endswith(".onnx")
                else "weight.config")
        assert layer["mediaType"] == f"application/vnd.cncf.model.{kind}.v1.raw"
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_modelpack_client_pulls_the_package(built, layout, tmp_path) -> None:
    from modelpack_client import ModelPackClient

    result = ModelPackClient(insecure=True).pull(built["refs"][layout], tmp_path / "mp")
    assert len(result.files) == len(manifest_of(built["refs"][layout])["layers"])
    _check_generic(built, layout, tmp_path / "mp", tmp_path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_oras_pulls_the_package(built, layout, tmp_path) -> None:
    from oras.client import OrasClient

    client = OrasClient(hostname=built["host"], insecure=True)
    client.pull(target=built["refs"][layout], outdir=str(tmp_path / "oras"))
    _check_generic(built, layout, tmp_path / "oras", tmp_path)


def _skopeo(ref: str, target: Path) -> Path:
    """``skopeo copy`` of ``ref`` into the OCI image layout ``target``."""
    subprocess.run([SKOPEO, "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{ref}", f"oci:{target}"], check=True, capture_output=True,
                   timeout=60)
    return target


@needs_skopeo
@pytest.mark.parametrize("layout", LAYOUTS)
def test_assemble_takes_the_oci_layout_skopeo_writes(built, layout, tmp_path) -> None:
    """``skopeo copy … oci:DIR`` (index.json, blobs/sha256), then ``assemble DIR``: the
    package, byte for byte, with nothing laid out by hand."""
    oci = _skopeo(built["refs"][layout], tmp_path / "oci")
    assert sorted(os.listdir(oci)) == ["blobs", "index.json", "oci-layout"]
    before = file_tree(oci)
    package = built["packages"][layout]
    assert main(["assemble", str(oci), "--output", str(tmp_path / "pkg")]) == 0
    assert file_tree(tmp_path / "pkg") == file_tree(package)
    _runs_as(tmp_path / "pkg", package, built["model"])
    assert main(["verify", str(tmp_path / "pkg")]) == 0
    assert file_tree(oci) == before  # the layout is only read
    assert sorted(os.listdir(tmp_path)) == ["oci", "pkg"]  # no temp folder left
    # in place: the layout becomes the package
    assert main(["assemble", str(oci)]) == 0
    assert file_tree(oci) == file_tree(package)
    assert sorted(os.listdir(tmp_path)) == ["oci", "pkg"]


def _blobs(oci: Path) -> dict[str, Path]:
    """The layout's manifest and layer blobs, by role."""
    index = json.loads((oci / "index.json").read_text())
    path = oci / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads(path.read_bytes())
    biggest = max(manifest["layers"], key=lambda x: x["size"])
    return {"manifest": path,
            "layer": oci / "blobs" / "sha256" / biggest["digest"].split(":")[1]}


@needs_skopeo
@pytest.mark.parametrize("flaw", ["layer-byte", "layer-missing", "manifest-byte",
                                  "two-images", "layer-link", "payloads-swapped"])
def test_a_damaged_oci_layout_is_one_line(built, flaw, tmp_path, capsys) -> None:
    oci = _skopeo(built["refs"]["split"], tmp_path / "oci")
    blobs = _blobs(oci)
    if flaw.endswith("-byte"):
        blob = blobs[flaw.split("-")[0]]
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 1
        blob.chmod(0o644)
        blob.write_bytes(bytes(data))
    elif flaw == "layer-missing":
        blobs["layer"].unlink()
    elif flaw == "payloads-swapped":  # a manifest naming one payload's blob for another
        import hashlib

        manifest = json.loads(blobs["manifest"].read_bytes())
        payloads = [x for x in manifest["layers"] if PAYLOAD in x["annotations"]]
        first, second = payloads[0], payloads[1]
        first["digest"], second["digest"] = second["digest"], first["digest"]
        first["size"], second["size"] = second["size"], first["size"]
        data = json.dumps(manifest).encode()
        hex_ = hashlib.sha256(data).hexdigest()
        (oci / "blobs" / "sha256" / hex_).write_bytes(data)
        index = json.loads((oci / "index.json").read_text())
        index["manifests"][0].update(digest=f"sha256:{hex_}", size=len(data))
        (oci / "index.json").write_text(json.dumps(index))
    elif flaw == "layer-link":
        target = tmp_path / "elsewhere"
        shutil.copyfile(blobs["layer"], target)
        blobs["layer"].unlink()
        blobs["layer"].symlink_to(target)
    else:
        subprocess.run([SKOPEO, "--insecure-policy", "copy", "--quiet",
                        "--src-tls-verify=false", f"docker://{built['refs']['combined']}",
                        f"oci:{oci}:other"], check=True, capture_output=True, timeout=60)
    before = file_tree(oci)
    capsys.readouterr()
    for argv in (["assemble", str(oci), "--output", str(tmp_path / "pkg")],
                 ["assemble", str(oci)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("weightstore: error: ") and "\n" not in err, err
        want = {"layer-byte": "does not match its digest", "manifest-byte": "does not match",
                "layer-missing": "blob of the OCI layout is missing",
                "layer-link": "not a regular file",
                "two-images": "holds 2 manifests",
                "payloads-swapped": "does not match its key"}[flaw]
        assert want in err, err
        assert ".oci.layout." not in err, err  # the layout is named, not a temp folder
        assert file_tree(oci) == before and not (tmp_path / "pkg").exists()
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def _hand_layout(oci: Path, config_type: str, layer: dict) -> None:
    """An OCI image layout of one manifest: a config of ``config_type`` and one layer
    (``data``, ``mediaType``, ``annotations``), written as skopeo writes one."""
    import hashlib

    (oci / "blobs" / "sha256").mkdir(parents=True)

    def blob(data: bytes, media: str, **extra) -> dict:
        hex_ = hashlib.sha256(data).hexdigest()
        (oci / "blobs" / "sha256" / hex_).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{hex_}", "size": len(data), **extra}

    config = blob(b'{"architecture":"amd64","os":"linux"}', config_type)
    layers = [blob(layer["data"], layer["mediaType"], **({"annotations": layer["notes"]}
                                                         if layer.get("notes") else {}))]
    manifest = blob(json.dumps({"schemaVersion": 2, "config": config, "layers": layers,
                                "mediaType": "application/vnd.oci.image.manifest.v1+json"}
                               ).encode(), "application/vnd.oci.image.manifest.v1+json")
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (oci / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest]}))


@pytest.mark.parametrize("kind", ["container-image", "other-artifact"])
def test_an_oci_layout_of_no_weightstore_package_says_so(tmp_path, kind, capsys) -> None:
    """A layout holding a container image (as ``skopeo copy docker://alpine oci:DIR``
    writes it), or another client's artifact with no summary.json, is one line saying
    so and naming the layout."""
    oci = tmp_path / "oci"
    if kind == "container-image":
        _hand_layout(oci, "application/vnd.oci.image.config.v1+json",
                     {"data": b"not really a tar",
                      "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"})
        want = f"the OCI layout {oci} is a container image, not a model package"
    else:
        _hand_layout(oci, "application/vnd.unknown.config.v1+json",
                     {"data": b"onnx bytes", "mediaType": "application/vnd.oci.image.layer.v1.tar",
                      "notes": {TITLE: "model.onnx"}})
        want = "not a weightstore package: no summary.json among its layers"
    before = file_tree(oci)
    assert main(["assemble", str(oci)]) == 2
    err = capsys.readouterr().err.strip()
    assert want in err and "\n" not in err, err
    assert f"folder={oci})" in err or kind == "container-image", err
    assert file_tree(oci) == before and sorted(os.listdir(tmp_path)) == ["oci"]


def test_assemble_in_place(built, tmp_path, capsys) -> None:
    from oras.client import OrasClient

    OrasClient(hostname=built["host"], insecure=True).pull(
        target=built["refs"]["split"], outdir=str(tmp_path / "dir"))
    assert main(["assemble", str(tmp_path / "dir")]) == 0
    assert file_tree(tmp_path / "dir") == file_tree(built["packages"]["split"])
    assert [p.name for p in tmp_path.iterdir()] == ["dir"]  # no temp folder left
    capsys.readouterr()
    # a folder that already is the package assembles to itself
    assert main(["assemble", str(tmp_path / "dir"), "--json"]) == 0
    assert file_tree(tmp_path / "dir") == file_tree(built["packages"]["split"])
    summary = json.loads((tmp_path / "dir" / "summary.json").read_bytes())
    report = json.loads(capsys.readouterr().out)
    assert report["payloads"] == summary["totals"]["unique_payloads"]
    assert report["weight_files"] == len(summary["files"])
    assert report["files"] == len(file_tree(tmp_path / "dir"))


@pytest.mark.parametrize("layout", ["combined", "separate"])
def test_a_format1_artifact_still_pulls(built, layout, tmp_path) -> None:
    package = built["packages"][layout]
    ref, doc = push_format1(built["host"], f"interop/{layout}", "format1", package,
                            manifest_of(built["refs"][layout]))
    assert any(x["mediaType"] == "application/vnd.weightstore.assembly.v1+json"
               for x in doc["layers"])
    pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "store"))
    assert file_tree(tmp_path / "out") == file_tree(package)


def test_push_refuses_two_layers_with_one_path(built, tmp_path, capsys) -> None:
    """A package file where a payload's own file goes: one line, exit 2, nothing sent."""
    from weightstore.io.digests import digest_file
    from weightstore.package.assembly import summary_weight_files

    folder = tmp_path / "pkg"
    shutil.copytree(built["packages"]["combined"], folder)
    summary = json.loads((folder / "summary.json").read_bytes())
    key = summary_weight_files(summary)[0].pieces[0].key
    name = f"payloads/weight_{key.partition(':')[2]}"
    (folder / "payloads").mkdir()
    (folder / name).write_bytes(b"a file of the package")
    algo = summary["contents"][0]["digest"].partition(":")[0]
    summary["contents"].append({"path": name, "size": 21,
                                "digest": f"{algo}:{digest_file(algo, folder / name)}"})
    (folder / "summary.json").write_text(json.dumps(summary))
    ref = f"{built['host']}/interop/clash:1"
    assert main(["push", str(folder), ref, "--store", str(empty_store(tmp_path / "store"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one file path" in err[0] and name in err[0], err
    with pytest.raises(RegistryNotFoundError):
        RegistryClient(built["host"]).get_manifest(parse_reference(ref))


def _generic_folder(built, layout: str, folder: Path) -> Path:
    from modelpack_client import ModelPackClient

    ModelPackClient(insecure=True).pull(built["refs"][layout], folder)
    return folder


@pytest.mark.parametrize("damage", ["missing", "flipped", "link", "escape", "short"])
def test_assemble_refuses_bad_input_and_writes_nothing(built, tmp_path, capsys,
                                                       damage) -> None:
    folder = _generic_folder(built, "combined", tmp_path / "dir")
    payload = sorted((folder / "payloads").iterdir())[0]
    if damage == "missing":
        payload.unlink()
    elif damage == "flipped":
        data = bytearray(payload.read_bytes())
        data[7] ^= 1
        payload.write_bytes(bytes(data))
    elif damage == "short":
        payload.write_bytes(payload.read_bytes()[:-1])
    elif damage == "link":
        target = tmp_path / "elsewhere"
        payload.rename(target)
        os.symlink(target, payload)
    else:  # the summary names a weight file outside the folder
        summary = json.loads((folder / "summary.json").read_bytes())
        summary["files"][0]["name"] = "../outside"
        (folder / "summary.json").write_text(json.dumps(summary))
    before = {p: (p.is_symlink(), p.read_bytes()) for p in folder.rglob("*") if p.is_file()}
    for output in ([], ["--output", str(tmp_path / "pkg")]):
        assert main(["assemble", str(folder), *output]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("weightstore: error: "), err
        assert {p: (p.is_symlink(), p.read_bytes()) for p in folder.rglob("*")
                if p.is_file()} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["dir"] + (["elsewhere"] if damage == "link" else []))
