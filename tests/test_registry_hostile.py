"""A pull from a registry that lies: hostile answers, manifests and artifacts.

The first tests need no registry: a small HTTP server answers every request the way one
test asks (an endless body, JSON nested too deep, a redirect loop). The rest push a real
package to the test registry, then push altered copies of its manifest, and check that a
pull ends in one typed error, publishes nothing and leaves the folder it would replace,
and its parent, as they were.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import onnx
import pytest

from weightstore.cli import main
from weightstore.errors import (
    IntegrityError,
    PackageError,
    RegistryAuthError,
    RegistryError,
    RegistryUnreachableError,
    ScenarioError,
)
from weightstore.registry import client as client_module
from weightstore.registry.artifact import (
    ASSEMBLY_TYPE,
    FILEPATH,
    PAYLOAD,
    ParsedArtifact,
    parse_assembly,
    parse_manifest,
    sha256_digest,
)
from weightstore.registry.client import RegistryClient, Transport
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.registry.reference import parse_reference
from weightstore.store import WeightStore

from .helpers import empty_store, fill, scenario_package
from .registry_formats import push_format1, upload
from .registry_proxy import answer, forward, misbehaving, send_head
from .registry_server import needs_registry, running_registry

DEEP = b"[" * 100_000 + b"]" * 100_000
FAST = Transport(attempts=2, backoff=0.01, max_backoff=0.01, connect_timeout=2,
                 read_timeout=5)


@contextmanager
def answering(respond: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A server on 127.0.0.1 whose every answer is ``respond(handler)``; yields its host."""
    def intercept(handler: BaseHTTPRequestHandler, body: bytes) -> bool:
        respond(handler)
        return True

    with misbehaving(None, intercept) as host:
        yield host


def _endless(status: int) -> Callable[[BaseHTTPRequestHandler], None]:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        chunk = b" " * 65536
        frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        while True:  # until the client hangs up
            h.wfile.write(frame)
    return respond


def _body(status: int, body: bytes, **headers: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return respond


def test_an_endless_manifest_is_refused_at_the_limit(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(client_module, "MAX_DOCUMENT", 1 << 20)
    with (answering(_endless(200)) as host,
          pytest.raises(RegistryError, match="answer too large") as info):
        pull(f"{host}/a/b:1", tmp_path / "out", store=WeightStore(tmp_path / "s"),
             transport=FAST)
    assert info.value.context["limit"] == 1 << 20
    assert not (tmp_path / "out").exists()


def test_an_endless_error_answer_is_read_only_so_far(tmp_path) -> None:
    with (answering(_endless(500)) as host,
          pytest.raises(RegistryUnreachableError, match="registry unavailable")):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))


@pytest.mark.parametrize("status, error", [(400, RegistryError), (500, RegistryError)])
def test_an_error_answer_nested_too_deep_is_a_typed_error(status, error) -> None:
    with (answering(_body(status, DEEP, Content_Type="application/json")) as host,
          pytest.raises(error) as info):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))
    assert info.value.context["status"] == status


def test_a_redirect_loop_is_a_typed_error() -> None:
    with (answering(_body(302, b"", Location="/v2/a/b/manifests/1")) as host,
          pytest.raises(RegistryError, match="redirects without end")):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))


def test_a_token_answer_nested_too_deep_is_refused() -> None:
    def respond(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            return _body(200, b'{"token": ' + DEEP + b"}")(h)
        realm = f"http://{h.headers['Host']}/token"
        return _body(401, b"{}", WWW_Authenticate=f'Bearer realm="{realm}",service="x"')(h)

    with (answering(respond) as host,
          pytest.raises(RegistryAuthError, match="without a token")):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))


def test_the_cli_gives_one_line_for_a_hostile_answer(tmp_path, capsys) -> None:
    with answering(_body(400, DEEP)) as host:
        code = main(["pull", f"{host}/a/b:1", str(tmp_path / "out"), "--store",
                     str(tmp_path / "s"), "--timeout", "5"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("weightstore: error: ") and "\n" not in err


# -- manifests and assembly records, parsed ------------------------------------------------

def _layer(data: bytes, media: str, **notes: str) -> dict:
    return {"mediaType": media, "digest": sha256_digest(data), "size": len(data),
            "annotations": notes}


MANIFEST = {
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "artifactType": "application/vnd.cncf.model.manifest.v1+json",
    "config": _layer(b"{}", "application/vnd.cncf.model.config.v1+json"),
    "layers": [_layer(b"a", "application/vnd.weightstore.assembly.v1+json"),
               _layer(b"m", "application/vnd.cncf.model.weight.config.v1.raw",
                      **{FILEPATH: "model.onnx"})],
}


def test_manifest_nested_too_deep_or_with_one_path_twice_is_refused() -> None:
    deep = json.dumps({**MANIFEST, "x": 1}).encode().replace(b'"x": 1', b'"x": ' + DEEP)
    with pytest.raises(RegistryError, match="nested too deep"):
        parse_manifest(deep, "r")
    twice = {**MANIFEST, "layers": [*MANIFEST["layers"], _layer(
        b"n", "application/vnd.cncf.model.weight.config.v1.raw", **{FILEPATH: "model.onnx"})]}
    with pytest.raises(RegistryError, match="two layers for one file path") as info:
        parse_manifest(json.dumps(twice).encode(), "r")
    assert info.value.context["filepath"] == "model.onnx"
    assert parse_manifest(json.dumps(MANIFEST).encode(), "r").files.keys() == {"model.onnx"}


KEY = "blake3:" + "ab" * 32


@pytest.mark.parametrize("case", ["escapes", "clash", "other-bytes"])
def test_payload_layers_paths_and_keys_are_checked(case) -> None:
    """A payload layer's file path is a file path like any other (inside the folder, one
    layer for it), and two layers naming one payload must name one blob."""
    weight = "application/vnd.cncf.model.weight.v1.raw"
    payload = _layer(b"w", weight, **{PAYLOAD: KEY, FILEPATH: "payloads/weight_ab"})
    layers = {
        "escapes": [_layer(b"w", weight, **{PAYLOAD: KEY, FILEPATH: "../weight_ab"})],
        "clash": [payload, _layer(b"m", weight, **{FILEPATH: "payloads/weight_ab"})],
        "other-bytes": [payload, _layer(b"x", weight, **{PAYLOAD: KEY, FILEPATH: "w2"})],
    }[case]
    doc = {**MANIFEST, "layers": layers}
    with pytest.raises(RegistryError, match={"escapes": "unsafe file path",
                                             "clash": "two layers for one file path",
                                             "other-bytes": "one payload with other bytes"}[case]):
        parse_manifest(json.dumps(doc).encode(), "r")
    same = [payload, _layer(b"w", weight, **{PAYLOAD: KEY, FILEPATH: "g/weight_ab"})]
    parsed = parse_manifest(json.dumps({**MANIFEST, "layers": same}).encode(), "r")
    assert parsed.payloads == {KEY: payload} and parsed.files == {}


@pytest.mark.parametrize("offset", ["1e400", "1.5", '"0"', "true", "-1", "null"])
def test_assembly_offsets_must_be_non_negative_integers(offset) -> None:
    parsed = ParsedArtifact({}, {}, {}, {KEY: {"size": 4}}, {})
    piece = f'{{"offset": {offset}, "size": 4, "key": "{KEY}"}}'
    doc = ('{"format_version": 1, "files": [{"name": "w.bin", "size": 8, "pieces": ['
           + piece + "]}]}")
    with pytest.raises(RegistryError, match="malformed assembly record"):
        parse_assembly(doc.encode(), parsed, "r")
    good = doc.replace(f'"offset": {offset}', '"offset": 4')
    assert parse_assembly(good.encode(), parsed, "r")[0].pieces[0].offset == 4


def test_assembly_nested_too_deep_is_refused() -> None:
    parsed = ParsedArtifact({}, {}, {}, {}, {})
    with pytest.raises(RegistryError, match="malformed assembly record"):
        parse_assembly(b'{"format_version": 1, "files": ' + DEEP + b"}", parsed, "r")


# -- altered artifacts through a real registry --------------------------------------------

@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory):
    """A package pushed to a fresh registry: (registry host, package folder, manifest)."""
    folder = tmp_path_factory.mktemp("hostile")
    package, _ = scenario_package(folder)
    with running_registry(folder / "reg") as server:
        ref = parse_reference(f"{server.host}/pk/a:1")
        push(package, str(ref), store=WeightStore(folder / "store"))
        manifest = json.loads(RegistryClient(ref.host).get_manifest(ref)[0])
        yield server.host, package, manifest


def _altered(host: str, manifest: dict, tag: str, files: dict[str, bytes],
             repository: str = "pk/a") -> str:
    """Push a copy of ``manifest`` whose file layers in ``files`` hold other bytes (a
    name not in the manifest adds a layer); returns its reference."""
    ref = parse_reference(f"{host}/{repository}:{tag}")
    client = RegistryClient(host, push=True)
    doc = json.loads(json.dumps(manifest))
    layers = doc["layers"]
    for name, data in files.items():
        digest = sha256_digest(data)
        if not client.has_blob(ref, digest):
            location = client.start_upload(ref, digest)
            client.put_monolithic(ref, location, digest, len(data), lambda s, e, d=data: [d[s:e]])
        found = [x for x in layers if (x.get("annotations") or {}).get(FILEPATH) == name]
        layer = found[0] if found else {"mediaType": "application/vnd.cncf.model.weight."
                                        "config.v1.raw", "annotations": {FILEPATH: name}}
        layer.update(digest=digest, size=len(data))
        if not found:
            layers.append(layer)
    client.put_manifest(ref, tag, json.dumps(doc).encode())
    return str(ref)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@needs_registry
def test_a_malformed_summary_never_replaces_a_good_package(pushed, tmp_path) -> None:
    host, _, manifest = pushed
    store = WeightStore(tmp_path / "store")
    pull(f"{host}/pk/a:1", tmp_path / "keep", store=store)
    before = _tree(tmp_path / "keep")
    for tag, summary in (("notjson", b"not json{"), ("deep", DEEP),
                         ("nomodels", b'{"models": 3}'), ("list", b"[]")):
        ref = _altered(host, manifest, tag, {"summary.json": summary})
        with pytest.raises(PackageError, match="summary") as info:
            pull(ref, tmp_path / "keep", store=store, force=True)
        assert "summary.json" in str(info.value)
        assert _tree(tmp_path / "keep") == before
        assert _leftovers(tmp_path) == []
    assert [r.folder for r in store.roots()] == [str((tmp_path / "keep").absolute())]


@needs_registry
def test_a_file_that_is_not_what_the_summary_lists_is_never_published(pushed,
                                                                        tmp_path) -> None:
    host, package, manifest = pushed
    store = WeightStore(tmp_path / "store")
    summary = json.loads((package / "summary.json").read_bytes())
    weights = summary["models"][0]["external_weights"]
    a, b = next((x, y) for x in weights for y in weights
                if x["size"] == y["size"] and x["id"] != y["id"])
    a["id"], b["id"] = b["id"], a["id"]  # two payloads placed where the other sits
    # sizes and places are checked against the summary before anything is fetched (a
    # format 1 artifact's assembly record placing pieces elsewhere than its summary)
    _, old = push_format1(host, "pk/a", "format1", package, manifest)
    for tag, files, why, doc in (
            ("swapped", {"encoder.onnx": b"\x08\x07" * 10}, "not the one the summary lists",
             manifest),
            ("placed", {"summary.json": json.dumps(summary).encode()}, "other pieces", old)):
        ref = _altered(host, doc, tag, files)
        with pytest.raises(RegistryError, match=why):
            pull(ref, tmp_path / tag, store=store)
        assert not (tmp_path / tag).exists()
        assert _leftovers(tmp_path) == []
    for tag, files, problem in (
            ("extra", {"notes.txt": b"hello"}, "unexpected: notes.txt"),):
        ref = _altered(host, manifest, tag, files)
        with pytest.raises(IntegrityError, match="does not match its summary") as info:
            pull(ref, tmp_path / tag, store=store)
        assert info.value.context["problem"].startswith(problem)
        assert not (tmp_path / tag).exists()
        assert _leftovers(tmp_path) == []
    assert store.roots() == []
    # the artifact as pushed passes, byte for byte
    pull(f"{host}/pk/a:1", tmp_path / "good", store=store)
    assert main(["verify", str(tmp_path / "good")]) == 0


@needs_registry
@pytest.mark.parametrize("how", ["scenario", "device"])
def test_a_variant_pull_of_a_broken_artifact_is_one_typed_error(pushed, tmp_path,
                                                                how) -> None:
    host, package, manifest = pushed
    store = WeightStore(tmp_path / "store")
    model = ("devices/npu/encoder.onnx" if how == "device" else "encoder.onnx")
    cases = {"garbage": {model: b"\xff" * 64}}
    data = (package / model).read_bytes()  # a node output's name made not UTF-8
    name = onnx.load_from_string(data).graph.node[0].output[0].encode()
    cases["badname"] = {model: data.replace(name, b"\xff" + name[1:])}
    if how == "scenario":
        summary = json.loads((package / "summary.json").read_bytes())
        summary["models"][0]["file"] = "nope.onnx"
        cases["nolayer"] = {"summary.json": json.dumps(summary).encode()}
    for tag, files in cases.items():
        ref = _altered(host, manifest, f"{how}-{tag}", files)
        with pytest.raises(RegistryError, match="malformed model artifact") as err:
            pull(ref, tmp_path / "out", store=store,
                 **({"device": "npu"} if how == "device" else {"scenario": "half"}))
        assert tag != "badname" or err.value.context["field"] == "NodeProto.output"
        assert not (tmp_path / "out").exists()
        assert _leftovers(tmp_path) == []
    # an unknown name, and the variant pulled whole
    with pytest.raises(PackageError if how == "device" else ScenarioError, match="no "):
        pull(f"{host}/pk/a:1", tmp_path / "out", store=store,
             **({"device": "nope"} if how == "device" else {"scenario": "nope"}))
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()
    pull(f"{host}/pk/a:1", tmp_path / "out", store=store,
         **({"device": "npu"} if how == "device" else {"scenario": "half"}))
    assert _leftovers(tmp_path) == []


@needs_registry
def test_a_prepared_package_pulls_and_a_wrong_companion_is_refused(pushed, tmp_path) -> None:
    """What `prepare` adds (records and companion graphs, outside the summary's contents)
    travels with the package and is checked as `verify` checks it."""
    host, package, _ = pushed
    folder = tmp_path / "pkg"
    shutil.copytree(package, folder)
    store = package.parents[3] / "store"
    assert main(["prepare", str(folder), "--device", "cpu", "--store", str(store)]) == 0
    graphs = sorted(p for p in (folder / "prepared").rglob("*.onnx"))
    assert graphs and main(["verify", str(folder)]) == 0
    push(folder, f"{host}/pk/prep:1", store=WeightStore(store))
    pull(f"{host}/pk/prep:1", tmp_path / "out", store=WeightStore(tmp_path / "s"))
    assert _tree(tmp_path / "out") == _tree(folder)
    assert main(["verify", str(tmp_path / "out")]) == 0
    client = RegistryClient(host)
    prepared = json.loads(client.get_manifest(parse_reference(f"{host}/pk/prep:1"))[0])
    name = graphs[0].relative_to(folder).as_posix()
    data = bytearray(graphs[0].read_bytes())
    data[-1] ^= 1  # same size, other bytes: only the digest tells
    ref = _altered(host, prepared, "bad", {name: bytes(data)}, "pk/prep")
    with pytest.raises(IntegrityError, match="does not match its summary") as info:
        pull(ref, tmp_path / "bad", store=WeightStore(tmp_path / "s"))
    assert info.value.context["problem"].startswith(f"digest: {name}")
    assert not (tmp_path / "bad").exists()


def test_a_redirect_body_is_never_read() -> None:
    """A redirect's body is never read (``requests`` read it whole before following it):
    closed first, a huge one costs nothing."""
    sent = []

    def respond(h: BaseHTTPRequestHandler) -> None:
        if "/manifests/" not in h.path:
            return _body(404, b"{}")(h)
        h.send_response(302)
        h.send_header("Location", "/elsewhere")
        h.send_header("Content-Length", str(1 << 30))
        h.end_headers()
        chunk = b"x" * (1 << 20)
        for _ in range(1 << 10):
            h.wfile.write(chunk)
            sent.append(len(chunk))

    with (answering(respond) as host,
          pytest.raises(RegistryError, match="not found")):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))
    assert sum(sent) < 256 << 20  # the client hung up long before the 1 GiB body ended


# -- digests the store remembers -----------------------------------------------------------

def _payload_layers(manifest: dict) -> dict[str, dict]:
    return {x["annotations"][PAYLOAD]: x for x in manifest["layers"]
            if PAYLOAD in (x.get("annotations") or {})}


def _served_keys(host: str, reference: str) -> dict[str, str]:
    """For every payload layer of ``reference``'s manifest, the store key of the bytes a
    plain GET of its blob serves (blake3, as the store's keys)."""
    from weightstore.io.digests import make_key, new_hasher, split_key

    ref = parse_reference(reference)
    client = RegistryClient(host)
    out = {}
    for key, layer in _payload_layers(json.loads(client.get_manifest(ref)[0])).items():
        h = new_hasher(split_key(key)[0])
        with client.open_blob(ref, layer["digest"]) as resp:
            for data in client.pieces(resp):
                h.update(data)
        out[key] = make_key(split_key(key)[0], h.hexdigest())
    return out


@needs_registry
def test_a_swapped_payload_digest_never_reaches_a_later_push(pushed, tmp_path) -> None:
    """A hostile tag names, for one payload the store already holds, the layer of another
    payload of the same size. The pull takes that payload from the store and never sees
    those bytes, so it must not remember the pair; a later push of the real package must
    publish, for every payload, a blob that serves that payload's bytes."""
    host, _, manifest = pushed
    store = WeightStore(tmp_path / "store")
    pull(f"{host}/pk/a:1", tmp_path / "real", store=store)  # every payload in the store
    layers = _payload_layers(manifest)
    a, b = next((x, y) for x in sorted(layers) for y in sorted(layers)
                if x != y and layers[x]["size"] == layers[y]["size"])
    doc = json.loads(json.dumps(manifest))
    _payload_layers(doc)[a]["digest"] = layers[b]["digest"]
    ref = parse_reference(f"{host}/pk/a:swapped")
    RegistryClient(host, push=True).put_manifest(ref, "swapped", json.dumps(doc).encode())
    pull(str(ref), tmp_path / "other", store=store)  # what it wrote came from the store
    target = f"{host}/pk/again:1"
    push(tmp_path / "real", target, store=store)
    served = _served_keys(host, target)
    assert served == {k: k for k in served} and a in served
    assert main(["pull", target, str(tmp_path / "again"), "--store",
                 str(tmp_path / "fresh")]) == 0


@needs_registry
def test_a_pair_an_earlier_version_remembered_unproven_is_computed_again(pushed,
                                                                         tmp_path) -> None:
    """Rows signed without the proof that both digests came from the same bytes (as
    earlier versions signed the digests a pull's manifest named) are not believed."""
    import sqlite3

    from weightstore.store.mac import entry_mac

    host, _, manifest = pushed
    store = WeightStore(tmp_path / "store")
    pull(f"{host}/pk/a:1", tmp_path / "real", store=store)
    layers = _payload_layers(manifest)
    a, b = next((x, y) for x in sorted(layers) for y in sorted(layers)
                if x != y and layers[x]["size"] == layers[y]["size"])
    wrong = layers[b]["digest"]
    with sqlite3.connect(store.index.path) as conn:
        conn.execute("UPDATE sha256_signed SET sha256 = ?, mac = ? WHERE key = ?",
                     (wrong, entry_mac({"key": a, "sha256": wrong}), a))
    target = f"{host}/pk/unproven:1"
    report = push(tmp_path / "real", target, store=store)
    assert report.hashed_bytes == layers[a]["size"]  # that row alone, computed again
    served = _served_keys(host, target)
    assert served == {k: k for k in served} and a in served


# -- sizes an artifact declares ------------------------------------------------------------

def _reassembled(host: str, manifest: dict, tag: str, change: Callable[[dict], None],
                 summary: Callable[[dict], None] | None = None) -> str:
    """Push a copy of ``manifest`` whose assembly record (and summary) ``change`` (and
    ``summary``) altered; returns its reference."""
    ref = parse_reference(f"{host}/pk/a:{tag}")
    client = RegistryClient(host)
    doc = json.loads(json.dumps(manifest))
    for layer in doc["layers"]:
        notes = layer.get("annotations") or {}
        edit = (change if layer["mediaType"] == ASSEMBLY_TYPE
                else summary if notes.get(FILEPATH) == "summary.json" else None)
        if edit is None:
            continue
        with client.open_blob(ref, layer["digest"]) as resp:
            record = json.loads(resp.read(1 << 20))
        edit(record)
        layer.update(upload(host, ref, json.dumps(record).encode()))
    RegistryClient(host, push=True).put_manifest(ref, tag, json.dumps(doc).encode())
    return str(ref)


def _grow(size: int) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        record["files"][0]["size"] = size
    return change


def _grow_summary(size: int) -> Callable[[dict], None]:
    def change(summary: dict) -> None:
        name = summary["files"][0]["name"]
        summary["files"][0]["size"] = size
        for c in summary["contents"]:
            if c["path"] == name:
                c["size"] = size
    return change


@needs_registry
@pytest.mark.parametrize("how", ["whole", "device", "scenario"])
def test_a_declared_size_out_of_bounds_is_refused_before_anything_is_written(
        pushed, tmp_path, capsys, how) -> None:
    """A weight file declared 4 TB in the summary (format 2's assembly record), or in a
    format 1 artifact's assembly record (alone, or with a summary that agrees), is refused
    before a temp file is created: one line, exit 2, nothing left."""
    import time

    host, package, manifest = pushed
    _, old = push_format1(host, "pk/a", f"format1-{how}", package, manifest)
    store = WeightStore(tmp_path / "store")
    options = {"whole": [], "device": ["--device", "npu"], "scenario": ["--scenario", "half"]}
    cases = {"assembly": _reassembled(host, old, f"big-{how}", _grow(1 << 42)),
             "both": _reassembled(host, old, f"bigger-{how}", _grow(1 << 42),
                                  _grow_summary(1 << 42)),
             "summary-format1": _reassembled(host, old, f"big-summary1-{how}",
                                             lambda r: None, _grow_summary(1 << 42)),
             "summary": _reassembled(host, manifest, f"big-summary-{how}", lambda r: None,
                                     _grow_summary(1 << 42))}
    for case, ref in cases.items():
        start = time.monotonic()
        code = main(["pull", ref, str(tmp_path / "out"), "--store", str(store.root),
                     *options[how]])
        err = capsys.readouterr().err.strip()
        assert code == 2, (case, err)
        assert err.startswith("weightstore: error: ") and "\n" not in err, err
        assert "size" in err, err
        assert time.monotonic() - start < 10
        assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
        assert not store.root.exists() or not list(store.root.glob("objects/**/*.*"))


# -- a damaged store ------------------------------------------------------------------------

def _flip(store: WeightStore, key: str, how: str = "flipped") -> None:
    import os

    obj = store.locate([key])[key]
    path = store.path_of(obj)
    if how == "truncated":
        os.chmod(path, 0o644)
        os.truncate(path, obj.offset + 1)
        return
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(obj.offset + 3)
        b = f.read(1)
        f.seek(obj.offset + 3)
        f.write(bytes([b[0] ^ 0xFF]))


@needs_registry
@pytest.mark.parametrize("how", ["flipped", "truncated"])
@pytest.mark.parametrize("kind", ["pulled", "built"])
def test_a_pull_fetches_a_damaged_store_object_again(pushed, tmp_path, capsys,
                                                     kind, how) -> None:
    """A store object damaged since it was written (a per-weight file a pull adopted, or
    a range of a build's combined file) is fetched again from the registry, verified and
    put back, as a build rewrites it from its source; the pull says so on stderr."""
    host, package, manifest = pushed
    if kind == "pulled":
        store = WeightStore(tmp_path / "store")
        pull(f"{host}/pk/a:1", tmp_path / "first", store=store)
    else:
        store = WeightStore(shutil.copytree(package.parents[3] / "store", tmp_path / "store"))
    keys = sorted(_payload_layers(manifest))
    for key in keys[:2]:
        _flip(store, key, how)
    capsys.readouterr()
    assert main(["pull", f"{host}/pk/a:1", str(tmp_path / "out"), "--store",
                 str(store.root)]) == 0
    err = capsys.readouterr().err
    for key in keys[:2] if how == "flipped" else ():  # a short file is taken for missing
        assert f"store object {key}" in err and "was damaged" in err
    assert _tree(tmp_path / "out") == _tree(package)
    # every payload of the artifact is whole again; a truncated combined file of a build
    # also cuts objects the artifact has no blob of (a scenario's small weights, inline in
    # its models), which no pull can fetch: those, and only those, stay damaged
    damaged = {p.key for p in store.verify().problems}
    assert not damaged & set(_payload_layers(manifest))
    if (kind, how) != ("built", "truncated"):
        assert not damaged
    assert main(["verify", str(tmp_path / "out")]) == 0
    assert _leftovers(tmp_path) == [] and not list(store.root.glob(".pull-*"))


@needs_registry
@pytest.mark.parametrize("leave", [8 << 10, 48 << 10])
@pytest.mark.parametrize("full", ["store", "output"])
def test_a_pull_onto_a_full_disk_names_the_file(pushed, tmp_path, capsys, full, leave,
                                                small_disk) -> None:
    """No space left, in the store or where the output goes: one line naming the path,
    exit 2, no output folder, no temp file, the store as it was; once there is space, the
    same pull completes."""
    host, package, _ = pushed
    from weightstore.io.digests import digest_bytes, make_key
    from weightstore.store import BytesPayload

    store = WeightStore((small_disk if full == "store" else tmp_path) / "store")
    store.put([BytesPayload(make_key("blake3", digest_bytes("blake3", b"seed")), b"seed")],
              kind="separate")  # a store in use: its index there
    out = (small_disk if full == "output" else tmp_path) / "out"
    fill(small_disk, leave)  # nothing fits, or a part
    argv = ["pull", f"{host}/pk/a:1", str(out), "--store", str(store.root)]
    capsys.readouterr()
    assert main(argv) == 2, capsys.readouterr().err
    err = capsys.readouterr().err.strip()
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert "No space left on device" in err or "disk is full" in err, err
    assert str(small_disk) in err, err
    assert not out.exists() and _leftovers(out.parent) == []
    assert not list(store.root.glob(".pull-*")) and not list(store.root.glob("*.tmp"))
    assert not store.index.exists() or store.verify().ok
    (small_disk / "filler").unlink()
    assert main(argv) == 0
    assert _tree(out) == _tree(package)


# -- a registry that trickles --------------------------------------------------------------

def _trickling(upstream: str, what: str) -> Callable[[BaseHTTPRequestHandler, bytes], bool]:
    """Answers GETs whose path holds ``what`` whole in their headers, then one byte of
    the body every 0.1 s (until the client hangs up)."""
    import time

    def intercept(h: BaseHTTPRequestHandler, body: bytes) -> bool:
        if h.command != "GET" or what not in h.path:
            return False
        status, headers, data = forward(h, upstream, body)
        send_head(h, status, headers, len(data))
        for i in range(len(data)):
            h.wfile.write(data[i:i + 1])
            h.wfile.flush()
            time.sleep(0.1)
        return True
    return intercept


@needs_registry
@pytest.mark.parametrize("what", ["/blobs/", "/manifests/"])
def test_a_trickling_registry_is_given_up_on_with_one_line(pushed, tmp_path, capsys,
                                                           what) -> None:
    """A byte every 0.1 s never trips the timeout between bytes; the transfer's rate,
    measured over each --timeout window, does: one line naming the URL, exit 2, within
    a few windows, nothing left."""
    import time

    host, _, _ = pushed
    store = WeightStore(tmp_path / "store")
    with misbehaving(host, _trickling(host, what)) as proxy:
        start = time.monotonic()
        code = main(["pull", f"{proxy}/pk/a:1", str(tmp_path / "out"), "--store",
                     str(store.root), "--timeout", "1"])
        took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert "too slow" in err and what in err, err
    assert took < 6, took
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    assert not store.index.exists() or store.verify().ok  # a partial blob is kept to resume


# -- push to a registry that lies ----------------------------------------------------------

def _lying(upstream: str, how: str, elsewhere: str) -> Callable[[BaseHTTPRequestHandler, bytes],
                                                                 bool]:
    """What a registry that lies answers, the rest forwarded to ``upstream``."""
    def intercept(h: BaseHTTPRequestHandler, body: bytes) -> bool:
        if how == "has-every-blob" and h.command == "HEAD" and "/blobs/" in h.path:
            send_head(h, 200, [("Docker-Content-Digest", h.path.rsplit("/", 1)[1])], 1)
            return True
        if how == "mounts-anything" and h.command == "POST" and "mount=" in h.path:
            send_head(h, 201, [], 0)
            return True
        if how == "escapes" and h.command == "POST" and "/blobs/uploads/" in h.path:
            send_head(h, 202, [("Location", f"http://{elsewhere}/v2/steal?state=x")], 0)
            return True
        if how == "other-digest" and h.command == "PUT":
            status, headers, data = forward(h, upstream, body)
            other = "sha256:" + "0" * 64
            answer(h, status, [(k, other if k.lower() == "docker-content-digest" else v)
                               for k, v in headers], data)
            return True
        return False
    return intercept


@needs_registry
@pytest.mark.parametrize("how", ["has-every-blob", "mounts-anything", "escapes",
                                 "other-digest"])
def test_a_push_to_a_lying_registry_fails_closed(pushed, tmp_path, capsys, how) -> None:
    """Blobs it claims to hold but does not, mounts it claims but never made, an upload
    location on another host, another digest than the one sent: one line, exit 2, no tag
    published, nothing sent elsewhere, the package folder as it was."""
    host, package, _ = pushed
    before = _tree(package)
    contacted: list[str] = []

    def record(h: BaseHTTPRequestHandler, body: bytes) -> bool:
        contacted.append(f"{h.command} {h.path}")
        send_head(h, 500, [], 0)
        return True

    repository = f"pk/lied-{how}"
    with (misbehaving(None, record) as elsewhere,
          misbehaving(host, _lying(host, how, elsewhere)) as proxy):
        code = main(["push", str(package), f"{proxy}/{repository}:1", "--store",
                     str(empty_store(tmp_path / "store")), "--mount-from", "pk/a",
                     "--timeout", "5"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    assert contacted == []
    with pytest.raises(RegistryError, match="not found"):
        RegistryClient(host).get_manifest(parse_reference(f"{host}/{repository}:1"))
    assert _tree(package) == before


# -- --device and --scenario pulls from a registry that lies ------------------------------

def _relayered(host: str, manifest: dict, tag: str, change: Callable[[list], None]) -> str:
    """Push a copy of ``manifest`` whose layer list ``change`` altered; its reference."""
    ref = parse_reference(f"{host}/pk/a:{tag}")
    doc = json.loads(json.dumps(manifest))
    change(doc["layers"])
    RegistryClient(host, push=True).put_manifest(ref, tag, json.dumps(doc).encode())
    return str(ref)


def _swap_digests(layers: list) -> None:
    """Every payload layer names the blob of another payload of its size."""
    groups: dict[int, list[dict]] = {}
    for layer in layers:
        if PAYLOAD in (layer.get("annotations") or {}):
            groups.setdefault(layer["size"], []).append(layer)
    digests = {}
    for group in groups.values():
        for a, b in zip(group, group[1:] + group[:1], strict=True):
            digests[id(a)] = b["digest"]
    assert any(len(g) > 1 for g in groups.values())
    for layer in layers:
        layer["digest"] = digests.get(id(layer), layer["digest"])


def _oversize(layers: list) -> None:
    for layer in layers:
        if PAYLOAD in (layer.get("annotations") or {}):
            layer["size"] = 1 << 42


def _drop_payloads(layers: list) -> None:
    layers[:] = [x for x in layers if PAYLOAD not in (x.get("annotations") or {})]


def _drop_summary(layers: list) -> None:
    layers[:] = [x for x in layers
                 if (x.get("annotations") or {}).get(FILEPATH) != "summary.json"]


@needs_registry
@pytest.mark.parametrize("how", ["device", "scenario"])
def test_a_variant_pull_from_a_lying_registry_fails_closed(pushed, tmp_path, capsys,
                                                           how) -> None:
    """Payload layers naming other payloads' blobs, sizes past any file, payload layers
    or the summary's layer missing: one line, exit 2, no output, no root, nothing in the
    store that is not what its key says; the honest tag then pulls."""
    host, _, manifest = pushed
    store = WeightStore(tmp_path / "store")
    option = ["--device", "npu"] if how == "device" else ["--scenario", "half"]
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("mine")
    for case, change in (("swapped", _swap_digests), ("oversized", _oversize),
                         ("nopayloads", _drop_payloads), ("nosummary", _drop_summary)):
        ref = _relayered(host, manifest, f"{how}-{case}", change)
        for out, extra in ((tmp_path / "out", []), (tmp_path / "keep", ["--force"])):
            code = main(["pull", ref, str(out), "--store", str(store.root), *option, *extra])
            err = capsys.readouterr().err.strip()
            assert code == 2, (case, err)
            assert err.startswith("weightstore: error: ") and "\n" not in err, (case, err)
        assert not (tmp_path / "out").exists(), case
        assert _tree(tmp_path / "keep") == {"mine.txt": b"mine"}, case
        assert _leftovers(tmp_path) == [], case
        assert store.roots() == []
        assert not store.index.exists() or store.verify().ok, case
    assert main(["pull", f"{host}/pk/a:1", str(tmp_path / "out"), "--store",
                 str(store.root), *option]) == 0


# -- redirects: every hop under the rule the first one is under ----------------------------

ELSEWHERE = "http://10.0.0.1/v2/a/b/manifests/1"


def test_a_redirect_to_plain_http_elsewhere_is_refused_before_connecting(connections) -> None:
    """A loopback registry (plain http allowed) redirecting to plain http on another host:
    refused as a reference to that host would be, before any connection to it."""
    with (answering(_body(302, b"", Location=ELSEWHERE)) as host,
          pytest.raises(RegistryError, match="redirects to plain http") as info):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))
    assert info.value.context["location"] == ELSEWHERE
    assert set(connections) == {"127.0.0.1"}  # the registry's only (HTTPS first, then plain)


def test_a_token_service_on_plain_http_elsewhere_is_refused(connections) -> None:
    """The credentials would go there: the realm is checked as a redirect hop is."""
    def respond(h: BaseHTTPRequestHandler) -> None:
        realm = "http://10.0.0.1/token"
        return _body(401, b"{}", WWW_Authenticate=f'Bearer realm="{realm}",service="x"')(h)

    with (answering(respond) as host,
          pytest.raises(RegistryAuthError, match="plain http outside loopback")):
        RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))
    assert set(connections) == {"127.0.0.1"}  # the registry's only


def test_a_redirect_to_loopback_is_followed(connections) -> None:
    """The rule, not a ban on redirects: a hop that keeps to it is followed."""
    def respond(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/elsewhere"):
            return _body(200, b"{}", Content_Type=client_module.MANIFEST_TYPE)(h)
        return _body(307, b"", Location=f"http://{h.headers['Host']}/elsewhere")(h)

    with answering(respond) as host:
        data, _ = RegistryClient(host, FAST).get_manifest(parse_reference(f"{host}/a/b:1"))
    assert data == b"{}" and set(connections) == {"127.0.0.1"}
