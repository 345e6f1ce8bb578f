"""Recipe sources pinned by digest: an HTTP(S) file with its sha256, or a file of an OCI
artifact by its manifest digest; fetched once into the store, and not at all when the
build is decided without converting."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading

import onnx
import pytest

from tests.helpers import silent_server
from tests.registry_server import needs_registry, running_registry
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import RecipeError
from weightstore.recipe.schema import loaded_from

RECIPE = """\
package: pkg
version: "1.0.0"
store: {{path: store}}
models:
  - {{name: encoder, source: {source}}}
layouts:
  - {{name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}}
output: out
"""


@pytest.fixture
def served(encoder_model, tmp_path):
    """The model file on a loopback HTTP server; ``requests`` counts the GETs."""
    root = tmp_path / "www"
    root.mkdir()
    onnx.save(encoder_model, str(root / "encoder.onnx"))
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        digest = hashlib.sha256((root / "encoder.onnx").read_bytes()).hexdigest()
        yield {"url": f"http://127.0.0.1:{server.server_address[1]}/encoder.onnx",
               "sha256": digest, "requests": requests, "file": root / "encoder.onnx",
               "server": server}
    finally:
        server.shutdown()
        thread.join()


def _recipe(folder, source):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(RECIPE.format(source=source))
    return path


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_url_source_is_fetched_once_and_builds_as_the_file_does(served, tmp_path):
    pinned = _recipe(tmp_path / "pinned", f"{{url: {served['url']}, sha256: "
                                           f"'{served['sha256']}'}}")
    first = build(pinned, BuildOptions(jobs=2))
    assert first.packages[0].status == "built" and len(served["requests"]) == 1
    fetched = (tmp_path / "pinned" / "store" / "sources" / f"sha256-{served['sha256']}"
               / "encoder.onnx")
    assert fetched.read_bytes() == served["file"].read_bytes()
    summary = first.packages[0].summary
    assert summary["models"][0]["source_digest"] == f"sha256:{served['sha256']}"
    # up to date, and rebuilt after its folder went: the store's copy, no new fetch
    assert build(pinned, BuildOptions(jobs=2)).packages[0].status == "up-to-date"
    shutil.rmtree(first.packages[0].path)
    again = build(pinned, BuildOptions(jobs=2))
    assert again.packages[0].status == "built" and len(served["requests"]) == 1
    # the same bytes as a build of the file itself
    local = tmp_path / "local"
    local.mkdir()
    shutil.copyfile(served["file"], local / "encoder.onnx")
    plain = build(_recipe(local, "encoder.onnx"), BuildOptions(jobs=2))
    a, b = _tree(again.packages[0].path), _tree(plain.packages[0].path)
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k != "summary.json"} == {
        k: v for k, v in b.items() if k != "summary.json"}


def test_a_wrong_digest_is_one_line_and_writes_nothing(served, tmp_path, capsys):
    wrong = "0" * 64
    recipe = _recipe(tmp_path / "p", f"{{url: {served['url']}, sha256: '{wrong}'}}")
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "does not have its pinned digest" in err and "model=encoder" in err
    assert not (tmp_path / "p" / "out").exists()
    assert not (tmp_path / "p" / "store" / "sources" / f"sha256-{wrong}").exists()


def test_plain_http_is_refused_outside_loopback(tmp_path):
    for source, problem in (
            ("{url: 'http://models.example.com/m.onnx', sha256: " + "a" * 64 + "}",
             "plain http is refused outside loopback"),
            ("{url: 'https://models.example.com/m.onnx'}", "needs its sha256"),
            ("{ref: 'host/repo:tag', path: m.onnx}", "ref"),
            ("{url: 'https://x/m.onnx', sha256: " + "a" * 64 + ", ref: 'h/r@sha256:"
             + "b" * 64 + "'}", "not both")):
        recipe = _recipe(tmp_path / "r", source)
        with pytest.raises(RecipeError, match=problem):
            loaded_from(__import__("yaml").safe_load(recipe.read_text()), tmp_path)


@needs_registry
def test_a_ref_source_and_a_cache_hit_that_fetches_no_source_byte(served, tmp_path, keys_env,
                                                                  monkeypatch):
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    local = tmp_path / "local"
    local.mkdir()
    shutil.copyfile(served["file"], local / "encoder.onnx")
    plain = build(_recipe(local, "encoder.onnx"), BuildOptions(jobs=2))
    with running_registry(tmp_path / "registry") as registry:
        report = push(plain.packages[0].path, f"{registry.host}/models/encoder:1",
                      store=WeightStore(local / "store"))
        ref = f"{registry.host}/models/encoder@{report.manifest_digest}"
        from_ref = build(_recipe(tmp_path / "ref", f"{{ref: '{ref}', path: encoder.onnx}}"),
                         BuildOptions(jobs=2))
        assert from_ref.packages[0].status == "built"
        a, b = _tree(from_ref.packages[0].path), _tree(plain.packages[0].path)
        assert {k: v for k, v in a.items() if k != "summary.json"} == {
            k: v for k, v in b.items() if k != "summary.json"}
        # the pulled artifact is reused only as pulled: a byte changed there is pulled anew
        pulled = next(p for p in (tmp_path / "ref" / "store" / "sources").glob("oci-*")
                      if p.is_dir())
        weights = max((p for p in pulled.rglob("*") if p.is_file()),
                      key=lambda p: p.stat().st_size)
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
        forced = build(tmp_path / "ref" / "recipe.yaml", BuildOptions(jobs=2, force=True))
        assert _tree(forced.packages[0].path) == a
        assert weights.read_bytes() != bytes(data)  # the damaged file was replaced

        # runner A fills the cache from the url source; runner B hits it: no source GET
        repo = f"{registry.host}/cache/pinned"
        source = f"{{url: {served['url']}, sha256: '{served['sha256']}'}}"
        build(_recipe(tmp_path / "a", source), BuildOptions(
            jobs=2, cache_to=repo, cache_key=str(keys_env)))
        before = len(served["requests"])
        hit = build(_recipe(tmp_path / "b", source), BuildOptions(jobs=2, cache_from=(repo,)))
        assert hit.packages[0].cache == repo
        assert len(served["requests"]) == before  # 0 source bytes fetched
        assert not (tmp_path / "b" / "store" / "sources").exists()


@pytest.fixture
def keys_env(tmp_path, monkeypatch):
    from weightstore.signing.keys import TRUSTED_KEYS_ENV, generate

    path = tmp_path / "ci.pem"
    monkeypatch.setenv(TRUSTED_KEYS_ENV, generate(path).text)
    return path


# -- a url source's server that misbehaves ---------------------------------------------------

def _hostile(served, respond):
    """A loopback server answering every request with ``respond(handler)``; the pin of
    ``served``'s file at its URL."""
    from tests.registry_proxy import misbehaving

    def intercept(handler, body):
        respond(handler)
        return True

    return misbehaving(None, intercept)


def _pin(host, served, **extra):
    fields = "".join(f", {k}: {v}" for k, v in extra.items())
    return f"{{url: 'http://{host}/encoder.onnx', sha256: '{served['sha256']}'{fields}}}"


def _head(h, length=None, status=200, **headers):
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(length if length is not None else 0))
    h.end_headers()


def _fails_with_nothing_left(tmp_path, recipe, capsys, *words):
    """The build is one line naming each of ``words``, exit 2, and leaves no source
    folder and no temp file."""
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert all(w in err for w in words), err
    sources = recipe.parent / "store" / "sources"
    assert not sources.exists() or list(sources.iterdir()) == []
    assert not (recipe.parent / "out").exists()
    return err


@pytest.mark.parametrize("where", ["http://10.0.0.1/encoder.onnx", "file:///etc/passwd",
                                   "/encoder.onnx"])
def test_a_redirect_is_checked_hop_by_hop_and_leaves_nothing(served, tmp_path, capsys,
                                                             connections, where):
    """Plain http elsewhere, or another scheme, is refused before any connection to it;
    a loop is a loop; none leaves an empty source folder behind."""
    def respond(h):
        _head(h, status=302, Location=where)

    with _hostile(served, respond) as host:
        recipe = _recipe(tmp_path / "p", _pin(host, served))
        err = _fails_with_nothing_left(tmp_path, recipe, capsys, "model=encoder")
    if where == "/encoder.onnx":
        assert "TooManyRedirects" in err
    else:
        assert "redirects to plain http outside loopback (or to another scheme)" in err
        assert f"location={where}" in err
    assert set(connections) == {"127.0.0.1"}


def test_a_redirect_that_keeps_to_the_rule_is_followed(served, tmp_path, connections):
    def respond(h):
        if h.path == "/moved":
            data = served["file"].read_bytes()
            _head(h, len(data))
            h.wfile.write(data)
        else:
            _head(h, status=301, Location="/moved")

    with _hostile(served, respond) as host:
        result = build(_recipe(tmp_path / "p", _pin(host, served)), BuildOptions(jobs=2))
    assert result.packages[0].status == "built" and set(connections) == {"127.0.0.1"}


def _trickle(every, piece, total=1 << 30):
    import time

    def respond(h):
        _head(h, total)
        for _ in range(total // piece):
            h.wfile.write(b"\0" * piece)
            h.wfile.flush()
            time.sleep(every)
    return respond


@pytest.mark.parametrize("how, words", [
    ("trickles", ("too slow",)),  # a byte now and then: below the minimum rate
    ("endless", ("deadline",))])  # fast enough, and never done
def test_a_slow_source_is_given_up_on_within_its_deadline(served, tmp_path, capsys,
                                                          monkeypatch, how, words):
    import time

    monkeypatch.setenv("WEIGHTSTORE_SOURCE_TIMEOUT", "2")
    # each window of the minimum rate well inside the deadline, so that a trickle is
    # judged too slow before the deadline ends the fetch, however slow the machine
    monkeypatch.setattr("weightstore.builder.sources.ANSWER_TIMEOUT", 0.5)
    respond = _trickle(0.3, 1) if how == "trickles" else _trickle(0.05, 2048)
    with _hostile(served, respond) as host:
        start = time.monotonic()
        _fails_with_nothing_left(tmp_path, _recipe(tmp_path / "p", _pin(host, served)),
                                 capsys, "cannot fetch the source", *words)
        assert time.monotonic() - start < 8


def test_a_source_timeout_that_is_not_seconds_is_one_line(served, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setenv("WEIGHTSTORE_SOURCE_TIMEOUT", "soon")
    _fails_with_nothing_left(tmp_path, _recipe(tmp_path / "p", _pin("127.0.0.1:9", served)),
                             capsys, "WEIGHTSTORE_SOURCE_TIMEOUT must be a positive number")


def test_a_source_larger_than_its_pinned_size_is_stopped_at_it(served, tmp_path, capsys):
    """A pinned size: the fetch stops at its first byte past it, long before the body
    ends; the right file with its size builds."""
    sent = []

    def respond(h):
        _head(h, 1 << 30)
        for _ in range(1 << 10):
            h.wfile.write(b"\0" * (1 << 20))
            sent.append(1)

    with _hostile(served, respond) as host:
        _fails_with_nothing_left(tmp_path, _recipe(tmp_path / "p", _pin(host, served,
                                                                        size=1000)),
                                 capsys, "larger than its pinned size", "size=1000")
    assert len(sent) < 64  # MiB: the client hung up
    size = served["file"].stat().st_size
    ok = build(_recipe(tmp_path / "q", f"{{url: {served['url']}, sha256: "
                                       f"'{served['sha256']}', size: {size}}}"),
               BuildOptions(jobs=2))
    assert ok.packages[0].status == "built"


def test_a_source_without_a_size_stops_before_the_disk_fills(served, tmp_path, capsys,
                                                             small_disk):
    import os

    def respond(h):
        _head(h, 1 << 30)
        while True:
            h.wfile.write(b"\0" * (1 << 16))

    with _hostile(served, respond) as host:
        recipe = _recipe(tmp_path / "p", _pin(host, served))
        recipe.write_text(recipe.read_text().replace(
            "store: {path: store}", f"store: {{path: {small_disk / 'store'}}}"))
        assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert "would fill the store's disk" in err and "\n" not in err, err
    st = os.statvfs(small_disk)
    assert st.f_bavail * st.f_frsize > 0  # stopped with room left
    sources = small_disk / "store" / "sources"
    assert not sources.exists() or list(sources.iterdir()) == []


def test_a_killed_fetch_leaves_a_temp_file_the_next_fetch_sweeps(served, tmp_path):
    """A build killed mid-fetch leaves its temp file; the next build's fetch removes it
    (no process holds it any more, however young it is)."""
    import signal
    import subprocess
    import sys
    import time

    slow = [True]

    def respond(h):
        data = served["file"].read_bytes()
        _head(h, len(data))
        if slow[0]:
            h.wfile.write(data[:100])
            h.wfile.flush()
            time.sleep(30)
        h.wfile.write(data)

    with _hostile(served, respond) as host:
        recipe = _recipe(tmp_path / "p", _pin(host, served))
        proc = subprocess.Popen([sys.executable, "-m", "weightstore", "build", str(recipe)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        folder = tmp_path / "p" / "store" / "sources" / f"sha256-{served['sha256']}"
        deadline = time.monotonic() + 60
        while not list(folder.glob(".encoder.onnx.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        temps = list(folder.glob(".encoder.onnx.*.tmp"))
        assert len(temps) == 1, "the killed fetch wrote no temp file within 60 s"
        slow[0] = False
        assert build(recipe, BuildOptions(jobs=2)).packages[0].status == "built"
    assert sorted(p.name for p in folder.iterdir()) == ["encoder.onnx"]


def test_a_ref_whose_registry_never_answers_fails_within_the_deadline(tmp_path, capsys,
                                                                     monkeypatch):
    """It accepts connections and never answers: every try waits, but all of them
    together no longer than $WEIGHTSTORE_SOURCE_TIMEOUT."""
    import time

    monkeypatch.setenv("WEIGHTSTORE_SOURCE_TIMEOUT", "2")
    with silent_server() as host:
        ref = f"{host}/models/encoder@sha256:{'a' * 64}"
        start = time.monotonic()
        recipe = _recipe(tmp_path / "p", f"{{ref: '{ref}', path: encoder.onnx}}")
        assert main(["build", str(recipe)]) == 2
        assert time.monotonic() - start < 8
    err = capsys.readouterr().err.strip()
    assert err.startswith("weightstore: error: cannot fetch the source: registry")
    assert "model=encoder" in err and "timeout=2.0" in err and "\n" not in err, err
    assert list((tmp_path / "p" / "store" / "sources").iterdir()) == []


def test_a_https_source_is_verified_with_the_tls_a_registry_gets(served, tmp_path, capsys,
                                                                 monkeypatch):
    """A url source over HTTPS from a private CA: refused by the system's trust (one
    line), fetched once its host's certs.d folder holds the CA
    (docs/how-to/registry-auth-and-tls.md, TLS)."""
    import os
    import ssl
    from pathlib import Path
    from urllib.parse import urlsplit

    from .tls_certs import make_certs

    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    certs = make_certs(tmp_path / "certs")
    host = urlsplit(served["url"]).netloc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certs.server)
    server = served["server"]
    server.socket = context.wrap_socket(server.socket, server_side=True)
    url = served["url"].replace("http://", "https://")
    recipe = _recipe(tmp_path / "p", f"{{url: {url}, sha256: '{served['sha256']}'}}")
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot fetch the source: SSLError" in err
    folder = Path(os.environ["WEIGHTSTORE_CERTS_D"]) / host
    folder.mkdir(parents=True)
    shutil.copy(certs.ca, folder / "ca.crt")
    assert main(["build", str(recipe)]) == 0
    assert served["requests"] == ["/encoder.onnx"]
