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
               "sha256": digest, "requests": requests, "file": root / "encoder.onnx"}
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
