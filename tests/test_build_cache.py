"""The registry-backed build cache, against a real registry: two runners with empty stores
of their own, one registry; entries used only when a trusted key signed them."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers import silent_server
from tests.registry_proxy import Counter, misbehaving
from tests.registry_server import needs_registry, running_registry
from tests.release_helpers import make_checkout
from weightstore.builder.remote_cache import RECORD_SUFFIX, _entry, _push_record, settings
from weightstore.builder.run import BuildOptions, build
from weightstore.caches.build_actions import action_key
from weightstore.cli import main
from weightstore.signing.keys import TRUSTED_KEYS_ENV, generate, load_private
from weightstore.store import WeightStore

pytestmark = needs_registry


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture
def keys(tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    return {name: (folder / f"{name}.pem", generate(folder / f"{name}.pem"))
            for name in ("ci", "old", "stranger")}


@pytest.fixture
def runner_a(encoder_model, tmp_path, registry, keys, monkeypatch):
    """Runner A converted the recipe and filled the cache, signing with the ci key."""
    repo = f"{registry.host}/cache/{tmp_path.name[-20:].lower()}"
    recipe = make_checkout(tmp_path / "a", encoder_model)
    result = build(recipe, BuildOptions(jobs=2, cache_to=repo, cache_key=str(keys["ci"][0])))
    assert all(p.status == "built" and p.cache is None for p in result.packages)
    return repo, recipe, result


def _runner_b(encoder_model, tmp_path, name="b"):
    return make_checkout(tmp_path / name, encoder_model)


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_trusted_entry_is_fetched_byte_identical(runner_a, encoder_model, tmp_path, keys,
                                                   monkeypatch, capsys):
    repo, _, built = runner_a
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    recipe = _runner_b(encoder_model, tmp_path)
    fetched = build(recipe, BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in fetched.packages] == [repo, repo]
    hits = [line for line in capsys.readouterr().err.splitlines() if ": hit, " in line]
    assert [line.split(": hit, ")[1].split()[0] for line in hits] == [
        str(p.path) for p in fetched.packages]  # said in recipe order
    for a, b in zip(built.packages, fetched.packages, strict=True):
        assert _tree(a.path) == _tree(b.path)  # the bytes a local build writes
    # the two layouts hold the same payloads, pulled at once: each blob read once (twice
    # would be twice the payloads; the rest is models, summaries and records)
    unique = sum({w["id"]: w["size"] for p in built.packages for m in p.summary["models"]
                  for w in m["external_weights"]}.values())
    assert unique < sum(p.cache_bytes for p in fetched.packages) < 1.5 * unique
    store = WeightStore(recipe.parent / "store")
    # an up-to-date build of runner B, then gc: the fetched packages are roots
    again = build(recipe, BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
    assert main(["store", "gc", "--store", str(store.root)]) == 0
    assert main(["verify", str(fetched.packages[0].path), "--store", str(store.root)]) == 0
    # the folder gone, the store (with the action records written on the way) rebuilds it
    import shutil

    shutil.rmtree(fetched.packages[1].path)
    third = build(recipe, BuildOptions(jobs=2))
    assert third.packages[1].status == "built" and third.packages[1].cache is None
    assert _tree(third.packages[1].path) == _tree(built.packages[1].path)


def test_cache_reads_go_through_the_registrys_mirror(runner_a, encoder_model, tmp_path,
                                                     keys, registry, monkeypatch):
    """A pull-through cache of the registry, named its mirror in registries.conf: runner
    B's cache reads take the record and the blobs from it, byte-identical."""
    repo, _, built = runner_a
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    asked = Counter()
    with running_registry(tmp_path / "mirror", proxy=f"http://{registry.host}") as cache, \
            misbehaving(cache.host, asked) as mirror:
        conf = tmp_path / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\n'
                        f'[[registry.mirror]]\nlocation = "{mirror}"\n')
        monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
        fetched = build(_runner_b(encoder_model, tmp_path),
                        BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in fetched.packages] == [repo, repo]
    for a, b in zip(built.packages, fetched.packages, strict=True):
        assert _tree(a.path) == _tree(b.path)
    manifests = [p for m, p in asked.seen if m == "GET" and "/manifests/" in p]
    assert any(RECORD_SUFFIX in p for p in manifests)  # the signed record, by its tag
    assert any("/manifests/sha256" in p for p in manifests)  # the package, by digest
    assert len(asked.blob_gets()) > 2  # the record's layer and the packages' blobs


def test_untrusted_tampered_or_absent_entries_are_misses(runner_a, encoder_model, tmp_path,
                                                        keys, registry, monkeypatch, capsys):
    repo, _, built = runner_a
    recipe = _runner_b(encoder_model, tmp_path)
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["old"][1].text)  # not the key that signed
    result = build(recipe, BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in result.packages] == [None, None]
    assert "signed by no trusted key" in capsys.readouterr().err
    assert _tree(result.packages[0].path) == _tree(built.packages[0].path)

    # someone with push rights but no trusted key replaces the record: still a miss
    fingerprint = built.packages[0].summary["fingerprint"]
    cache = settings(None, (), repo, str(keys["stranger"][0]))
    forged = json.dumps({"action_key": action_key(fingerprint), "fingerprint": fingerprint,
                         "manifest": "sha256:" + "0" * 64}).encode()
    _push_record(cache, _entry(repo, fingerprint, RECORD_SUFFIX), forged)
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    other = _runner_b(encoder_model, tmp_path, "c")
    result = build(other, BuildOptions(jobs=2, cache_from=(repo,)))
    assert result.packages[0].cache is None and result.packages[1].cache == repo
    err = capsys.readouterr().err
    assert "signed by no trusted key" in err and "hit" in err

    # a record signed by a trusted key, but of another build, is refused too
    cache = settings(None, (), repo, str(keys["ci"][0]))
    _push_record(cache, _entry(repo, fingerprint, RECORD_SUFFIX), json.dumps(
        {"action_key": action_key("blake3:" + "1" * 64), "fingerprint": fingerprint,
         "manifest": "sha256:" + "0" * 64}).encode())
    result = build(_runner_b(encoder_model, tmp_path, "d"),
                   BuildOptions(jobs=2, cache_from=(repo,)))
    assert result.packages[0].cache is None
    assert "of another build" in capsys.readouterr().err

    result = build(_runner_b(encoder_model, tmp_path, "e"),
                   BuildOptions(jobs=2, cache_from=(f"{registry.host}/cache/empty",)))
    assert [p.cache for p in result.packages] == [None, None]
    assert "no entry for this build" in capsys.readouterr().err


def test_key_rotation_trusts_either_key(encoder_model, tmp_path, registry, keys, monkeypatch,
                                       capsys):
    repo = f"{registry.host}/cache/rotation"
    build(make_checkout(tmp_path / "a", encoder_model),
          BuildOptions(jobs=2, cache_to=repo, cache_key=str(keys["old"][0])))
    monkeypatch.setenv(TRUSTED_KEYS_ENV, f"{keys['ci'][1].text},{keys['old'][1].text}")
    result = build(_runner_b(encoder_model, tmp_path), BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in result.packages] == [repo, repo]
    recipe = _runner_b(encoder_model, tmp_path, "c")  # the command line, from $WEIGHTSTORE_CACHE
    monkeypatch.setenv("WEIGHTSTORE_CACHE_FROM", repo)
    assert main(["build", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert out.count("   fetched ") == 2, out
    recipe = _runner_b(encoder_model, tmp_path, "d")  # the recipe's cache beats the variable
    monkeypatch.setenv("WEIGHTSTORE_CACHE_FROM", f"{registry.host}/cache/elsewhere")
    recipe.write_text(recipe.read_text() + f"cache: {{read: [{repo}]}}\n")
    result = build(recipe, BuildOptions(jobs=2))
    assert [p.cache for p in result.packages] == [repo, repo]


def test_a_registry_that_does_not_answer_costs_seconds_and_builds_locally(
        encoder_model, tmp_path, keys, monkeypatch, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    monkeypatch.setenv("WEIGHTSTORE_CACHE", f"127.0.0.1:{port}/cache/down")
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", keys["ci"][0].read_text())
    start = time.monotonic()
    recipe = _runner_b(encoder_model, tmp_path)
    result = build(recipe, BuildOptions(jobs=2))
    assert time.monotonic() - start < 30
    assert [p.status for p in result.packages] == ["built", "built"]
    err = capsys.readouterr().err
    assert "unavailable" in err and "could not store" in err
    # an up-to-date build, which looks its entries up to push the missing ones: asked
    # once, said once, and up to date all the same
    start = time.monotonic()
    result = build(recipe, BuildOptions(jobs=2))
    assert time.monotonic() - start < 15
    assert [p.status for p in result.packages] == ["up-to-date", "up-to-date"]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("could not store" in line for line in lines), lines


def test_two_runners_pushing_one_entry_at_once_leave_one_entry(encoder_model, tmp_path,
                                                              registry, keys, monkeypatch):
    repo = f"{registry.host}/cache/race"
    recipes = [make_checkout(tmp_path / n, encoder_model) for n in ("a", "b")]
    key = str(keys["ci"][0])
    import os
    import sys

    procs = [subprocess.Popen(  # two machines: each its own user cache folder
        [sys.executable, "-m", "weightstore", "build", str(r), "--cache-to", repo,
         "--cache-key", key, "--jobs", "1"],
        env={**os.environ, "XDG_CACHE_HOME": str(r.parent / "user-cache")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in recipes]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("stored" in err for _, err in outs), [err[-1500:] for _, err in outs]
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    result = build(_runner_b(encoder_model, tmp_path, "c"),
                   BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in result.packages] == [repo, repo]
    assert load_private(keys["ci"][0]).public == keys["ci"][1]


def test_a_registry_that_hangs_is_given_up_on_in_seconds(encoder_model, tmp_path, keys,
                                                         monkeypatch, capsys):
    """It accepts connections and never answers: the lookup waits 5 s, once."""
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    with silent_server() as host:
        repo = f"{host}/cache/hangs"
        start = time.monotonic()
        result = build(_runner_b(encoder_model, tmp_path), BuildOptions(
            jobs=2, cache_from=(repo,)))
        assert time.monotonic() - start < 15  # asked once, not once per layout
        assert [p.cache for p in result.packages] == [None, None]
        assert "unavailable" in capsys.readouterr().err


def test_an_entry_missing_blobs_or_with_its_tag_moved(runner_a, encoder_model, tmp_path,
                                                     keys, registry, monkeypatch, capsys):
    """The package is pulled by the digest the record signs: a tag moved to another
    manifest changes nothing; a blob deleted from the repository makes the entry a miss
    (the layout is built locally, nothing half-written)."""
    import requests

    from weightstore.registry.push import push

    repo, _, built = runner_a
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    combined, separate = built.packages
    store = WeightStore(built.store)
    # someone with push rights moves the combined entry's tag to the separate package
    push(separate.path, _entry(repo, combined.summary["fingerprint"]), store=store)
    result = build(_runner_b(encoder_model, tmp_path), BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in result.packages] == [repo, repo]
    assert _tree(result.packages[0].path) == _tree(combined.path)

    # a weight blob of the separate entry deleted from the repository (the combined entry
    # shares it: both layouts are pushed as per-weight blobs)
    name = repo.partition("/")[2]
    manifest = requests.get(f"http://{registry.host}/v2/{name}/manifests/"
                            f"{_entry(repo, separate.summary['fingerprint']).rpartition(':')[2]}",
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
                            timeout=10).json()
    weight = max(manifest["layers"], key=lambda d: d["size"])
    assert requests.delete(f"http://{registry.host}/v2/{name}/blobs/{weight['digest']}",
                           timeout=10).status_code == 202
    capsys.readouterr()
    result = build(_runner_b(encoder_model, tmp_path, "c"),
                   BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in result.packages] == [None, None]
    assert capsys.readouterr().err.count("entry unusable") == 2
    assert _tree(result.packages[0].path) == _tree(combined.path)
    assert _tree(result.packages[1].path) == _tree(separate.path)
    # the blob answered 404 left no partial file (there was nothing to resume)
    assert list((tmp_path / "c" / "store").glob(".pull-*")) == []


def test_records_of_any_shape_someone_with_push_rights_writes_are_misses(
        runner_a, encoder_model, tmp_path, keys, monkeypatch, capsys):
    """Not JSON, a descriptor without its size, two layers, a signed payload that is no
    object: each is one line and a local build, never a crash."""
    from weightstore.registry.artifact import sha256_digest
    from weightstore.registry.client import RegistryClient
    from weightstore.registry.push import bytes_pieces, upload_blob
    from weightstore.registry.reference import parse_reference
    from weightstore.signing.dsse import bundle_line, envelope

    repo, _, built = runner_a
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    fingerprint = built.packages[0].summary["fingerprint"]
    ref = parse_reference(_entry(repo, fingerprint, RECORD_SUFFIX))
    client = RegistryClient(ref.host, push=True)

    def blob(data: bytes) -> dict:
        digest = sha256_digest(data)
        upload_blob(client, ref, digest, len(data), bytes_pieces(data), [])
        return {"mediaType": "application/vnd.weightstore.cache-record.v1.dsse+json",
                "digest": digest, "size": len(data)}

    signed_list = bundle_line(envelope(b"[1, 2]", load_private(keys["ci"][0]),
                                       "application/vnd.weightstore.cache-record.v1+json"))
    config = blob(b"{}")
    shapes = {"not JSON": [blob(b"\x00not json")],
              "no size": [{k: v for k, v in blob(b"{}").items() if k != "size"}],
              "two layers": [blob(b"{}"), blob(b"[]")],
              "a list payload": [blob(signed_list)]}
    for n, (what, layers) in enumerate(shapes.items()):
        manifest = json.dumps({"schemaVersion": 2, "config": config, "layers": layers,
                               "mediaType": "application/vnd.oci.image.manifest.v1+json"})
        client.put_manifest(ref, ref.tag, manifest.encode())
        capsys.readouterr()
        result = build(_runner_b(encoder_model, tmp_path, f"r{n}"),
                       BuildOptions(jobs=2, cache_from=(repo,)))
        assert result.packages[0].cache is None, what
        assert result.packages[0].status == "built", what
        err = capsys.readouterr().err
        assert "miss, entry refused" in err, (what, err)


def _manifest_digest(registry, repo, fingerprint):
    """The digest of the package manifest the cache entry of ``fingerprint`` tags."""
    import requests

    name, tag = _entry(repo, fingerprint).split("/", 1)[1].split(":")
    return requests.head(f"http://{registry.host}/v2/{name}/manifests/{tag}", timeout=10,
                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}
                         ).headers["Docker-Content-Digest"]


def test_a_build_that_converts_nothing_still_fills_a_cache_lacking_its_entries(
        encoder_model, tmp_path, registry, keys, monkeypatch, capsys):
    """A runner whose store already holds the builds (packages up to date, or
    materialized from the store) pushes the entries the cache lacks (never configured
    before, or lost), replaces a record no trusted key signed, and leaves sound entries
    alone. ``--force`` pushes what it converts."""
    import shutil

    repo = f"{registry.host}/cache/warm"
    key = str(keys["ci"][0])
    recipe = make_checkout(tmp_path / "a", encoder_model)
    build(recipe)  # no cache yet
    build(recipe)  # stamped: up to date
    capsys.readouterr()
    result = build(recipe, BuildOptions(jobs=2, cache_to=repo, cache_key=key))
    assert [p.status for p in result.packages] == ["up-to-date", "up-to-date"]
    assert capsys.readouterr().err.count(": stored ") == 2

    # sound entries are left alone: one lookup each, nothing pushed; so is one another
    # trusted key signed (runners with keys of their own do not rewrite each other's)
    fingerprint = result.packages[1].summary["fingerprint"]
    cache = settings(None, (), repo, str(keys["old"][0]))
    _push_record(cache, _entry(repo, fingerprint, RECORD_SUFFIX), json.dumps(
        {"action_key": action_key(fingerprint), "fingerprint": fingerprint,
         "manifest": _manifest_digest(registry, repo, fingerprint)}).encode())
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["old"][1].text)
    result = build(recipe, BuildOptions(jobs=2, cache_to=repo, cache_key=key))
    assert ": stored " not in capsys.readouterr().err
    monkeypatch.delenv(TRUSTED_KEYS_ENV)
    result = build(recipe, BuildOptions(jobs=2, cache_to=repo, cache_key=key))
    assert capsys.readouterr().err.count(": stored ") == 1  # not trusted: replaced

    # a record signed by no trusted key is replaced; a folder materialized from the store
    fingerprint = result.packages[0].summary["fingerprint"]
    _push_record(settings(None, (), repo, str(keys["stranger"][0])),
                 _entry(repo, fingerprint, RECORD_SUFFIX), json.dumps(
                     {"action_key": action_key(fingerprint), "fingerprint": fingerprint,
                      "manifest": "sha256:" + "0" * 64}).encode())
    shutil.rmtree(result.packages[0].path)
    monkeypatch.setenv("WEIGHTSTORE_CACHE_TO", repo)  # the environment asks, as in CI
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", keys["ci"][0].read_text())
    result = build(recipe)
    assert [p.status for p in result.packages] == ["built", "up-to-date"]
    err = capsys.readouterr().err
    assert err.count(": stored ") == 1 and f"stored {result.packages[0].path.name}," in err
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    fetched = build(_runner_b(encoder_model, tmp_path), BuildOptions(jobs=2,
                                                                    cache_from=(repo,)))
    assert [p.cache for p in fetched.packages] == [repo, repo]

    # --force converts again, and pushes what it converted
    result = build(recipe, BuildOptions(jobs=2, force=True))
    assert capsys.readouterr().err.count(": stored ") == 2


def test_a_recipe_that_writes_a_cache_asks_it_at_every_build(encoder_model, tmp_path,
                                                              registry, keys, monkeypatch,
                                                              capsys):
    """Such a recipe is never decided by its build stamp: an entry lost from the cache
    after an up-to-date build is pushed again by the next one."""
    import requests

    repo = f"{registry.host}/cache/recipe-writes"
    recipe = make_checkout(tmp_path / "a", encoder_model)
    recipe.write_text(recipe.read_text() + f"cache: {{write: {repo}}}\n")
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", keys["ci"][0].read_text())
    assert main(["build", str(recipe)]) == 0
    assert main(["build", str(recipe)]) == 0
    assert capsys.readouterr().err.count(": stored ") == 2
    fingerprint = json.loads((recipe.parent / "out/pkg/1.0.0/combined/summary.json")
                             .read_text())["fingerprint"]
    name, tag = _entry(repo, fingerprint, RECORD_SUFFIX).split("/", 1)[1].split(":")
    url = f"http://{registry.host}/v2/{name}/manifests/"
    digest = requests.head(url + tag, timeout=10, headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json"}).headers[
            "Docker-Content-Digest"]
    assert requests.delete(url + digest, timeout=10).status_code == 202
    assert main(["build", str(recipe)]) == 0
    err = capsys.readouterr().err
    assert err.count(": stored ") == 1 and "stored combined," in err


# -- a cache that answers, slowly ----------------------------------------------------------

def _slow(upstream, what, rate, size=None):
    """A proxy intercept: GETs whose path holds ``what`` are answered with the registry's
    headers (or, with ``size``, a body of that many bytes announced), the body sent at
    ``rate`` bytes a second, in tenths."""
    from tests.registry_proxy import forward, send_head

    def intercept(h, body):
        if h.command != "GET" or what not in h.path:
            return False
        status, headers, data = forward(h, upstream, body)
        if size is not None:
            data = data + b" " * (size - len(data))
        send_head(h, status, headers, len(data))
        step = max(1, rate // 10)
        for i in range(0, len(data), step):
            h.wfile.write(data[i:i + step])
            h.wfile.flush()
            time.sleep(0.1)
        return True
    return intercept


@pytest.mark.parametrize("what, rate, size", [
    (f"{RECORD_SUFFIX}", 2048, 64 << 20),  # the record's manifest, 64 MiB at 2 KiB/s
    ("/blobs/", 1500, None)])  # every blob at 1.5 KB/s: above the minimum rate
def test_a_cache_that_answers_slowly_is_a_miss_within_its_deadline(
        runner_a, encoder_model, tmp_path, keys, monkeypatch, capsys, what, rate, size):
    """Slow enough to pass the minimum rate, far too slow to wait for: past
    $WEIGHTSTORE_CACHE_TIMEOUT the entry is a miss, the layouts convert locally, the
    repository is not asked again, and nothing of the pull is left."""
    from tests.registry_proxy import misbehaving

    repo, _, built = runner_a
    host, _, path = repo.partition("/")
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    monkeypatch.setenv("WEIGHTSTORE_CACHE_TIMEOUT", "2")
    recipe = _runner_b(encoder_model, tmp_path)
    with misbehaving(host, _slow(host, what, rate, size)) as proxy:
        start = time.monotonic()
        result = build(recipe, BuildOptions(jobs=2, cache_from=(f"{proxy}/{path}",)))
        took = time.monotonic() - start
    assert took < 20, took
    assert [(p.status, p.cache) for p in result.packages] == [("built", None)] * 2
    err = capsys.readouterr().err
    assert "deadline" in err and "not asking it again" in err, err
    for a, b in zip(built.packages, result.packages, strict=True):
        assert _tree(a.path) == _tree(b.path)
    store = recipe.parent / "store"
    assert not [p.name for p in store.glob(".pull-*") if p.stat().st_size == 0]


def test_a_record_larger_than_a_record_is_a_miss(runner_a, encoder_model, tmp_path, keys,
                                                 monkeypatch, capsys):
    """A record's manifest past 64 KiB, however fast: read no further, a miss."""
    from tests.registry_proxy import misbehaving

    repo, _, _ = runner_a
    host, _, path = repo.partition("/")
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    recipe = _runner_b(encoder_model, tmp_path)
    with misbehaving(host, _slow(host, RECORD_SUFFIX, 64 << 20, 64 << 20)) as proxy:
        result = build(recipe, BuildOptions(jobs=2, cache_from=(f"{proxy}/{path}",)))
    assert [p.cache for p in result.packages] == [None, None]
    err = capsys.readouterr().err
    assert "answer too large" in err and f"limit={64 << 10}" in err, err


def test_a_cache_timeout_that_is_not_seconds_is_refused_before_building(monkeypatch):
    from weightstore.errors import RegistryError

    with pytest.raises(RegistryError, match="WEIGHTSTORE_CACHE_TIMEOUT"):
        settings(None, ("127.0.0.1:5000/cache/x",), None,
                 env={"WEIGHTSTORE_CACHE_TIMEOUT": "-1"})
    read = settings(None, ("127.0.0.1:5000/cache/x",), None,
                    env={"WEIGHTSTORE_CACHE_TIMEOUT": "7.5"})
    assert read is not None and read.timeout == 7.5


def test_seven_writers_of_one_record_at_once_all_store_it(registry, keys):
    """Seven runners pushing one record at once: each uploads the blobs (none had them
    when it asked) and puts the manifest while the others' uploads rewrite the blobs'
    link files in the repository, which the CNCF registry writes in place (truncated,
    then written): a manifest checked meanwhile is refused DIGEST_INVALID. Tried again,
    every writer stores it. Rounds on fresh repositories, as the race is one of
    milliseconds."""
    import threading

    from weightstore.builder.remote_cache import CacheSettings

    signer = load_private(keys["ci"][0])
    failures: list[str] = []
    for round_ in range(30):
        reference = f"{registry.host}/cache/seven{round_}:ak-{round_}{RECORD_SUFFIX}"
        record = json.dumps({"round": round_}).encode()
        barrier = threading.Barrier(7)

        def writer(reference: str, record: bytes, barrier: threading.Barrier) -> None:
            cache = CacheSettings(write=reference.rpartition(":")[0], signer=signer)
            barrier.wait()
            try:
                _push_record(cache, reference, record)
            except Exception as exc:  # every failure is the finding
                failures.append(str(exc))

        threads = [threading.Thread(target=writer, args=(reference, record, barrier))
                   for _ in range(7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


def test_an_embedded_layout_is_fetched_as_every_other(encoder_model, tmp_path, registry,
                                                      keys, monkeypatch):
    """An ``embedded`` layout (its weights inside the model file) has an entry like every
    layout: a runner that converted it stores it, another fetches it byte-identical
    instead of converting it again (the cache held it and was never asked)."""
    repo = f"{registry.host}/cache/embedded-{tmp_path.name[-12:].lower()}"
    checkouts = []
    for name in ("a", "b"):
        recipe = make_checkout(tmp_path / name, encoder_model)
        recipe.write_text(recipe.read_text().replace(
            "  - {name: separate, external_weight: separate, size_threshold: 1024}",
            "  - {name: inline, external_weight: embedded}"))
        checkouts.append(recipe)
    built = build(checkouts[0], BuildOptions(jobs=2, cache_to=repo,
                                             cache_key=str(keys["ci"][0])))
    assert [p.layout for p in built.packages] == ["combined", "inline"]
    monkeypatch.setenv(TRUSTED_KEYS_ENV, keys["ci"][1].text)
    fetched = build(checkouts[1], BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.cache for p in fetched.packages] == [repo, repo]
    for a, b in zip(built.packages, fetched.packages, strict=True):
        assert _tree(a.path) == _tree(b.path)
    # fetched, it is proven the build as a converted one is, and up to date after
    store = checkouts[1].parent / "store"
    assert main(["verify", str(fetched.packages[1].path), "--store", str(store)]) == 0
    again = build(checkouts[1], BuildOptions(jobs=2, cache_from=(repo,)))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
