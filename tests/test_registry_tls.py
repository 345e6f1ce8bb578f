"""TLS against a real registry (Debian's ``docker-registry`` serving a certificate from a
throwaway CA, ``tests/tls_certs.py``): the system's trust refuses it, the CA is taken
from ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE`` or the registry's ``certs.d`` folder, a
certificate for another name is refused, ``--insecure`` means plain HTTP and nothing
else, client certificates (mTLS) from ``certs.d``, and loopback registries spoken to in
HTTPS first with plain HTTP as the fallback."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from weightstore.cli import main
from weightstore.errors import RegistryError, RegistryTLSError
from weightstore.registry import scheme
from weightstore.registry.client import RegistryClient, Transport
from weightstore.registry.reference import parse_reference

from .registry_server import needs_registry, running_registry
from .samples import make_encoder
from .tls_certs import Certs, make_certs

pytestmark = needs_registry

TRUST = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture(autouse=True)
def no_trust_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system's trust only: nothing from the environment this test runs in."""
    for name in TRUST:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Any]:
    with running_registry(tmp_path_factory.mktemp("tls-registry"),
                          tls=(*certs.server, certs.ca)) as server:
        yield server


def _fast() -> Transport:
    return Transport(attempts=3, backoff=0.01, connect_timeout=2)


def _certs_d(host: str, *files: Path) -> Path:
    """``$WEIGHTSTORE_CERTS_D/<host>`` holding ``files`` (client.cert/.key keep their
    names; a CA becomes ca.crt)."""
    folder = Path(os.environ["WEIGHTSTORE_CERTS_D"]) / host
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, folder / ("ca.crt" if f.suffix == ".crt" else f.name))
    return folder


def _round_trip(client: RegistryClient, host: str) -> str:
    """A blob pushed and read back; the URL scheme it was read over."""
    ref = parse_reference(f"{host}/tls/a:1")
    data = os.urandom(1000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    location = client.start_upload(ref, digest)
    assert location is not None
    client.put_monolithic(ref, location, digest, len(data), lambda s, e: [data[s:e]])
    with client.open_blob(ref, digest) as resp:
        assert resp.read(1 << 20) == data
        return resp.url.split(":", 1)[0]


def test_the_system_trust_refuses_a_private_ca(tls_registry) -> None:
    """A loopback registry with a certificate no trusted CA signed: one TLS error at once
    (not retried, no fall back to plain HTTP), naming where to trust the CA."""
    start = time.monotonic()
    with pytest.raises(RegistryTLSError) as info:
        RegistryClient(tls_registry.host, Transport(attempts=5, backoff=1.0)).ping()
    assert time.monotonic() - start < 5.0  # not retried: 5 tries would back off >= 10 s
    assert "certificate refused" in info.value.message
    assert "REQUESTS_CA_BUNDLE" in info.value.message and "certs.d" in info.value.message


@pytest.mark.parametrize("setting", ["REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"])
def test_the_ca_from_the_environment_is_trusted(tls_registry, certs, monkeypatch,
                                                setting) -> None:
    monkeypatch.setenv(setting, str(certs.ca))
    assert _round_trip(RegistryClient(tls_registry.host, _fast()), tls_registry.host) == "https"


def test_the_ca_from_the_registry_certs_d_is_trusted(tls_registry, certs) -> None:
    """Docker's and podman's layout, ``<certs.d>/<host:port>/ca.crt``, for that registry
    only, by its name as the reference writes it."""
    port = tls_registry.port
    _certs_d(f"localhost:{port}", certs.ca)
    assert _round_trip(RegistryClient(f"localhost:{port}", _fast()),
                       f"localhost:{port}") == "https"
    with pytest.raises(RegistryTLSError):  # another name of the same server: no CA
        RegistryClient(tls_registry.host, _fast()).ping()


def test_a_certificate_for_another_name_is_refused(tmp_path, certs) -> None:
    with running_registry(tmp_path / "reg", tls=(*certs.wrong, certs.ca)) as server:
        _certs_d(server.host, certs.ca)
        with pytest.raises(RegistryTLSError) as info:
            RegistryClient(server.host, _fast()).ping()
        assert "not valid for '127.0.0.1'" in info.value.message


@pytest.fixture
def named_host(monkeypatch: pytest.MonkeyPatch) -> str:
    """``registry.test`` resolves to 127.0.0.1 (a registry under a name that is not
    loopback, as a company's is); every other name is refused before a packet leaves."""
    import socket

    real = socket.create_connection

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        if address[0] not in ("registry.test", "127.0.0.1", "localhost"):
            raise ConnectionRefusedError(f"test: no connection to {address[0]}")
        return real(("127.0.0.1", address[1]), *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return "registry.test"


def test_insecure_means_plain_http_to_a_named_host_and_nothing_else(
        tmp_path, tls_registry, named_host) -> None:
    insecure = Transport(insecure=True, attempts=2, backoff=0.01)
    with running_registry(tmp_path / "plain") as plain:
        name = f"{named_host}:{plain.port}"
        RegistryClient(name, insecure).ping()  # plain HTTP where the user said so
        with pytest.raises(RegistryError):  # else TLS, and no fall back for a named host
            RegistryClient(name, _fast()).ping()
    # a TLS registry with --insecure: plain HTTP, which it answers 400; never TLS
    # without verification
    for host in (f"{named_host}:{tls_registry.port}", tls_registry.host):
        with pytest.raises(RegistryError) as info:
            RegistryClient(host, insecure).ping()
        assert not isinstance(info.value, RegistryTLSError)
        assert info.value.context["status"] == 400


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnx

    from weightstore.builder.run import BuildOptions, build

    folder = tmp_path_factory.mktemp("package")
    onnx.save(make_encoder(), str(folder / "encoder.onnx"))
    (folder / "recipe.yaml").write_text(
        f'package: pk\nversion: "1.0.0"\nstore: {{path: {folder / "store"}}}\n'
        f"models:\n  - {{name: encoder, source: {folder / 'encoder.onnx'}}}\n"
        f"layouts:\n  - {{name: combined, external_weight: combined}}\n"
        f"output: {folder / 'out'}\n")
    (result,) = build(folder / "recipe.yaml", BuildOptions(jobs=1)).packages
    return result.path


def test_client_certificates_from_certs_d(tmp_path, certs, package, capsys) -> None:
    """A registry that wants a client certificate (mTLS: ``clientcas``) gets
    ``client.cert``/``client.key`` from its ``certs.d`` folder: a package pushed and
    pulled byte for byte; without them, one line and exit code 2."""
    with running_registry(tmp_path / "reg", tls=(*certs.server, certs.ca),
                          client_ca=certs.ca) as server:
        ref = f"{server.host}/team/pk:1.0.0"
        folder = _certs_d(server.host, certs.ca)
        assert main(["push", str(package), ref]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("weightstore: error: TLS with the registry failed")
        assert "\n" not in err
        shutil.copy(certs.client[0], folder / "client.cert")
        assert main(["push", str(package), ref]) == 2  # a certificate without its key
        assert "client certificate without its key" in capsys.readouterr().err
        shutil.copy(certs.client[1], folder / "client.key")
        assert main(["push", str(package), ref]) == 0
        assert main(["pull", ref, str(tmp_path / "out")]) == 0
        for f in package.rglob("*"):
            if f.is_file():
                assert (tmp_path / "out" / f.relative_to(package)).read_bytes() == \
                    f.read_bytes()


def test_loopback_is_https_first_then_plain_http_once(tmp_path, tls_registry, certs,
                                                      connections) -> None:
    """A loopback registry is spoken to in HTTPS when it speaks it; one that speaks plain
    HTTP is found so once per process, and later clients go straight to plain HTTP."""
    _certs_d(tls_registry.host, certs.ca)
    assert _round_trip(RegistryClient(tls_registry.host, _fast()),
                       tls_registry.host) == "https"
    with running_registry(tmp_path / "plain") as plain:
        assert plain.host not in scheme._PLAIN
        assert _round_trip(RegistryClient(plain.host, _fast()), plain.host) == "http"
        assert plain.host in scheme._PLAIN
        connections.clear()
        RegistryClient(plain.host, _fast()).ping()
        assert len(connections) == 1  # no TLS attempt, no probe


@pytest.mark.parametrize("problem", ["not a certificate", "key without cert",
                                     "missing bundle"])
def test_unusable_tls_files_are_one_line_naming_the_file(tmp_path, certs, monkeypatch,
                                                         capsys, problem) -> None:
    """Refused before anything connects (nothing listens there)."""
    from .registry_server import free_port

    host = f"127.0.0.1:{free_port()}"
    folder = _certs_d(host)
    if problem == "not a certificate":
        (folder / "ca.crt").write_text("not a certificate\n")
        named, says = folder / "ca.crt", "unusable CA certificate"
    elif problem == "key without cert":
        shutil.copy(certs.client[1], folder / "client.key")
        named, says = folder / "client.key", "a client key without its certificate"
    else:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "absent.pem"))
        named, says = tmp_path / "absent.pem", "unusable CA bundle"
    assert main(["pull", f"{host}/team/pk:1", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and f"file={named}" in err


def test_only_a_failure_to_connect_is_a_tls_failure() -> None:
    """A TLS record broken mid-body is a transfer broken off (retried, resumed), not a
    TLS error; a connection's TLS error is, unless the connection just dropped."""
    import ssl

    from weightstore.io.http import Broken, ConnectError

    bad_record = ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")
    mid_body = Broken("the answer broke off: SSLError", bad_record)
    assert scheme.tls_failure(mid_body) is None
    assert scheme.tls_failure(ConnectError("no connection", bad_record)) is bad_record
    dropped = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert scheme.tls_failure(ConnectError("no connection", dropped)) is None


@needs_registry
def test_an_origin_whose_certificate_is_refused_is_not_down_for_its_mirrors(
        tls_registry, tmp_path, monkeypatch) -> None:
    """A refused certificate (an interception, a wrong CA) is an error, never an origin
    that does not answer: a mirror holding the tag is not asked what the tag names."""
    import json

    import requests

    from weightstore.registry.mirrors import Mirror, MirroredClient

    with running_registry(tmp_path / "mirror") as mirror:
        config = b"{}"
        digest = "sha256:" + hashlib.sha256(config).hexdigest()
        base = f"http://{mirror.host}/v2/tls/m"
        upload = requests.post(f"{base}/blobs/uploads/", timeout=10).headers["Location"]
        url = upload if upload.startswith("http") else f"http://{mirror.host}{upload}"
        assert requests.put(url, params={"digest": digest}, data=config,
                            timeout=10).status_code == 201
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                               "digest": digest, "size": len(config)}, "layers": []}
        assert requests.put(f"{base}/manifests/1", data=json.dumps(manifest), headers={
            "Content-Type": "application/vnd.oci.image.manifest.v1+json"},
            timeout=10).status_code == 201
        client = MirroredClient(tls_registry.host, _fast(),
                                [Mirror(tls_registry.host, mirror.host, insecure=True)])
        with pytest.raises(RegistryTLSError):
            client.get_manifest(parse_reference(f"{tls_registry.host}/tls/m:1"))


def test_proxies_from_the_environment(tmp_path, tls_registry, certs, monkeypatch,
                                      capsys) -> None:
    """A registry whose name is not loopback is reached through the environment's proxy,
    as behind a corporate one: HTTPS through ``HTTPS_PROXY``'s ``CONNECT`` tunnel (the
    proxy's ``user:password@`` as ``Proxy-Authorization``, the registry's certificate
    verified end to end), plain HTTP (``--insecure``) through ``HTTP_PROXY`` as
    absolute URLs; ``NO_PROXY`` names a host spoken to directly; an ``https://`` proxy
    is one line naming it. The name itself never resolves here: only the proxy can
    reach it."""
    import base64
    import socket

    from weightstore.errors import RegistryUnreachableError

    from .forward_proxy import forward_proxy

    real = socket.create_connection
    direct: list[str] = []

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        direct.append(address[0])
        if address[0] != "127.0.0.1":
            raise ConnectionRefusedError(f"test: no connection to {address[0]}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "https_proxy",
                 "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with forward_proxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://user:p%40ss@{proxy.host}")
        name = f"registry.test:{tls_registry.port}"
        _certs_d(name, certs.ca)
        assert _round_trip(RegistryClient(name, _fast()), name) == "https"
        auth = "Basic " + base64.b64encode(b"user:p@ss").decode()
        assert set(proxy.asked) == {("CONNECT", name, auth)}
        with running_registry(tmp_path / "plain") as plain:
            plain_name = f"registry.test:{plain.port}"
            monkeypatch.setenv("HTTP_PROXY", f"http://{proxy.host}")
            insecure = Transport(insecure=True, attempts=2, backoff=0.01)
            assert _round_trip(RegistryClient(plain_name, insecure), plain_name) == "http"
        through = {(m, t.split("/v2/")[0]) for m, t, _ in proxy.asked if m != "CONNECT"}
        assert through == {("POST", f"http://{plain_name}"), ("PUT", f"http://{plain_name}"),
                           ("GET", f"http://{plain_name}")}
        asked = len(proxy.asked)
        monkeypatch.setenv("NO_PROXY", "registry.test")
        with pytest.raises(RegistryUnreachableError):
            RegistryClient(name, _fast()).ping()
        assert len(proxy.asked) == asked and direct[-1] == "registry.test"
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.setenv("HTTPS_PROXY", f"https://user:secret@{proxy.host}")
        assert main(["pull", f"{name}/team/pk:1", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only an http:// proxy" in err, err
    assert f"proxy=https://{proxy.host}" in err and "secret" not in err
    assert set(direct) == {"127.0.0.1", "registry.test"}
