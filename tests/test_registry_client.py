"""The OCI client against a real registry: references, errors, uploads, mounts, manifests."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from weightstore.errors import (
    RegistryAuthError,
    RegistryDigestError,
    RegistryError,
    RegistryNotFoundError,
    RegistryUnreachableError,
)
from weightstore.registry.auth import find_credentials, parse_challenge
from weightstore.registry.client import RegistryClient, Transport
from weightstore.registry.reference import parse_reference, scheme_for
from weightstore.registry.responses import error_for

from .registry_server import free_port, needs_registry, running_registry


def test_references_parse_and_refuse() -> None:
    ref = parse_reference("127.0.0.1:5000/team/encoder:1.0.0")
    assert (ref.host, ref.repository, ref.tag, ref.digest) == (
        "127.0.0.1:5000", "team/encoder", "1.0.0", None)
    assert parse_reference("reg.example.com/a/b").tag == "latest"
    d = "sha256:" + "ab" * 32
    assert parse_reference(f"localhost:80/x@{d}").target == d
    for bad in ("encoder:1.0", "ubuntu/encoder", "127.0.0.1:5000/Team/x", "h.io/x:bad tag",
                "h.io/x@sha256:12"):
        with pytest.raises(RegistryError):
            parse_reference(bad)


def test_tls_unless_insecure() -> None:
    """TLS first for every registry, loopback ones too (the client falls back to plain
    HTTP for a loopback one that speaks it: tests/test_registry_tls.py)."""
    assert scheme_for("registry.example.com", False) == "https"
    assert scheme_for("registry.example.com", True) == "http"
    for host in ("127.0.0.1:5000", "localhost:5000", "[::1]:5000"):
        assert scheme_for(host, False) == "https"


def test_error_codes_map_to_typed_errors() -> None:
    body = json.dumps({"errors": [{"code": "BLOB_UNKNOWN", "message": "blob unknown"}]})
    err = error_for(404, body.encode(), reference="h.io/x:1", digest="sha256:00")
    assert isinstance(err, RegistryNotFoundError)
    assert err.context["digest"] == "sha256:00" and err.context["status"] == 404
    assert isinstance(error_for(401, b""), RegistryAuthError)
    assert isinstance(error_for(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}'),
                      RegistryDigestError)
    assert isinstance(error_for(503, b"<html>"), RegistryUnreachableError)
    assert type(error_for(400, b"not json")) is RegistryError


def test_challenges_and_docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = parse_challenge('Bearer realm="https://auth.io/token",service="reg",'
                        'scope="repository:a/b:pull,push"')
    assert c is not None and c.scheme == "bearer"
    assert c.params["scope"] == "repository:a/b:pull,push"
    monkeypatch.delenv("WEIGHTSTORE_REGISTRY_USERNAME", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {"reg.io:5000": {"auth": "dXNlcjpwYTpzcw=="}}}))  # user:pa:ss
    creds = find_credentials("reg.io:5000")
    assert creds is not None and (creds.username, creds.password) == ("user", "pa:ss")
    assert find_credentials("other.io") is None
    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "secret")
    assert find_credentials("other.io").username == "ci"


def _pieces(data: bytes):
    def pieces(start: int, end: int):
        for pos in range(start, end, 1000):
            yield data[pos:min(end, pos + 1000)]
    return pieces


@needs_registry
def test_uploads_mounts_and_manifests(tmp_path: Path) -> None:
    with running_registry(tmp_path / "reg") as server:
        client = RegistryClient(server.host, Transport(chunk_size=4096))
        client.ping()
        ref = parse_reference(f"{server.host}/team/a:1")
        data = os.urandom(10_000)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert not client.has_blob(ref, digest)
        loc = client.start_upload(ref, digest)
        for start in range(0, len(data), 4096):  # chunked
            loc = client.patch_chunk(ref, loc, digest, start, min(len(data), start + 4096),
                                     _pieces(data))
        assert client.upload_status(ref, loc, digest) == len(data)
        client.finish_upload(ref, loc, digest)
        assert client.has_blob(ref, digest)
        other = parse_reference(f"{server.host}/team/b:1")
        assert client.start_upload(other, digest, mount_from="team/a") is None  # mounted
        assert client.has_blob(other, digest)
        small = b"{}"
        small_digest = "sha256:" + hashlib.sha256(small).hexdigest()
        loc = client.start_upload(ref, small_digest)
        client.put_monolithic(ref, loc, small_digest, len(small), _pieces(small))
        with pytest.raises(RegistryDigestError):
            loc = client.start_upload(ref, digest)
            client.put_monolithic(ref, loc, "sha256:" + "0" * 64, len(small), _pieces(small))
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": small_digest, "size": 2},
            "layers": [{"mediaType": "application/octet-stream", "digest": digest,
                        "size": len(data)}]}).encode()
        client.put_manifest(ref, "1", manifest)
        got, _ = client.get_manifest(ref)
        assert got == manifest
        resp = client.open_blob(ref, digest, start=5000)
        assert resp.status_code == 206 and resp.read(1 << 20) == data[5000:]
        with pytest.raises(RegistryNotFoundError) as info:
            client.get_manifest(parse_reference(f"{server.host}/team/a:nope"))
        assert info.value.context["status"] == 404


def test_unreachable_registry_is_one_typed_error() -> None:
    client = RegistryClient(f"127.0.0.1:{free_port()}",
                            Transport(attempts=2, backoff=0.01, connect_timeout=1))
    with pytest.raises(RegistryUnreachableError):
        client.ping()


def test_created_at_is_reproducible() -> None:
    from weightstore.registry.artifact import created_at

    assert created_at({}) == "1970-01-01T00:00:00Z"
    assert created_at({"SOURCE_DATE_EPOCH": "1700000000"}) == "2023-11-14T22:13:20Z"
    with pytest.raises(RegistryError):
        created_at({"SOURCE_DATE_EPOCH": "yesterday"})


def test_manifest_file_paths_stay_inside_the_package() -> None:
    from weightstore.registry.artifact import (
        ARTIFACT_TYPE,
        ASSEMBLY_TYPE,
        CONFIG_TYPE,
        FILE_TYPE,
        parse_manifest,
    )

    def manifest(path: str) -> bytes:
        d = "sha256:" + "0" * 64
        return json.dumps({
            "schemaVersion": 2, "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": d, "size": 2},
            "layers": [{"mediaType": ASSEMBLY_TYPE, "digest": d, "size": 2},
                       {"mediaType": FILE_TYPE, "digest": d, "size": 2,
                        "annotations": {"org.cncf.model.filepath": path}}]}).encode()

    assert "devices/npu/m.onnx" in parse_manifest(manifest("devices/npu/m.onnx"), "r").files
    for bad in ("../x", "/etc/passwd", "a/../../x", ".hidden", "a\\b", ""):
        with pytest.raises(RegistryError, match="unsafe file path"):
            parse_manifest(manifest(bad), "r")
    with pytest.raises(RegistryError, match="not JSON"):
        parse_manifest(b"{", "r")


def test_adopt_renames_a_verified_temp_file_once(tmp_path: Path) -> None:
    from weightstore.errors import StoreError
    from weightstore.store import BytesPayload, WeightStore

    store = WeightStore(tmp_path / "store")
    payload = BytesPayload.of(os.urandom(5000))
    store.put([BytesPayload.of(b"x" * 10)], kind="separate")
    tmp = store.root / ".pull-test.tmp"
    tmp.write_bytes(payload.data)
    obj = store.adopt(payload.key, tmp)
    assert not tmp.exists() and store.read(obj) == payload.data
    again = store.root / ".pull-again.tmp"
    again.write_bytes(payload.data)
    assert store.adopt(payload.key, again) == obj and not again.exists()
    outside = tmp_path / ".elsewhere.tmp"
    outside.write_bytes(payload.data)
    with pytest.raises(StoreError):
        store.adopt(payload.key, outside)
    assert store.verify().ok


def test_a_blob_still_missing_is_told_without_the_index(tmp_path: Path,
                                                      monkeypatch) -> None:
    """What a pull asks of each blob once it holds its partial file: a key whose
    per-weight object is not there is still missing, without a read of the index (a
    transaction on a connection of the download's own thread); one another pull adopted
    meanwhile (its per-weight file there) is looked up, and found."""
    from weightstore.store import BytesPayload, WeightStore

    store = WeightStore(tmp_path / "store")
    brought, absent = BytesPayload.of(os.urandom(3000)), BytesPayload.of(os.urandom(2000))
    store.put([BytesPayload.of(b"x" * 10)], kind="separate")
    tmp = store.root / ".pull-other.tmp"
    tmp.write_bytes(brought.data)
    store.adopt(brought.key, tmp)  # another pull's
    looked: list[object] = []
    real = type(store.index).locate

    def locate(self, keys, conn=None):
        if conn is None:  # a lookup of its own (it then goes on with a snapshot)
            looked.append(sorted(keys))
        return real(self, keys, conn)

    monkeypatch.setattr(type(store.index), "locate", locate)
    assert store.still_missing([absent]) == [absent.key] and looked == []
    assert store.still_missing([absent, brought]) == [absent.key]
    assert looked == [[brought.key]]


def test_blobs_finishing_together_are_adopted_in_one_transaction(tmp_path: Path) -> None:
    import threading

    from weightstore.registry.fetch import _GroupAdoption
    from weightstore.store import BytesPayload, WeightStore

    store = WeightStore(tmp_path / "store")
    store.put([BytesPayload.of(b"x" * 10)], kind="separate")
    payloads = [BytesPayload.of(os.urandom(1000 + i)) for i in range(6)]
    adoption = _GroupAdoption(store)
    real = store.adopt_many
    groups: list[int] = []
    first_commit = threading.Event()
    release = threading.Event()

    def slow_first(paths):  # the first commit runs while the others finish
        groups.append(len(paths))
        if len(groups) == 1:
            first_commit.set()
            release.wait(10)
        return real(paths)

    store.adopt_many = slow_first  # type: ignore[method-assign]
    found = {}

    def finish(p) -> None:
        tmp = store.root / f".pull-{p.key.split(':')[1]}.tmp"
        tmp.write_bytes(p.data)
        found[p.key] = adoption.adopt(p.key, tmp)

    first = threading.Thread(target=finish, args=(payloads[0],))
    first.start()
    assert first_commit.wait(10)
    rest = [threading.Thread(target=finish, args=(p,)) for p in payloads[1:]]
    for t in rest:
        t.start()
    while len(adoption._queue) < len(rest):  # all five wait for the running commit
        threading.Event().wait(0.01)
    release.set()
    for t in [first, *rest]:
        t.join(10)
    assert groups == [1, 5]
    assert {k: store.read(o) for k, o in found.items()} == {p.key: p.data for p in payloads}
    assert store.verify().ok


def test_a_registry_gone_during_a_blob_download_is_its_own_error(tmp_path: Path) -> None:
    """A blob download that meets a registry error (no errno: not the disk's) raises that
    error as it is: naming the file it was writing rebuilt it as an OSError with errno
    arguments, which a WeightstoreError does not take (a TypeError traceback)."""
    from weightstore.registry.fetch import download

    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    client = RegistryClient(host, Transport(attempts=1, connect_timeout=1.0, backoff=0.0))
    ref = parse_reference(f"{host}/gone/model:1")
    with pytest.raises(RegistryUnreachableError):
        download(client, ref, {"digest": "sha256:" + "0" * 64, "size": 1},
                 tmp_path / "blob")
