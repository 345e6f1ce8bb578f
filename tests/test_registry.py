"""push and pull against a real registry (Debian's docker-registry, CNCF distribution)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import weightstore
from weightstore.cli import main
from weightstore.errors import (
    IntegrityError,
    PackageError,
    RegistryAuthError,
    RegistryDigestError,
    RegistryError,
    RegistryNotFoundError,
    RegistryUnreachableError,
)
from weightstore.packaging.bundles import check_live
from weightstore.registry.artifact import ARTIFACT_TYPE, sha256_digest
from weightstore.registry.client import RegistryClient, Transport
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.registry.reference import parse_reference
from weightstore.resolve.runnable import runnable_variant
from weightstore.store import WeightStore

from .helpers import every_layout, flip_live_byte, relocated_away
from .registry_proxy import relay
from .registry_server import RegistryServer, needs_registry, running_registry
from .samples import make_encoder, run_onnxruntime, sample_inputs

pytestmark = needs_registry

LAYOUTS = ("embedded", "separate", "combined", "shared", "split", "split-sep")

CHANGED = "encoder.layer.1.attention.output.dense.weight"


def _changed(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with one tensor's values changed, and that tensor's byte size."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, t in enumerate(out.graph.initializer):
        if t.name == CHANGED:
            values = numpy_helper.to_array(t) + np.float32(0.5)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, t.name))
            return out, values.nbytes
    raise AssertionError(f"no initializer {CHANGED}")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("packages")
    model = make_encoder()
    v1 = every_layout(folder, model, "1.0.0")
    changed, size = _changed(model)
    v2 = every_layout(folder, changed, "1.0.1")
    return {"folder": folder, "model": model, "v1": v1, "v2": v2, "changed_bytes": size,
            "store": WeightStore(folder / "store")}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


def _payloads(folder: Path) -> dict[str, int]:
    summary = json.loads((folder / "summary.json").read_text())
    return {w["id"]: w["size"] for m in summary["models"] for w in m["external_weights"]}


def _same_tree(a: Path, b: Path) -> None:
    result = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:2000]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_is_bit_identical_and_runs(packages, registry, tmp_path, layout) -> None:
    source = packages["v1"][layout]
    ref = f"{registry.host}/rt/{layout}:1.0.0"
    report = push(source, ref, store=packages["store"])
    assert report.uploaded + report.present + report.mounted == report.blobs
    store = WeightStore(tmp_path / "store")
    pulled = pull(ref, tmp_path / "out", store=store)
    _same_tree(source, tmp_path / "out")
    inputs = sample_inputs(packages["model"], seed=3)
    for e, a in zip(run_onnxruntime(packages["model"], inputs),
                    run_onnxruntime(tmp_path / "out" / "encoder.onnx", inputs), strict=True):
        assert e.tobytes() == a.tobytes()
    if layout != "embedded":
        assert pulled.fetched_bytes == pulled.payload_bytes > 0
        assert store.verify().ok
        # a blob's download is locked on its partial file, which went into the store:
        # no lock file and no partial is left; the package folder's lock stays, as a
        # build's
        assert not list(store.root.glob(".pull-*"))
        assert [p.name for p in (store.root / "locks").iterdir()] == [
            next((store.root / "locks").glob("*.lock")).name]
        assert [r.folder for r in store.roots()] == [str((tmp_path / "out").absolute())]
    # the same pull again reads every payload from the store
    again = pull(ref, tmp_path / "again", store=store)
    assert again.fetched == 0
    _same_tree(source, tmp_path / "again")


def test_manifest_shape_and_generic_file_paths(packages, registry) -> None:
    source = packages["v1"]["separate"]
    ref = parse_reference(f"{registry.host}/shape/separate:1")
    first = push(source, str(ref), store=packages["store"])
    again = push(source, str(ref), store=packages["store"])
    assert again.manifest_digest == first.manifest_digest  # deterministic
    assert again.uploaded == 0 and again.present == again.blobs and again.hashed_bytes == 0
    data, _ = RegistryClient(ref.host).get_manifest(ref)
    doc = json.loads(data)
    assert doc["artifactType"] == ARTIFACT_TYPE
    assert doc["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    summary = json.loads((source / "summary.json").read_text())
    weight_files = {f["name"] for f in summary["files"]}
    paths = {layer.get("annotations", {}).get("org.cncf.model.filepath")
             for layer in doc["layers"]}
    # a generic client gets every file of the folder, weight files included
    on_disk = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()}
    assert weight_files <= paths and on_disk <= paths
    payloads = [x for x in doc["layers"] if "org.weightstore.payload" in x["annotations"]]
    assert len(payloads) == summary["totals"]["unique_payloads"]
    # every layer is a file at its path for ModelPack and ORAS clients alike; graphs
    # and payloads are weights, records weight configs
    for layer in doc["layers"]:
        notes = layer["annotations"]
        assert notes["org.cncf.model.filepath"] == notes["org.opencontainers.image.title"]
        path = notes["org.cncf.model.filepath"]
        assert layer["mediaType"] == (
            "application/vnd.cncf.model.weight.v1.raw"
            if path.endswith(".onnx") or layer in payloads
            else "application/vnd.cncf.model.weight.config.v1.raw"), path
    assert paths == on_disk  # nothing beside the package's own files


def test_one_tensor_update_uploads_about_that_tensor(packages, registry) -> None:
    store = packages["store"]
    ref = f"{registry.host}/update/combined"
    push(packages["v1"]["combined"], f"{ref}:1.0.0", store=store)
    report = push(packages["v2"]["combined"], f"{ref}:1.0.1", store=store)
    old, new = (_payloads(packages[v]["combined"]) for v in ("v1", "v2"))
    changed = sum(size for key, size in new.items() if key not in old)
    # the tensor and the fp16 copy the scenario keeps of it
    assert changed == packages["changed_bytes"] * 3 // 2
    assert report.hashed_bytes == changed  # only the new payloads were read
    assert report.uploaded_weight_bytes == changed
    # besides: summary and config, and the device records that list the tensor's key (the
    # models, whose external data names ranges and no digest, are unchanged)
    records = [p.relative_to(packages["v1"]["combined"])
               for p in packages["v1"]["combined"].glob("devices/*/bundle.json")]
    changed_records = sum((packages["v1"]["combined"] / r).read_bytes()
                          != (packages["v2"]["combined"] / r).read_bytes() for r in records)
    assert changed_records == len(records) >= 1
    assert report.uploaded == 2 + 2 + changed_records


def _runs_and_is_verified(folder: Path, expected: list, inputs: dict,
                          weights: list[dict]) -> None:
    """The variant folder a pull wrote runs bit-identically in onnxruntime as it is, and
    a flipped byte in a live payload is caught against the keys of its own record."""
    assert check_live(folder / "encoder.onnx", "half", verify=True) == []
    for e, a in zip(expected, run_onnxruntime(folder / "encoder.onnx", inputs), strict=True):
        assert e.tobytes() == a.tobytes()
    flip_live_byte(folder, weights)
    with pytest.raises(IntegrityError, match="do not match"):
        check_live(folder / "encoder.onnx", "half", verify=True)
    with pytest.raises(IntegrityError, match="do not match"), \
            weightstore.resolve(folder / "encoder.onnx") as resolved:
        weightstore.load(resolved)


def test_device_pull_fetches_only_live_payloads(packages, registry, tmp_path) -> None:
    source = packages["v1"]["split"]
    ref = f"{registry.host}/device/split:1.0.0"
    push(source, ref, store=packages["store"])
    report = pull(ref, tmp_path / "npu", store=WeightStore(tmp_path / "store"), device="npu")
    bundle = json.loads((source / "devices" / "npu" / "bundle.json").read_text())
    live = sum(m["live_bytes"] for m in bundle["models"])
    assert report.fetched_bytes == report.payload_bytes == live
    summary = json.loads((source / "summary.json").read_text())
    assert live < summary["totals"]["unique_payload_bytes"]
    # the folder's own record is the device's, its live payloads at their places in the
    # folder's own weight files: its models' payloads are verified against the keys it
    # lists
    own = json.loads((tmp_path / "npu" / "bundle.json").read_text())
    assert relocated_away(own) == relocated_away(bundle)
    inputs = sample_inputs(packages["model"], seed=4)
    expected = run_onnxruntime(runnable_variant(source / "encoder.onnx", "half"), inputs)
    _runs_and_is_verified(tmp_path / "npu", expected, inputs,
                          own["models"][0]["external_weights"])
    # 1.0.0 -> 1.0.1 on the device: only the changed tensor travels
    push(packages["v2"]["split"], f"{registry.host}/device/split:1.0.1",
         store=packages["store"])
    update = pull(f"{registry.host}/device/split:1.0.1", tmp_path / "npu2",
                  store=WeightStore(tmp_path / "store"), device="npu")
    assert update.fetched == 1
    # the cast scenario keeps an fp16 copy: half the float32 tensor's bytes
    assert update.fetched_bytes == packages["changed_bytes"] // 2
    scenario = pull(ref, tmp_path / "half", store=WeightStore(tmp_path / "s2"),
                    scenario="half")
    assert scenario.fetched_bytes == live
    # a scenario's folder has a record of its own, as a device's
    record = json.loads((tmp_path / "half" / "bundle.json").read_text())
    assert record["models"][0]["external_weights"] == own["models"][0]["external_weights"]
    _runs_and_is_verified(tmp_path / "half", expected, inputs,
                          record["models"][0]["external_weights"])


def test_cross_repository_mount(packages, registry, tmp_path) -> None:
    source = packages["v1"]["combined"]
    push(source, f"{registry.host}/mount/a:1", store=WeightStore(tmp_path / "s1"))
    report = push(source, f"{registry.host}/mount/b:1", store=WeightStore(tmp_path / "s2"),
                  mount_from=["mount/a"])
    assert report.uploaded == 0 and report.mounted == report.blobs
    pull(f"{registry.host}/mount/b:1", tmp_path / "out", store=WeightStore(tmp_path / "s3"))
    _same_tree(source, tmp_path / "out")


def test_registry_killed_mid_push_then_rerun(packages, tmp_path) -> None:
    source = packages["v1"]["combined"]
    (tmp_path / "reg").mkdir()
    server = RegistryServer(tmp_path / "reg").start()
    ref = f"{server.host}/kill/a:1"
    uploads = server.folder / "data" / "docker" / "registry" / "v2" / "repositories" / "kill"
    transport = Transport(chunk_size=8192, attempts=2, backoff=0.01, connect_timeout=1)
    stop = threading.Event()

    def killer() -> None:
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            if any(uploads.glob("a/_uploads/*/data")):
                server.kill()
                return
            time.sleep(0.001)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with pytest.raises(RegistryUnreachableError):
            push(source, ref, store=packages["store"], transport=transport, jobs=1)
    finally:
        stop.set()
        thread.join()
    server.start()
    try:
        with pytest.raises(RegistryNotFoundError):  # no manifest, no tag
            RegistryClient(server.host).get_manifest(parse_reference(ref))
        report = push(source, ref, store=packages["store"], transport=transport)
        assert report.uploaded >= 1
        pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "store"))
        _same_tree(source, tmp_path / "out")
        assert packages["store"].verify().ok
    finally:
        server.stop()


class _Corrupting(BaseHTTPRequestHandler):
    """Forwards to the registry; flips one byte of one blob's body."""

    upstream = ""
    target = ""

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        relay(self, self.upstream, b"", change=self._corrupt)

    def _corrupt(self, body: bytes) -> bytes:
        if self.command == "GET" and self.path.endswith(self.target) and body:
            flipped = bytearray(body)
            flipped[len(body) // 2] ^= 0x01
            return bytes(flipped)
        return body

    do_GET = do_HEAD = _forward


def test_corrupting_proxy_fails_naming_the_digest(packages, registry, tmp_path) -> None:
    source = packages["v1"]["combined"]
    ref = parse_reference(f"{registry.host}/proxy/a:1")
    push(source, str(ref), store=packages["store"])
    doc = json.loads(RegistryClient(ref.host).get_manifest(ref)[0])
    target = max((x for x in doc["layers"]
                  if x["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"),
                 key=lambda x: x["size"])["digest"]
    handler = type("H", (_Corrupting,), {"upstream": registry.host, "target": target})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        store = WeightStore(tmp_path / "store")
        with pytest.raises(RegistryDigestError) as info:
            pull(f"127.0.0.1:{proxy.server_port}/proxy/a:1", tmp_path / "out", store=store,
                 jobs=1)
        assert info.value.context["digest"] == target
        assert target in str(info.value)
        assert not (tmp_path / "out").exists()
        keys = json.loads((source / "summary.json").read_text())["models"][0][
            "external_weights"]
        bad = [w["id"] for w in keys if w["size"] == max(x["size"] for x in keys)]
        assert not store.locate(bad)  # the corrupted payload never entered the store
        assert not [p for p in store.root.iterdir() if p.name.endswith(".tmp")]
        assert store.verify().ok
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_auth_refused_and_accepted(packages, tmp_path, monkeypatch, capsys) -> None:
    import bcrypt

    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text("ci:" + bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
                        + "\n")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("WEIGHTSTORE_REGISTRY_USERNAME", raising=False)
    with running_registry(tmp_path / "reg", htpasswd=htpasswd) as server:
        ref = f"{server.host}/auth/a:1"
        source = packages["v1"]["combined"]
        with pytest.raises(RegistryAuthError):
            push(source, ref, store=packages["store"])
        monkeypatch.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
        monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "wrong")
        assert main(["push", str(source), ref]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("weightstore: error: authentication refused") and "\n" not in err
        monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "s3cret")
        assert main(["push", str(source), ref]) == 0
        monkeypatch.delenv("WEIGHTSTORE_REGISTRY_USERNAME")
        (tmp_path / "docker").mkdir()
        (tmp_path / "docker" / "config.json").write_text(json.dumps(
            {"auths": {server.host: {"username": "ci", "password": "s3cret"}}}))
        assert main(["pull", ref, str(tmp_path / "out")]) == 0
        _same_tree(source, tmp_path / "out")


def _put_manifest(client: RegistryClient, ref, doc: dict) -> None:
    config = b'{"config":{"format":"onnx"},"modelfs":{"type":"layers","diffIds":[]}}'
    digest = sha256_digest(config)
    location = client.start_upload(ref, digest)
    client.put_monolithic(ref, location, digest, len(config), lambda s, e: [config[s:e]])
    doc["config"] = {"mediaType": "application/vnd.cncf.model.config.v1+json",
                     "digest": digest, "size": len(config)}
    client.put_manifest(ref, ref.tag, json.dumps(doc).encode())


@pytest.mark.parametrize("doc, why", [
    # without weightstore's fingerprint: a foreign artifact (tests/test_registry_foreign.py)
    ({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
      "layers": []}, "lists no layers"),
    ({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
      "artifactType": ARTIFACT_TYPE, "layers": []}, "lists no layers"),
    ({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
      "artifactType": ARTIFACT_TYPE, "layers": [],
      "annotations": {"org.weightstore.fingerprint": "blake3:" + "0" * 64}},
     "summary.json has no layer|no layer"),
])
def test_malformed_manifest_is_refused(registry, tmp_path, doc, why) -> None:
    ref = parse_reference(f"{registry.host}/bad/m:{len(why)}")
    _put_manifest(RegistryClient(ref.host), ref, doc)
    with pytest.raises(RegistryError, match=why):
        pull(str(ref), tmp_path / "out", store=WeightStore(tmp_path / "store"))
    assert not (tmp_path / "out").exists()


def test_pull_refuses_a_non_empty_folder(packages, registry, tmp_path, capsys) -> None:
    ref = f"{registry.host}/cli/a:1"
    assert main(["push", str(packages["v1"]["separate"]), ref, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blobs"] > 0
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    assert main(["pull", ref, str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep"
    with pytest.raises(PackageError):
        pull(f"{registry.host}/cli/a:1", tmp_path / "dev", store=WeightStore(tmp_path / "s"),
             device="nope")


def test_quiet_pull_prints_nothing(packages, registry, tmp_path) -> None:
    """pull -q prints nothing, in a process of its own whose exit is seen too: a lock built
    half-way (filelock 3 refused a keyword after making the object) printed an 'Exception
    ignored in BaseFileLock.__del__' block for every blob a pull took."""
    ref = f"{registry.host}/quiet/a:1"
    source = packages["v1"]["separate"]
    push(source, ref, store=packages["store"])
    done = subprocess.run([sys.executable, "-m", "weightstore", "pull", ref,
                           str(tmp_path / "out"), "--store", str(tmp_path / "store"), "-q"],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", ""), done.stderr[-2000:]
    _same_tree(source, tmp_path / "out")


def test_bearer_token_flow(packages, tmp_path, monkeypatch) -> None:
    from .registry_tokens import TokenService

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "t0ken")
    with TokenService(tmp_path, "ci", "t0ken") as tokens, running_registry(
            tmp_path / "reg", auth=tokens.config()) as server:
        ref = f"{server.host}/bearer/a:1"
        source = packages["v1"]["separate"]
        push(source, ref, store=WeightStore(tmp_path / "s1"))
        pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "s2"))
        _same_tree(source, tmp_path / "out")
        assert tokens.issued >= 2  # one per scope and client, never one per request
        assert tokens.issued <= 4
        monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "wrong")
        with pytest.raises(RegistryAuthError, match="token service"):
            pull(ref, tmp_path / "again", store=WeightStore(tmp_path / "s3"))


@pytest.mark.parametrize("layout", ["combined", "separate"])
def test_concurrent_pulls_into_one_store_download_each_blob_once(packages, registry, tmp_path,
                                                                layout) -> None:
    """Two pulls of one artifact into one store at once: each blob is downloaded by one
    of them (the other waits on its partial file, then takes it from the store, a
    per-weight file copied from there instead of written by its download), and both
    folders are the package."""
    source = packages["v1"][layout]
    ref = f"{registry.host}/together/{layout}:1"
    push(source, ref, store=packages["store"])
    store_root = tmp_path / "store"
    reports: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            reports[name] = pull(ref, tmp_path / name, store=WeightStore(store_root), jobs=2)
        except BaseException as exc:
            reports[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    a, b = reports["a"], reports["b"]
    assert not isinstance(a, BaseException) and not isinstance(b, BaseException), reports
    # never one blob twice, and each counts only what it downloaded
    assert a.fetched + b.fetched == a.payloads == b.payloads > 0
    assert a.fetched_bytes + b.fetched_bytes == a.payload_bytes
    _same_tree(source, tmp_path / "a")
    _same_tree(source, tmp_path / "b")
    assert WeightStore(store_root).verify().ok
    assert not list(store_root.glob(".pull-*"))


@pytest.mark.parametrize("layout", ["combined", "separate"])
def test_pull_resumes_a_partial_blob(packages, registry, tmp_path, layout) -> None:
    """A kept prefix is resumed, in a combined file (assembled from the store) and in a
    per-weight file (written by the download itself, the kept prefix included)."""
    source = packages["v1"][layout]
    ref = parse_reference(f"{registry.host}/resume/{layout}:1")
    push(source, str(ref), store=packages["store"])
    doc = json.loads(RegistryClient(ref.host).get_manifest(ref)[0])
    layer = max((x for x in doc["layers"]
                 if x["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"),
                key=lambda x: x["size"])
    with RegistryClient(ref.host).open_blob(ref, layer["digest"]) as resp:
        data = resp.read(1 << 30)
    half = len(data) // 2
    store = WeightStore(tmp_path / "store")
    store.root.mkdir()
    partial = store.root / f".pull-{layer['digest'].split(':')[1]}.tmp"
    partial.write_bytes(data[:half])  # left by a pull that was cut off
    report = pull(str(ref), tmp_path / "out", store=store)
    assert report.fetched_bytes == report.payload_bytes - half
    _same_tree(source, tmp_path / "out")
    # a kept prefix that is wrong costs one fetch from 0, never a wrong byte
    store2 = WeightStore(tmp_path / "store2")
    store2.root.mkdir()
    (store2.root / partial.name).write_bytes(b"\0" * half)
    report = pull(str(ref), tmp_path / "out2", store=store2)
    assert report.fetched_bytes == report.payload_bytes + (len(data) - half)
    _same_tree(source, tmp_path / "out2")
    assert store2.verify().ok


class _Dropping(BaseHTTPRequestHandler):
    """Forwards to the registry (keeping the client's Host, so upload locations point back
    here); the first two chunk uploads it sees are cut off halfway, as a broken link
    would."""

    upstream = ""
    dropped: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.command == "PATCH" and len(self.dropped) < 2:
            self.dropped.append(self.path)
            conn = http.client.HTTPConnection(self.upstream, timeout=30)
            conn.putrequest("PATCH", self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                conn.putheader(k, v)
            conn.endheaders(body[: len(body) // 2])
            conn.close()  # the registry receives half a chunk
            self.close_connection = True
            self.connection.close()
            return
        relay(self, self.upstream, body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _forward


def test_a_chunk_cut_off_midway_is_resumed_or_restarted(packages, registry, tmp_path,
                                                        monkeypatch) -> None:
    source = packages["v1"]["combined"]
    asked: list[int] = []  # the registry may answer with an offset or refuse the session
    status = RegistryClient.upload_status

    def counted(self, *args):
        asked.append(1)
        return status(self, *args)

    monkeypatch.setattr(RegistryClient, "upload_status", counted)
    handler = type("H", (_Dropping,), {"upstream": registry.host, "dropped": []})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        ref = f"127.0.0.1:{proxy.server_port}/chunks/a:1"
        # two attempts per request: the chunk fails twice, then the push asks the registry
        # how far the upload got and goes on from there
        transport = Transport(chunk_size=16384, backoff=0.01, attempts=2)
        report = push(source, ref, store=WeightStore(tmp_path / "s1"), transport=transport,
                      jobs=1)
        assert len(handler.dropped) == 2 and report.uploaded == report.blobs
        assert asked  # the push asked the registry where the upload stood
        pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "s2"))
        _same_tree(source, tmp_path / "out")
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_a_tampered_sha256_mapping_is_computed_again(packages, registry, tmp_path) -> None:
    """The remembered key -> sha256 rows sit in a store a group may share: swapping two of
    them must not make a push skip uploads and name other blobs for those payloads."""
    import shutil
    import sqlite3

    source = packages["v1"]["separate"]
    store = WeightStore(shutil.copytree(packages["store"].root, tmp_path / "store"))
    push(source, f"{registry.host}/tamper/first:1.0.0", store=store)  # remembers every row
    sizes = _payloads(source)
    a, b = sorted(sizes)[:2]
    with sqlite3.connect(store.index.path) as conn:
        rows = dict(conn.execute("SELECT key, sha256 FROM sha256_signed WHERE key IN (?, ?)",
                                 (a, b)))
        conn.execute("UPDATE sha256_signed SET sha256 = ? WHERE key = ?", (rows[b], a))
        conn.execute("UPDATE sha256_signed SET sha256 = ? WHERE key = ?", (rows[a], b))
    ref = f"{registry.host}/tamper/second:1.0.0"
    report = push(source, ref, store=store)
    assert report.hashed_bytes == sizes[a] + sizes[b]  # only the two forged rows
    pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "fresh"))
    _same_tree(source, tmp_path / "out")


def test_ill_typed_registry_rows_are_ignored(packages, registry, tmp_path) -> None:
    """sqlite keeps whatever was written: a BLOB or a number where a digest, MAC or
    repository belongs is no fact, so the push hashes those payloads and uploads them."""
    import shutil
    import sqlite3

    source = packages["v1"]["separate"]
    store = WeightStore(shutil.copytree(packages["store"].root, tmp_path / "store"))
    push(source, f"{registry.host}/typed/first:1.0.0", store=store)
    sizes = _payloads(source)
    a, b = sorted(sizes)[:2]
    with sqlite3.connect(store.index.path) as conn:
        conn.execute("UPDATE sha256_signed SET sha256 = x'ff' WHERE key = ?", (a,))
        conn.execute("UPDATE sha256_signed SET mac = 7 WHERE key = ?", (b,))
        conn.execute("UPDATE blob_repos SET repository = CAST(repository AS BLOB)")
    ref = f"{registry.host}/typed/second:1.0.0"
    report = push(source, ref, store=store)
    assert report.hashed_bytes == sizes[a] + sizes[b]
    pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "fresh"))
    _same_tree(source, tmp_path / "out")


def test_a_file_constant_package_travels_and_runs(packages, registry, tmp_path) -> None:
    """GE's form goes through the registry like any other (FileConstant nodes name the
    files), whole or as a device's variant, and the pulled folder runs in onnxruntime
    through weightstore's load, bit for bit the source model's outputs."""
    import weightstore

    from .helpers import file_constant_package

    (tmp_path / "built").mkdir()
    source = file_constant_package(tmp_path / "built",
                                   packages["folder"] / "encoder-1.0.0.onnx") / "ge"
    ref = f"{registry.host}/ge/combined:1"
    push(source, ref, store=WeightStore(tmp_path / "built" / "store"))
    store = WeightStore(tmp_path / "store")
    pull(ref, tmp_path / "whole", store=store)
    _same_tree(source, tmp_path / "whole")
    report = pull(ref, tmp_path / "npu", store=store, device="npu")
    assert report.fetched == 0  # every payload came with the whole pull
    inputs = sample_inputs(packages["model"], seed=6)
    expected = run_onnxruntime(packages["model"], inputs)
    for folder_ in (tmp_path / "whole", tmp_path / "npu"):
        with weightstore.resolve(folder_ / "encoder.onnx") as resolved:
            session = weightstore.load(resolved)
        for e, a in zip(expected, session.run(None, inputs), strict=True):
            assert e.tobytes() == a.tobytes()
