"""Pulls through mirrors named in registries.conf: distribution's own pull-through cache
(a second ``docker-registry`` with ``proxy: {remoteurl: ...}``) in front of the origin,
a counting proxy in front of each to see who served what."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from weightstore.errors import RegistryError
from weightstore.registry.client import RegistryClient
from weightstore.registry.mirrors import Mirror, mirrors_for, read_mirrors
from weightstore.registry.pull import pull
from weightstore.registry.push import push
from weightstore.registry.reference import parse_reference
from weightstore.store import WeightStore

from .helpers import every_layout
from .registry_proxy import Counter, answer, misbehaving
from .registry_server import RegistryServer, free_port, needs_registry, running_registry
from .samples import make_encoder


def _conf(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_registries_conf_mirrors_by_longest_prefix(tmp_path, monkeypatch) -> None:
    conf = _conf(tmp_path / "registries.conf", """
unqualified-search-registries = ["docker.io"]
[[registry]]
location = "origin.example:5000"
[[registry.mirror]]
location = "m1.example:5001"
[[registry.mirror]]
location = "m2.example/cache"
insecure = true
pull-from-mirror = "digest-only"

[[registry]]
prefix = "origin.example:5000/team"
location = "origin.example:5000/team"
mirror-by-digest-only = true
[[registry.mirror]]
location = "team-mirror.example"
""")
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    by_tag = parse_reference("origin.example:5000/models/enc:1")
    by_digest = parse_reference("origin.example:5000/models/enc@sha256:" + "a" * 64)
    assert [m.location for m in mirrors_for(by_tag)] == ["m1.example:5001"]
    assert [m.location for m in mirrors_for(by_digest)] == ["m1.example:5001",
                                                             "m2.example/cache"]
    second = mirrors_for(by_digest)[1]
    assert second.insecure and second.host == "m2.example"
    assert str(second.reference(by_digest)) == f"m2.example/cache/models/enc@{by_digest.digest}"
    team = parse_reference("origin.example:5000/team/enc@sha256:" + "b" * 64)
    assert mirrors_for(team) == [Mirror("origin.example:5000/team", "team-mirror.example",
                                        False, "digest-only")]
    assert mirrors_for(parse_reference("origin.example:5000/team/enc:1")) == []
    assert str(mirrors_for(team)[0].reference(team)) == f"team-mirror.example/enc@{team.digest}"
    assert mirrors_for(parse_reference("other.example/enc:1")) == []
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(tmp_path / "absent.conf"))
    assert mirrors_for(by_tag) == []


@pytest.mark.parametrize("text, why", [
    ("[[registry]\n", "does not parse"),
    ("registry = 3\n", "array of tables"),
    ("[[registry]]\ninsecure = true\n", "location or a prefix"),
    ('[[registry]]\nlocation = "a.example"\n[[registry.mirror]]\ninsecure = true\n',
     "needs a location"),
    ('[[registry]]\nlocation = "a.example"\n[[registry.mirror]]\nlocation = "http://b"\n',
     "host\\[:port\\]"),
    ('[[registry]]\nlocation = "a.example"\n[[registry.mirror]]\nlocation = "b.example"\n'
     'pull-from-mirror = "sometimes"\n', "pull-from-mirror"),
])
def test_a_malformed_registries_conf_is_one_error_naming_it(tmp_path, text, why) -> None:
    conf = _conf(tmp_path / "registries.conf", text)
    with pytest.raises(RegistryError, match=why) as info:
        read_mirrors(conf)
    assert info.value.context["file"] == str(conf)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("packages")
    return {"folder": every_layout(folder, make_encoder(), "1.0.0")["separate"],
            "store": WeightStore(folder / "store")}


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """An origin registry, distribution's pull-through cache of it, a counting proxy in
    front of each, and a registries.conf naming the cache as the origin's mirror."""
    (tmp_path / "origin").mkdir()
    origin = RegistryServer(tmp_path / "origin").start()
    at_origin, at_mirror = Counter(), Counter()
    try:
        with misbehaving(origin.host, at_origin) as origin_front, \
                running_registry(tmp_path / "mirror", proxy=f"http://{origin_front}") as cache, \
                misbehaving(cache.host, at_mirror) as mirror_front:
            conf = _conf(tmp_path / "registries.conf",
                         f'[[registry]]\nlocation = "{origin_front}"\n'
                         f'[[registry.mirror]]\nlocation = "{mirror_front}"\ninsecure = true\n')
            monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
            yield {"origin": origin, "host": origin_front, "at_origin": at_origin,
                   "at_mirror": at_mirror, "mirror": mirror_front}
    finally:
        origin.stop()


def _blob_digests(ref: str) -> set[str]:
    """The digests of the config and layers of the manifest ``ref`` names."""
    manifest = json.loads(RegistryClient(parse_reference(ref).host).get_manifest(
        parse_reference(ref))[0])
    return {manifest["config"]["digest"]} | {layer["digest"] for layer in manifest["layers"]}


def _same_tree(a: Path, b: Path) -> None:
    result = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:2000]


@needs_registry
def test_pulls_through_a_pull_through_cache_and_the_origin_serves_each_blob_once(
        package, fleet, tmp_path, capsys) -> None:
    ref = f"{fleet['host']}/fleet/enc:1"
    pushed = push(package["folder"], ref, store=package["store"])
    assert fleet["at_mirror"].seen == []  # a push goes to the origin only
    blobs = _blob_digests(ref)
    fleet["at_origin"].seen.clear()
    for client in range(4):  # four nodes, one after another, each with its own store
        out = tmp_path / f"node{client}"
        report = pull(ref, out, store=WeightStore(tmp_path / f"store{client}"))
        assert report.manifest_digest == pushed.manifest_digest
        _same_tree(package["folder"], out)
    served = fleet["at_origin"].blob_gets()
    assert set(served) == blobs and set(served.values()) <= {1, 2}, served
    # the cache fetched each blob it missed (distribution 2.8 streams a missed blob to
    # its client and stores it with a second GET); the next three nodes cost none
    assert fleet["at_mirror"].blob_gets() == dict.fromkeys(blobs, 4)
    # every tag was resolved at the origin: a HEAD per node, no body
    heads = [p for m, p in fleet["at_origin"].seen if m == "HEAD" and "/manifests/1" in p]
    assert len(heads) >= 4

    # the origin stops: what the cache holds still pulls, by tag and by digest; a tag
    # the mirror alone resolved is said, never taken silently
    fleet["origin"].stop()
    capsys.readouterr()
    for i, name in enumerate([ref, f"{fleet['host']}/fleet/enc@{pushed.manifest_digest}"]):
        out = tmp_path / f"down{i}"
        report = pull(name, out, store=WeightStore(tmp_path / f"down-store{i}"))
        assert report.manifest_digest == pushed.manifest_digest
        _same_tree(package["folder"], out)
        said = capsys.readouterr().err
        assert ("did not answer" in said and "tag 1 is taken as the mirror" in said) == (
            i == 0), said


@needs_registry
def test_mirrors_are_tried_in_order_and_one_that_does_not_answer_is_passed_over(
        package, fleet, tmp_path, monkeypatch) -> None:
    """A mirror nothing listens on comes first: the pull goes on to the cache, the next
    mirror, and takes every blob from it; the origin serves none of them."""
    ref = f"{fleet['host']}/order/enc:1"
    push(package["folder"], ref, store=package["store"])
    conf = _conf(tmp_path / "ordered.conf",
                 f'[[registry]]\nlocation = "{fleet["host"]}"\n'
                 f'[[registry.mirror]]\nlocation = "127.0.0.1:{free_port()}"\n'
                 f'[[registry.mirror]]\nlocation = "{fleet["mirror"]}"\n')
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    warm = pull(ref, tmp_path / "warm", store=WeightStore(tmp_path / "warm-store"))
    fleet["at_origin"].seen.clear()
    fleet["at_mirror"].seen.clear()
    again = pull(ref, tmp_path / "again", store=WeightStore(tmp_path / "again-store"))
    assert again.manifest_digest == warm.manifest_digest
    _same_tree(package["folder"], tmp_path / "again")
    assert fleet["at_origin"].blob_gets() == {}
    blobs = _blob_digests(ref)
    assert fleet["at_mirror"].blob_gets() == dict.fromkeys(blobs, 1)


@needs_registry
def test_a_lying_mirror_costs_time_never_bytes(package, tmp_path, monkeypatch) -> None:
    """A mirror answering every blob and manifest with wrong bytes: the pull takes each
    from the origin, and the result is the origin's, byte for byte."""
    with running_registry(tmp_path / "origin") as origin:
        ref = f"{origin.host}/lies/enc:1"
        pushed = push(package["folder"], ref, store=package["store"])
        asked = Counter()

        def lie(handler, body: bytes) -> bool:
            asked(handler, body)
            if "/blobs/" in handler.path or "/manifests/" in handler.path:
                answer(handler, 200, [("Content-Type", "application/octet-stream")],
                       b'{"schemaVersion": 2, "layers": []}')
                return True
            return False

        with misbehaving(origin.host, lie) as liar:
            _conf(tmp_path / "registries.conf",
                  f'[[registry]]\nlocation = "{origin.host}"\n'
                  f'[[registry.mirror]]\nlocation = "{liar}"\n')
            monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(tmp_path / "registries.conf"))
            for i, name in enumerate([ref, f"{origin.host}/lies/enc@{pushed.manifest_digest}"]):
                out = tmp_path / f"out{i}"
                report = pull(name, out, store=WeightStore(tmp_path / f"store{i}"))
                assert report.manifest_digest == pushed.manifest_digest
                _same_tree(package["folder"], out)
            assert any("/blobs/" in p for _, p in asked.seen)  # it was asked, and refused


def test_a_malformed_registries_conf_stops_a_pull_in_one_line(tmp_path, monkeypatch,
                                                              capsys) -> None:
    from weightstore.cli import main

    conf = _conf(tmp_path / "registries.conf", "[[registry]\n")
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    assert main(["pull", "127.0.0.1:9/a/b:1", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "registries.conf does not parse" in err[0] and str(conf) in err[0]
    assert not (tmp_path / "out").exists()


@needs_registry
def test_an_origin_that_answers_no_head_resolves_the_tag_by_its_get(package, tmp_path,
                                                                  monkeypatch) -> None:
    """Some registries refuse a manifest's HEAD (405): the tag is then read from the
    origin's GET, and the pull goes on (here to the origin: the only mirror is down)."""
    with running_registry(tmp_path / "origin") as origin:
        def no_head(handler, body: bytes) -> bool:
            if handler.command == "HEAD" and "/manifests/" in handler.path:
                answer(handler, 405, [("Content-Type", "application/json")],
                       b'{"errors": [{"code": "UNSUPPORTED", "message": "no HEAD"}]}')
                return True
            return False

        with misbehaving(origin.host, no_head) as front:
            ref = f"{front}/nohead/enc:1"
            pushed = push(package["folder"], ref, store=package["store"])
            _conf(tmp_path / "registries.conf", f'[[registry]]\nlocation = "{front}"\n'
                  f'[[registry.mirror]]\nlocation = "127.0.0.1:{free_port()}"\n')
            monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(tmp_path / "registries.conf"))
            report = pull(ref, tmp_path / "out", store=WeightStore(tmp_path / "store"))
    assert report.manifest_digest == pushed.manifest_digest
    _same_tree(package["folder"], tmp_path / "out")


def test_a_mirror_never_gets_the_credentials_of_the_environment(monkeypatch) -> None:
    """$WEIGHTSTORE_REGISTRY_USERNAME/_PASSWORD name no host: they are the origin's,
    never sent to a mirror of it (whose own come from the Docker config by its host)."""
    from weightstore.registry.mirrors import MirroredClient

    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", "origin-secret")
    client = MirroredClient("origin.test:5000", None,
                            [Mirror("origin.test:5000", "mirror.test:5000")])
    assert client.credentials() is not None
    assert client.credentials().password == "origin-secret"
    (_, mirror_client), = client._mirrors
    assert mirror_client.credentials() is None
