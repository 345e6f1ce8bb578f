"""pull of artifacts weightstore did not push: ModelPack artifacts pushed by modelpack-client
and plain ORAS artifacts pushed by oras-py, against the real registry fixture; hostile
artifacts pushed blob by blob over plain HTTP."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import requests
import zstandard

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import RegistryError
from weightstore.registry.pull import pull
from weightstore.store import WeightStore

from .registry_server import needs_registry, running_registry
from .samples import make_encoder, run_onnxruntime, sample_inputs

pytestmark = needs_registry

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
MODELPACK = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1"
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return make_encoder(vocab=200, hidden=32, heads=2, layers=1, ffn=64, max_seq=16)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, model) -> dict[str, Path]:
    """Three model folders: one file, one file with its external data beside it, and a
    model whose weights are per-weight files in a subfolder."""
    root = tmp_path_factory.mktemp("sources")
    plain = root / "plain"
    plain.mkdir()
    onnx.save(model, str(plain / "model.onnx"))
    external = root / "external"
    external.mkdir()
    onnx.save(_copy(model), str(external / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    per_weight = root / "per-weight"
    (per_weight / "weights").mkdir(parents=True)
    split = _copy(model)
    for i, tensor in enumerate(split.graph.initializer):
        if tensor.HasField("raw_data") and len(tensor.raw_data) >= 64:
            name = f"weights/w{i:03d}.bin"
            (per_weight / name).write_bytes(tensor.raw_data)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", name), ("offset", "0"),
                               ("length", str((per_weight / name).stat().st_size))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    onnx.save(split, str(per_weight / "model.onnx"))
    return {"plain": plain, "external": external, "per-weight": per_weight}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)  # onnx.save with external data changes the model it is given
    return out


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _same_tree(a: Path, b: Path) -> None:
    result = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:2000]


def _runs_as(model: onnx.ModelProto, path: Path) -> None:
    inputs = sample_inputs(model)
    for want, got in zip(run_onnxruntime(model, inputs), run_onnxruntime(path, inputs),
                         strict=True):
        assert want.tobytes() == got.tobytes()


def _modelpack_push(ref: str, layers: list) -> dict:
    from modelpack_client import ModelPackClient, ModelPackConfig
    from modelpack_client.models import ModelDescriptor, ModelTechnicalConfig

    config = ModelPackConfig(descriptor=ModelDescriptor(name="tiny"),
                             config=ModelTechnicalConfig(format="onnx"))
    result = ModelPackClient(insecure=True).push(ref, layers, config)
    return dict(result.manifest)


def _oras_push(ref: str, folder: Path, names: list[str]) -> None:
    import oras.client

    cwd = os.getcwd()
    os.chdir(folder)  # oras-py takes paths relative to the working folder
    try:
        oras.client.OrasClient(insecure=True).push(target=ref, files=names)
    finally:
        os.chdir(cwd)


def _pull_cli(ref: str, out: Path, store: Path, capsys) -> tuple[int, str]:
    code = main(["pull", ref, str(out), "--store", str(store)])
    return code, capsys.readouterr().err.strip()


# -- modelpack-client pushes, weightstore pulls ---------------------------------------------

@pytest.mark.parametrize("kind", ["plain", "external", "per-weight"])
def test_modelpack_client_raw_layers_pull_as_the_folder(registry, sources, model, tmp_path,
                                                        kind, capsys) -> None:
    from modelpack_client import ModelLayer

    src = sources[kind]
    ref = f"{registry.host}/mp/{kind}:1"
    manifest = _modelpack_push(ref, [
        ModelLayer(src / name, media_type=f"{WEIGHT}.raw", artifact_path=name)
        for name in _files(src)])
    assert {layer["mediaType"] for layer in manifest["layers"]} == {f"{WEIGHT}.raw"}
    out = tmp_path / "out"
    code, err = _pull_cli(ref, out, tmp_path / "store", capsys)
    assert code == 0, err
    _same_tree(src, out)
    _runs_as(model, out / "model.onnx")
    # raw layers went into the store by digest: a second pull fetches nothing
    report = pull(ref, tmp_path / "again", store=WeightStore(tmp_path / "store"))
    assert report.fetched == 0 and report.payloads == len(_files(src))
    _same_tree(src, tmp_path / "again")


@pytest.mark.parametrize("media", ["tar", "tar+gzip", "tar+zstd"])
def test_modelpack_client_tar_layers_are_unpacked(registry, sources, model, tmp_path,
                                                   media, capsys) -> None:
    from modelpack_client import ModelLayer

    src = sources["per-weight"]
    ref = f"{registry.host}/mp/tar-{media.replace('+', '-')}:1"
    manifest = _modelpack_push(ref, [
        ModelLayer(src / "model.onnx", media_type=f"{WEIGHT}.raw", artifact_path="model.onnx"),
        ModelLayer(src / "weights", media_type=f"{WEIGHT}.{media}", artifact_path="weights")])
    assert manifest["layers"][1]["mediaType"] == f"{WEIGHT}.{media}"
    out = tmp_path / "out"
    code, err = _pull_cli(ref, out, tmp_path / "store", capsys)
    assert code == 0, err
    _same_tree(src, out)
    _runs_as(model, out / "model.onnx")


# -- oras-py pushes, weightstore pulls ------------------------------------------------------

@pytest.mark.parametrize("kind", ["plain", "external", "per-weight"])
def test_oras_artifacts_pull_as_the_folder(registry, sources, model, tmp_path, kind,
                                           capsys) -> None:
    src = sources[kind]
    names = sorted(p.name for p in src.iterdir())  # a folder goes up as a tar+gzip layer
    ref = f"{registry.host}/oras/{kind}:1"
    _oras_push(ref, src, names)
    out = tmp_path / "out"
    code, err = _pull_cli(ref, out, tmp_path / "store", capsys)
    assert code == 0, err
    _same_tree(src, out)
    _runs_as(model, out / "model.onnx")


# -- a pulled model is a recipe source --------------------------------------------------------

RECIPE = """\
package: pulled
version: "1.0.0"
store: {{path: {store}}}
models:
  - name: encoder
    source: {src}
layouts:
  - {{name: combined, external_weight: combined}}
output: {out}
"""


@pytest.mark.parametrize("kind", ["plain", "external"])
def test_a_pulled_model_is_a_recipe_source(registry, sources, model, tmp_path, kind) -> None:
    from modelpack_client import ModelLayer

    src = sources[kind]
    ref = f"{registry.host}/mp/source-{kind}:1"
    _modelpack_push(ref, [ModelLayer(src / n, media_type=f"{WEIGHT}.raw", artifact_path=n)
                          for n in _files(src)])
    pulled = tmp_path / "pulled"
    pull(ref, pulled, store=WeightStore(tmp_path / "pull-store"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(store=tmp_path / "store", src=pulled / "model.onnx",
                                    out=tmp_path / "packages"))
    result = build(recipe, BuildOptions(jobs=1))
    (package,) = result.packages
    models = list(Path(package.path).glob("*.onnx"))
    assert len(models) == 1
    _runs_as(model, models[0])


# -- hostile artifacts ------------------------------------------------------------------------

def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(host: str, repo: str, data: bytes) -> str:
    digest = _digest(data)
    start = requests.post(f"http://{host}/v2/{repo}/blobs/uploads/", timeout=10)
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    sep = "&" if "?" in location else "?"
    done = requests.put(f"{location}{sep}digest={digest}", data=data, timeout=10,
                        headers={"Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.text
    return digest


def _layer(host: str, repo: str, data: bytes, media: str, **notes: str) -> dict:
    return {"mediaType": media, "digest": _put_blob(host, repo, data), "size": len(data),
            "annotations": notes}


def _put_artifact(host: str, repo: str, tag: str, layers: list[dict], *,
                  artifact_type: str | None = MODELPACK, diff_ids: list[str] | None = None,
                  config: bytes | None = None) -> str:
    if config is None:
        if artifact_type == MODELPACK:
            ids = [x["digest"] for x in layers] if diff_ids is None else diff_ids
            config = json.dumps({"descriptor": {"name": "x"}, "config": {"format": "onnx"},
                                 "modelfs": {"type": "layers", "diffIds": ids}}).encode()
        else:
            config = b"{}"
    media = CONFIG if artifact_type == MODELPACK else "application/vnd.unknown.config.v1+json"
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
           "config": {"mediaType": media, "digest": _put_blob(host, repo, config),
                      "size": len(config)},
           "layers": layers}
    if artifact_type is not None:
        doc["artifactType"] = artifact_type
    resp = requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=json.dumps(doc),
                        headers={"Content-Type": MANIFEST_TYPE}, timeout=10)
    assert resp.status_code == 201, resp.text
    return f"{host}/{repo}:{tag}"


def _tar(members: list[tuple[str, bytes | None, bytes]], compress: str = "") -> bytes:
    """A tar of (name, type, data) members: type None is a regular file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind is None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                info.type = kind
                info.linkname = data.decode()
                tf.addfile(info)
    raw = buf.getvalue()
    if compress == "gzip":
        return gzip.compress(raw, mtime=0)
    if compress == "zstd":
        return zstandard.ZstdCompressor().compress(raw)
    return raw


def _raw(host: str, repo: str, data: bytes, path: str | None, media: str = f"{WEIGHT}.raw",
         key: str = FILEPATH) -> dict:
    return _layer(host, repo, data, media, **({key: path} if path is not None else {}))


def _cases(host: str) -> dict[str, str]:
    """Each hostile artifact (its reference) by name; each holds a good file as well."""
    out: dict[str, str] = {}

    def put(name: str, layers, **kw) -> None:
        repo = f"hostile/{name}"
        good = _raw(host, repo, b"good bytes", "good.bin")
        out[name] = _put_artifact(host, repo, "1", [good, *layers(repo)], **kw)

    for name, path in {"traversal": "../evil", "inner-traversal": "a/../../evil",
                       "absolute": "/tmp/evil", "empty": "", "dot": "./", "backslash": "a\\b",
                       "nul": "a\x00b"}.items():
        put(f"path-{name}", lambda r, p=path: [_raw(host, r, b"evil", p)])
    put("no-path", lambda r: [_raw(host, r, b"evil", None)])
    put("oras-no-title", lambda r: [_raw(host, r, b"evil", None,
                                         "application/vnd.oci.image.layer.v1.tar")],
        artifact_type=None)
    put("duplicate", lambda r: [_raw(host, r, b"other", "good.bin")])
    put("duplicate-title", lambda r: [_raw(host, r, b"other", "good.bin", key=TITLE)])
    put("file-under-file", lambda r: [_raw(host, r, b"other", "good.bin/x")])
    put("unknown-type", lambda r: [_raw(host, r, b"x", "x.bin",
                                        "application/vnd.example.thing.v1")])
    put("diff-count", lambda r: [], diff_ids=[])
    put("diff-mismatch", lambda r: [], diff_ids=["sha256:" + "0" * 64])
    tar_cases = {
        "tar-symlink": [("link", tarfile.SYMTYPE, b"/etc/passwd")],
        "tar-hardlink": [("link", tarfile.LNKTYPE, b"good.bin")],
        "tar-traversal": [("../evil", None, b"evil")],
        "tar-absolute": [("/tmp/evil", None, b"evil")],
        "tar-fifo": [("fifo", tarfile.FIFOTYPE, b"")],
        "tar-duplicate": [("d/x", None, b"1"), ("d/x", None, b"2")],
        "tar-over-raw": [("good.bin", None, b"other")],
        "tar-file-then-folder": [("d", None, b"1"), ("d/x", None, b"2")],
    }
    for name, members in tar_cases.items():
        put(name, lambda r, m=members: [_layer(host, r, _tar(m), f"{WEIGHT}.tar",
                                               **{FILEPATH: "d"})])
    # a few kilobytes of gzip declaring a member of a terabyte (a decompression bomb)
    bomb = tarfile.TarInfo("d/huge")
    bomb.size = 1 << 40
    put("tar-bomb", lambda r: [_layer(host, r, gzip.compress(
        bomb.tobuf(tarfile.PAX_FORMAT) + bytes(1 << 16), mtime=0), f"{WEIGHT}.tar+gzip",
        **{FILEPATH: "d"})])
    # a compressed tar whose diffId is its blob's digest, not that of the tar inside
    put("tar-gzip-diff", lambda r: [_layer(host, r, _tar([("d/x", None, b"1")], "gzip"),
                                           f"{WEIGHT}.tar+gzip", **{FILEPATH: "d"})])
    # a tar+zstd layer whose frame lost the last byte of its checksum: the tar inside is
    # whole (its diffId matches), the layer is not
    whole = _tar([("d/x", None, b"1")])
    cut = zstandard.ZstdCompressor(write_checksum=True).compress(whole)[:-1]
    put("tar-zstd-cut", lambda r: [_layer(host, r, cut, f"{WEIGHT}.tar+zstd",
                                          **{FILEPATH: "d"})],
        diff_ids=[_digest(b"good bytes"), _digest(whole)])
    return out


@pytest.fixture(scope="module")
def hostile(registry) -> dict[str, str]:
    return _cases(registry.host)


UNSAFE = "unsafe file path"
TWICE = "writes a path twice"
NOT_REGULAR = "other than regular files and folders"
HOSTILE = {
    "path-traversal": UNSAFE, "path-inner-traversal": UNSAFE, "path-absolute": UNSAFE,
    "path-empty": UNSAFE, "path-dot": UNSAFE, "path-backslash": UNSAFE, "path-nul": UNSAFE,
    "no-path": "names no file", "oras-no-title": "names no file",
    "duplicate": "two layers for one file path", "duplicate-title": "two layers for one",
    "file-under-file": "runs through another file",
    "unknown-type": "media type ModelPack does not define",
    "diff-count": "diffIds do not match the layers", "diff-mismatch": "diffId is not its digest",
    "tar-symlink": NOT_REGULAR, "tar-hardlink": NOT_REGULAR, "tar-fifo": NOT_REGULAR,
    "tar-traversal": "unsafe path", "tar-absolute": "unsafe path", "tar-duplicate": TWICE,
    "tar-over-raw": TWICE, "tar-file-then-folder": TWICE,
    "tar-gzip-diff": "another tar than its diffId names",
    "tar-zstd-cut": "ends inside a frame",
    "tar-bomb": "would unpack more bytes than the disk has free",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_foreign_artifacts_are_refused(hostile, tmp_path, case, capsys) -> None:
    out = tmp_path / "out"
    code, err = _pull_cli(hostile[case], out, tmp_path / "store", capsys)
    assert code == 2, err
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert HOSTILE[case] in err and str(tmp_path) not in err, err
    assert sorted(os.listdir(tmp_path)) in ([], ["store"])  # no output, no temp folder
    assert not (tmp_path.parent / "evil").exists() and not Path("/tmp/evil").exists()
    # with --force over a folder of the user's, the folder stays as it was
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["pull", hostile[case], str(out), "--store", str(tmp_path / "store"),
                 "--force"]) == 2
    capsys.readouterr()
    assert _files(out) == ["mine.txt"] and (out / "mine.txt").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) in (["out"], ["out", "store"])


def test_hostile_cases_differ_from_a_good_artifact_only_in_their_flaw(registry, tmp_path) -> None:
    """The good layer every hostile case holds pulls on its own, and so does an ORAS
    artifact with a title and a tar layer of a folder: the refusals are for the flaws."""
    host = registry.host
    good = _raw(host, "hostile/good", b"good bytes", "good.bin")
    folder = _layer(host, "hostile/good", _tar([("d", tarfile.DIRTYPE, b""),
                                                 ("d/x", None, b"1")], "gzip"),
                    f"{WEIGHT}.tar+gzip", **{FILEPATH: "d"})
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(
            _tar([("d", tarfile.DIRTYPE, b""), ("d/x", None, b"1")], "gzip")))) as tf:
        assert [m.name for m in tf] == ["d", "d/x"]
    raw_tar = _tar([("d", tarfile.DIRTYPE, b""), ("d/x", None, b"1")])
    ref = _put_artifact(host, "hostile/good", "1", [good, folder],
                        diff_ids=[good["digest"], _digest(raw_tar)])
    pull(ref, tmp_path / "mp", store=WeightStore(tmp_path / "s"))
    assert _files(tmp_path / "mp") == ["d/x", "good.bin"]
    assert (tmp_path / "mp" / "good.bin").read_bytes() == b"good bytes"
    plain = _raw(host, "hostile/good", b"good bytes", "good.bin",
                 "application/vnd.oci.image.layer.v1.tar", key=TITLE)
    ref = _put_artifact(host, "hostile/good", "2", [plain], artifact_type=None)
    pull(ref, tmp_path / "oras", store=WeightStore(tmp_path / "s"))
    assert _files(tmp_path / "oras") == ["good.bin"]


def test_foreign_artifacts_have_no_device_or_scenario_variants(registry, sources,
                                                               tmp_path) -> None:
    from modelpack_client import ModelLayer

    src = sources["plain"]
    ref = f"{registry.host}/mp/variant:1"
    _modelpack_push(ref, [ModelLayer(src / "model.onnx", media_type=f"{WEIGHT}.raw",
                                     artifact_path="model.onnx")])
    with pytest.raises(RegistryError, match="weightstore artifact"):
        pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "s"), device="npu")
    assert not (tmp_path / "out").exists()


def test_an_empty_raw_layer_is_an_empty_file_and_dot_slash_is_relative(registry,
                                                                        tmp_path) -> None:
    host = registry.host
    empty = _raw(host, "edge/empty", b"", "empty.txt")
    data = np.arange(10, dtype=np.float32).tobytes()
    ref = _put_artifact(host, "edge/empty", "1", [empty, _raw(host, "edge/empty", data,
                                                               "./sub/w.bin")])
    pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "s"))
    assert (tmp_path / "out" / "empty.txt").read_bytes() == b""
    assert (tmp_path / "out" / "sub" / "w.bin").read_bytes() == data


def test_a_package_relayed_by_another_client_assembles_back(registry, model, tmp_path) -> None:
    """weightstore push, modelpack-client pull and push to another repository (now a
    foreign artifact: no fingerprint), weightstore pull, weightstore assemble: the
    combined package comes back byte for byte."""
    from modelpack_client import ModelLayer, ModelPackClient

    src = tmp_path / "model.onnx"
    onnx.save(model, str(src))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(store=tmp_path / "store", src=src, out=tmp_path / "out"))
    (package,) = build(recipe, BuildOptions(jobs=1)).packages
    ref = f"{registry.host}/relay/own:1"
    from weightstore.registry.push import push

    push(package.path, ref, store=WeightStore(tmp_path / "store"))
    generic = tmp_path / "generic"
    ModelPackClient(insecure=True).pull(ref, generic)
    relayed = f"{registry.host}/relay/foreign:1"
    manifest = _modelpack_push(relayed, [
        ModelLayer(generic / n, media_type=f"{WEIGHT}.raw", artifact_path=n)
        for n in _files(generic)])
    assert "org.weightstore.fingerprint" not in (manifest.get("annotations") or {})
    pulled = tmp_path / "pulled"
    report = pull(relayed, pulled, store=WeightStore(tmp_path / "pull-store"))
    assert report.payloads == len(_files(generic))
    _same_tree(generic, pulled)
    assert main(["assemble", str(pulled), "--output", str(tmp_path / "assembled")]) == 0
    _same_tree(Path(package.path), tmp_path / "assembled")


# -- what is not a model package ----------------------------------------------------------

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _put_manifest(host: str, repo: str, tag: str, doc: dict, media: str) -> dict:
    data = json.dumps(doc).encode()
    resp = requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=data,
                        headers={"Content-Type": media}, timeout=10)
    assert resp.status_code == 201, resp.text
    return {"mediaType": media, "digest": _digest(data), "size": len(data)}


def _image(host: str, repo: str, tag: str, *, docker: bool = False) -> dict:
    """A container image: an image config and a gzipped tar layer (a root file system)."""
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layer = _tar([("etc/hostname", None, b"box\n")], "gzip")
    if docker:
        kinds = ("application/vnd.docker.container.image.v1+json",
                 "application/vnd.docker.image.rootfs.diff.tar.gzip", DOCKER_MANIFEST)
    else:
        kinds = (IMAGE_CONFIG, "application/vnd.oci.image.layer.v1.tar+gzip", MANIFEST_TYPE)
    doc = {"schemaVersion": 2, "mediaType": kinds[2],
           "config": {"mediaType": kinds[0], "digest": _put_blob(host, repo, config),
                      "size": len(config)},
           "layers": [{"mediaType": kinds[1], "digest": _put_blob(host, repo, layer),
                       "size": len(layer)}]}
    return _put_manifest(host, repo, tag, doc, kinds[2])


def _not_models(host: str) -> dict[str, tuple[str, str]]:
    """Each reference that is no model package, and what pull must call it."""
    out = {}
    image = _image(host, "other/image", "1")
    out["oci-image"] = (f"{host}/other/image:1", "is a container image")
    _image(host, "other/docker", "1", docker=True)
    out["docker-image"] = (f"{host}/other/docker:1", "is a Docker container image")
    arm = _image(host, "other/index", "arm")
    amd = _image(host, "other/index", "amd")
    platforms = [{**amd, "platform": {"architecture": "amd64", "os": "linux"}},
                 {**arm, "platform": {"architecture": "arm64", "os": "linux",
                                      "variant": "v8"}}]
    _put_manifest(host, "other/index", "1", {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                              "manifests": platforms}, OCI_INDEX)
    out["oci-index"] = (f"{host}/other/index:1",
                        "is an OCI image index of 2 manifests (linux/amd64, linux/arm64/v8)")
    d1 = _image(host, "other/list", "amd", docker=True)
    _put_manifest(host, "other/list", "1", {"schemaVersion": 2, "mediaType": DOCKER_LIST,
                                             "manifests": [{**d1, "platform": {
                                                 "architecture": "amd64", "os": "linux"}}]},
                  DOCKER_LIST)
    out["docker-list"] = (f"{host}/other/list:1",
                          "is a Docker manifest list of 1 manifest (linux/amd64)")
    chart = json.dumps({"name": "web", "version": "1.2.3", "apiVersion": "v2"}).encode()
    content = _tar([("web/Chart.yaml", None, b"name: web\nversion: 1.2.3\n")], "gzip")
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
           "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json",
                      "digest": _put_blob(host, "other/chart", chart), "size": len(chart)},
           "layers": [{"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                       "digest": _put_blob(host, "other/chart", content),
                       "size": len(content)}],
           "annotations": {"org.opencontainers.image.title": "web",  # as helm push writes
                           "org.opencontainers.image.version": "1.2.3"}}
    _put_manifest(host, "other/chart", "1.2.3", doc, MANIFEST_TYPE)
    out["helm"] = (f"{host}/other/chart:1.2.3", "is a Helm chart (web 1.2.3)")
    assert image["digest"]
    return out


@pytest.fixture(scope="module")
def not_models(registry) -> dict[str, tuple[str, str]]:
    return _not_models(registry.host)


@pytest.mark.parametrize("case", ["oci-image", "docker-image", "oci-index", "docker-list",
                                  "helm"])
def test_pulling_what_is_not_a_model_package_says_what_it_is(not_models, case, tmp_path,
                                                             capsys) -> None:
    ref, what = not_models[case]
    code, err = _pull_cli(ref, tmp_path / "out", tmp_path / "store", capsys)
    assert code == 2, err
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert f"{ref} {what}, not a model package" in err, err
    assert not (tmp_path / "out").exists()


def test_through_a_mirror_an_index_is_still_named(not_models, tmp_path, monkeypatch,
                                                  capsys) -> None:
    """With a mirror configured, the tag is resolved at the origin with the same Accept
    header: an index is named as such, not "not found"."""
    ref, what = not_models["oci-index"]
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{ref.split("/")[0]}"\n'
                    '[[registry.mirror]]\nlocation = "127.0.0.1:9"\n')  # nothing listens
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    code, err = _pull_cli(ref, tmp_path / "out", tmp_path / "store", capsys)
    assert code == 2 and f"{ref} {what}, not a model package" in err, err
