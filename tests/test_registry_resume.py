"""A push killed mid-blob resumes the blob's upload session; stale sessions fall back.

Against the real registry (Debian's docker-registry), through a counting proxy on
127.0.0.1 that forwards each request whole, as a buffering reverse proxy does, and can cut
the client off halfway through a chunk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from weightstore.builder.run import BuildOptions, build
from weightstore.errors import RegistryNotFoundError
from weightstore.io.locks import lock_files_removable
from weightstore.registry import sessions
from weightstore.registry.client import RegistryClient, Transport
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.registry.reference import parse_reference
from weightstore.store import WeightStore

from .helpers import empty_store
from .registry_proxy import relay
from .registry_server import needs_registry, running_registry
from .samples import make_large_model

pytestmark = needs_registry

BLOB = 4 << 20  # one weight table of 4 MiB: the package's one big blob
CHUNK = 128 << 10

RECIPE = """\
package: big
version: "1"
store: {{path: {store}, hash: sha256}}
models:
  - {{name: chain, source: {src}}}
layouts:
  - {{name: sep, external_weight: separate}}
output: {out}
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnx

    folder = tmp_path_factory.mktemp("resume")
    onnx.save(make_large_model(BLOB, tensor_bytes=BLOB), str(folder / "chain.onnx"))
    (folder / "recipe.yaml").write_text(RECIPE.format(store=folder / "store",
                                                      src=folder / "chain.onnx",
                                                      out=folder / "out"))
    (result,) = build(folder / "recipe.yaml", BuildOptions(jobs=2)).packages
    return result.path


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


def _big(package: Path) -> tuple[Path, str]:
    (path,) = [p for p in package.iterdir() if p.name.startswith("weight_")]
    assert path.stat().st_size == BLOB
    import hashlib

    return path, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


class _Counting(BaseHTTPRequestHandler):
    """Forwards whole requests to the registry (keeping the client's Host, so upload
    locations point back here) and counts the body bytes of every upload request per
    session. With ``cut_after`` set, the first PATCH that arrives once that many chunk
    bytes were forwarded is read halfway, reported through ``cut``, and never forwarded."""

    upstream = ""
    patched: dict[str, int] = {}  # upload session id -> PATCH bytes forwarded
    put_bytes = [0]
    cut_after: int | None = None
    cut = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        session = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        if (self.command == "PATCH" and self.cut_after is not None
                and sum(self.patched.values()) >= self.cut_after):
            self.rfile.read(length // 2)
            self.cut.set()
            self.rfile.read(length - length // 2)  # returns when the client is killed
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        status = relay(self, self.upstream, body)
        if self.command == "PATCH" and status == 202:
            self.patched[session] = self.patched.get(session, 0) + len(body)
        elif self.command == "PUT" and "/blobs/uploads/" in self.path:
            self.put_bytes[0] += len(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


def _proxy(registry_host: str, cut_after: int | None):
    handler = type("H", (_Counting,), {"upstream": registry_host, "patched": {},
                                       "put_bytes": [0], "cut_after": cut_after,
                                       "cut": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


def _push_cli(package: Path, ref: str, store: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "weightstore", "push", str(package), ref, "--store",
         str(empty_store(store)), "--chunk-size", str(CHUNK), "--jobs", "1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())


def _same_tree(a: Path, b: Path) -> None:
    result = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:2000]


def test_a_push_killed_mid_blob_resumes_the_blob(package, registry, tmp_path) -> None:
    _, digest = _big(package)
    repo = "resume/killed"
    proxy, counts = _proxy(registry.host, cut_after=BLOB // 2)
    record = sessions.record_path(f"127.0.0.1:{proxy.server_port}", repo, digest)
    try:
        ref = f"127.0.0.1:{proxy.server_port}/{repo}:1"
        proc = _push_cli(package, ref, tmp_path / "store")
        try:
            assert counts.cut.wait(60), proc.communicate(timeout=5)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        (session, sent), = counts.patched.items()  # one session, cut in its middle
        assert BLOB // 2 <= sent < BLOB and sent % CHUNK == 0
        saved = json.loads(record.read_bytes())  # the rerun's hint, recorded durably
        assert saved["sent"] == sent and saved["digest"] == digest
        assert saved["format_version"] == sessions.FORMAT_VERSION
        with pytest.raises(RegistryNotFoundError):  # no manifest, no tag
            RegistryClient(registry.host).get_manifest(
                parse_reference(f"{registry.host}/{repo}:1"))

        counts.cut_after = None
        counts.patched.clear()
        proc = _push_cli(package, ref, tmp_path / "store")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        report = json.loads(out)
    finally:
        proxy.shutdown()
        proxy.server_close()
    # the rerun sent the rest of the cut blob on the same session, nothing more of it
    assert counts.patched == {session: BLOB - sent}
    assert report["resumed"] == 1 and report["resumed_bytes"] == sent
    other = report["blob_bytes"] - BLOB  # model, summary, assembly record, config
    assert report["uploaded_bytes"] == BLOB - sent + other
    assert counts.put_bytes[0] == other  # the small blobs, whole; the big one's PUT is empty
    assert not record.exists()
    assert bool(list(record.parent.glob("*.lock"))) != lock_files_removable()
    store = WeightStore(tmp_path / "pulled-store")
    pull(f"{registry.host}/{repo}:1", tmp_path / "out", store=store)
    _same_tree(package, tmp_path / "out")
    assert store.verify().ok


def _session(registry, repo: str, digest: str, data: bytes) -> tuple[str, int]:
    """A real upload session of ``repo`` holding ``data``; (its location, bytes held)."""
    client = RegistryClient(registry.host, push=True)
    ref = parse_reference(f"{registry.host}/{repo}:1")
    location = client.start_upload(ref, digest)
    for start in range(0, len(data), CHUNK):
        end = min(len(data), start + CHUNK)
        location = client.patch_chunk(ref, location, digest, start, end,
                                      lambda s, e: [data[s:e]])
    return location, client.upload_status(ref, location, digest)


@pytest.mark.parametrize("stale", ["cancelled", "more-than-recorded", "other-bytes",
                                   "past-the-blob", "other-format"])
def test_a_stale_session_record_falls_back_to_a_fresh_upload(package, registry, tmp_path,
                                                             stale) -> None:
    path, digest = _big(package)
    repo = f"resume/{stale}"
    ours = path.read_bytes()
    data, sent = {
        "cancelled": (ours[:CHUNK], CHUNK),
        "more-than-recorded": (ours[:3 * CHUNK], 0),  # not a session we could have fed
        "other-bytes": (b"\x01" * CHUNK, CHUNK),  # another client's bytes
        "past-the-blob": (ours + b"\0" * CHUNK, BLOB),
        "other-format": (ours[:CHUNK], CHUNK),
    }[stale]
    location, held = _session(registry, repo, digest, data)
    assert held == len(data)
    if stale == "cancelled":
        with requests.Session() as http:
            http.trust_env = False  # loopback: no proxy
            assert http.delete(location, timeout=10).status_code == 204
    sessions.save(sessions.UploadSession(registry=registry.host, repository=repo,
                                         digest=digest, size=BLOB, location=location,
                                         sent=sent, chunk=CHUNK))
    record = sessions.record_path(registry.host, repo, digest)
    if stale == "other-format":
        doc = json.loads(record.read_bytes())
        record.write_text(json.dumps(doc | {"format_version": 99}))
    report = push(package, f"{registry.host}/{repo}:1", store=WeightStore(tmp_path / "s"),
                  transport=Transport(chunk_size=CHUNK), jobs=1)
    assert report.resumed == 0 and report.uploaded == report.blobs
    assert report.uploaded_bytes == report.blob_bytes
    assert not record.exists()
    pull(f"{registry.host}/{repo}:1", tmp_path / "out", store=WeightStore(tmp_path / "p"))
    _same_tree(package, tmp_path / "out")


def test_a_session_holding_the_whole_blob_is_only_closed(package, registry, tmp_path) -> None:
    """Killed after the last chunk, before the closing PUT: nothing is sent again."""
    path, digest = _big(package)
    repo = "resume/whole"
    location, held = _session(registry, repo, digest, path.read_bytes())
    sessions.save(sessions.UploadSession(registry=registry.host, repository=repo,
                                         digest=digest, size=BLOB, location=location,
                                         sent=BLOB, chunk=CHUNK))
    report = push(package, f"{registry.host}/{repo}:1", store=WeightStore(tmp_path / "s"),
                  transport=Transport(chunk_size=CHUNK), jobs=1)
    assert report.resumed == 1 and report.resumed_bytes == held == BLOB
    assert report.uploaded_bytes == report.blob_bytes - BLOB
    pull(f"{registry.host}/{repo}:1", tmp_path / "out", store=WeightStore(tmp_path / "p"))
    _same_tree(package, tmp_path / "out")
