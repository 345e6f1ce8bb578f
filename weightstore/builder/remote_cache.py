"""A build cache in an OCI registry, its entries signed: what one CI runner built, another
fetches instead of converting again.

An entry is two artifacts in the cache repository, both tagged by the build's action key
(:func:`weightstore.caches.build_actions.action_key`, hex ``H``)::

    <repository>:ak-H       the package, pushed as ``weightstore push`` pushes one
                            (ModelPack, per-weight blobs shared with ordinary pushes)
    <repository>:ak-H.rec   the signed record: one layer, a DSSE envelope whose payload
                            names the action key, the fingerprint, the layout and the
                            package manifest's digest

A build that would convert a layout (its folder missing, the local store unable to
materialize it) first reads the record of each ``--cache-from`` repository. The record is
used only when a trusted key (:func:`weightstore.signing.keys.trusted_keys`) signed it
and it names this very action key and fingerprint; the package is then pulled *by the
digest the record signs*, every blob verified as it streams and only those missing from
the store fetched, and its ``summary.json`` must carry the fingerprint. So whoever can
push to the repository but holds no trusted key can make a runner build locally, never
ship other bytes. Anything else (no entry, no signature, an unknown key, a record of
another key, a manifest that is not the one signed, a registry that does not answer) is
a miss, said in one line, and the layout is converted locally. The registry is given a
few seconds to answer (:func:`_transport`), never the transfer timeouts, a record may be
at most :data:`MAX_RECORD` bytes (its manifest, and its layer), and reading one entry,
record and package together, has a deadline (``$WEIGHTSTORE_CACHE_TIMEOUT``, default
:data:`READ_DEADLINE` seconds): past it the entry is a miss and the repository is not
asked again in this build. A build never fails or stalls because its cache is down or
slow.

After converting, a build with ``--cache-to`` and a signing key pushes the entry: the
package (blobs the registry holds are skipped), then the record. Both are deterministic
(the package's bytes, an Ed25519 signature), so two runners pushing one entry at once
both succeed and leave one entry. A package the build did not convert is pushed only
when the repository holds no sound entry of it (:func:`store_entries`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    RegistryError,
    RegistryUnreachableError,
    SignatureError,
    WeightstoreError,
)
from ..io.files import parse_json

if TYPE_CHECKING:
    from ..signing.keys import PrivateKey, PublicKey
    from ..store import WeightStore

ENTRY_PREFIX = "ak-"
RECORD_SUFFIX = ".rec"
RECORD_PAYLOAD = "application/vnd.weightstore.cache-record.v1+json"
RECORD_LAYER = "application/vnd.weightstore.cache-record.v1.dsse+json"
RECORD_ARTIFACT = "application/vnd.weightstore.cache-record.v1"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
CACHE_ENV, FROM_ENV, TO_ENV = "WEIGHTSTORE_CACHE", "WEIGHTSTORE_CACHE_FROM", "WEIGHTSTORE_CACHE_TO"
TIMEOUT_ENV = "WEIGHTSTORE_CACHE_TIMEOUT"
READ_DEADLINE = 120.0  # seconds for reading one entry: its record, then its package
MAX_RECORD = 64 << 10  # bytes of a record's manifest, and of its one layer


def _transport(lookup: bool = False, deadline: float | None = None) -> Any:
    """A cache's registry gets seconds to answer, not the transfer timeouts: a lookup
    (the record) 2 s to connect and 5 s to answer, once; a transfer (the package) 3 s to
    connect and 10 s for each answer or window of progress, twice. ``deadline``: seconds
    for all of it."""
    from ..registry.client import Transport

    if lookup:
        return Transport(connect_timeout=2.0, read_timeout=5.0, attempts=1,
                         deadline=deadline)
    return Transport(connect_timeout=3.0, read_timeout=10.0, attempts=2, backoff=0.2,
                     max_backoff=0.5, deadline=deadline)


@dataclass
class CacheSettings:
    """Where a build reads cache entries (``read``) and writes them (``write``)."""

    read: tuple[str, ...] = ()
    write: str | None = None
    signer: PrivateKey | None = None
    trusted: list[PublicKey] = field(default_factory=list)
    down: set[str] = field(default_factory=set)  # repositories that did not answer: not
    # asked again during this build
    timeout: float = READ_DEADLINE  # seconds for reading one entry (record and package)

    def say(self, line: str) -> None:
        print(f"weightstore: cache: {line}", file=sys.stderr, flush=True)

    def not_stored(self, target: Path, exc: BaseException) -> None:
        """``write`` refused or did not answer for ``target``: said, and not asked again
        in this build."""
        self.say(f"{self.write}: could not store {target.name} ({exc})")
        self.down.add(self.write)  # type: ignore[arg-type]


def _repositories(cache: str | None, cache_from: tuple[str, ...], cache_to: str | None,
                  env: dict[str, str], recipe: Any) -> tuple[tuple[str, ...], str | None]:
    """The repositories read and the one written (see :func:`settings`)."""
    if cache is None and not cache_from and cache_to is None:
        if isinstance(recipe, str):
            cache = recipe
        elif recipe is not None:
            cache_from, cache_to = tuple(recipe.read), recipe.write
        else:
            cache = env.get(CACHE_ENV) or None
            cache_from = tuple(env.get(FROM_ENV, "").split())
            cache_to = env.get(TO_ENV) or None
    read = tuple(dict.fromkeys([*cache_from, *([cache] if cache else [])]))
    return read, cache_to or cache


def writes(cache: str | None, cache_from: tuple[str, ...], cache_to: str | None,
           recipe: Any = None, env: dict[str, str] | None = None) -> bool:
    """Would a build with these options (and the recipe's ``cache``, None when unknown)
    write a cache? Decided without a key or a network."""
    env = dict(os.environ) if env is None else env
    return _repositories(cache, cache_from, cache_to, env, recipe)[1] is not None


def settings(cache: str | None, cache_from: tuple[str, ...], cache_to: str | None,
             key: str | None = None, env: dict[str, str] | None = None,
             recipe: Any = None) -> CacheSettings | None:
    """The build's cache from its options, else the recipe's ``cache`` (a repository, or
    ``{read, write}``), else the environment (``$WEIGHTSTORE_CACHE``: read and write;
    ``$WEIGHTSTORE_CACHE_FROM``, space-separated; ``$WEIGHTSTORE_CACHE_TO``); None
    without any. Writing needs a signing key (``key``, a file, or
    ``$WEIGHTSTORE_SIGNING_KEY``), read before anything is built. Reading an entry has
    ``$WEIGHTSTORE_CACHE_TIMEOUT`` seconds (default :data:`READ_DEADLINE`)."""
    env = dict(os.environ) if env is None else env
    read, write = _repositories(cache, cache_from, cache_to, env, recipe)
    if not read and write is None:
        return None
    from ..io.net import seconds_setting
    from ..registry.reference import parse_reference
    from ..signing.keys import load_private, trusted_keys

    for ref in (*read, *([write] if write else [])):
        parse_reference(ref)  # well formed
        if "@" in ref or ":" in ref.partition("/")[2]:  # the host's port aside
            raise RegistryError("a cache is a repository: give it without a tag or digest",
                                reference=ref)
    # a writer trusts them too: a sound entry another trusted key signed is left alone
    out = CacheSettings(read, write, trusted=trusted_keys(env),
                        timeout=seconds_setting(env, TIMEOUT_ENV, READ_DEADLINE,
                                                RegistryError))
    if write is not None:
        out.signer = load_private(key, env)
    return out


def _entry(repository: str, fingerprint: str, suffix: str = "") -> str:
    from ..caches.build_actions import action_key
    from ..io.digests import split_key

    return f"{repository}:{ENTRY_PREFIX}{split_key(action_key(fingerprint))[1]}{suffix}"


def fetch(cache: CacheSettings, fingerprint: str, target: Path, store: WeightStore,
          jobs: int) -> tuple[str, int] | None:
    """Publish the package of ``fingerprint`` at ``target`` from the first cache that
    holds a trusted entry; the repository it came from and the bytes read from it (record
    and package), or None (a miss, said). Each entry is read within ``cache.timeout``
    seconds, record and package together."""
    import time

    from ..caches.build_actions import action_key

    key = action_key(fingerprint)
    for repository in cache.read:
        if repository in cache.down:
            continue
        ends = time.monotonic() + cache.timeout
        try:
            found = _trusted_manifest(cache, repository, fingerprint, key)
            if found is None:
                cache.say(f"{repository}: miss, no entry for this build")
                continue
            manifest, record_bytes = found
            left = ends - time.monotonic()
            received = record_bytes + _pull(repository, manifest, fingerprint, target, store,
                                            jobs, left)
        except (RegistryUnreachableError, OSError) as exc:
            cache.say(f"{repository}: unavailable ({exc}); building locally, and not "
                      "asking it again in this build")
            cache.down.add(repository)
            continue
        except SignatureError as exc:
            cache.say(f"{repository}: miss, entry refused: {exc}")
            continue
        except WeightstoreError as exc:  # a blob gone, a refusal, bytes that do not verify
            cache.say(f"{repository}: miss, entry unusable: {exc}")
            continue
        cache.say(f"{repository}: hit, {target} from the cache ({received} bytes)")
        return repository, received
    return None


def _trusted_manifest(cache: CacheSettings, repository: str, fingerprint: str,
                      key: str) -> tuple[str, int] | None:
    """The package manifest's digest a trusted record signs, and the bytes read; None
    when the repository has no record of ``key``."""
    from ..errors import RegistryNotFoundError
    from ..registry.fetch import blob_bytes
    from ..registry.mirrors import reading_client
    from ..registry.reference import parse_reference
    from ..signing.dsse import open_envelope

    ref = parse_reference(_entry(repository, fingerprint, RECORD_SUFFIX))
    client = reading_client(ref, _transport(lookup=True, deadline=cache.timeout))
    try:
        data, _ = client.get_manifest(ref, limit=MAX_RECORD)
    except RegistryNotFoundError:
        return None
    import tempfile

    from ..registry.artifact import descriptor_ok

    not_ours = SignatureError("the entry's record is not a weightstore cache record")
    try:  # whoever can push to the repository wrote it: nothing is assumed of its shape
        layers = parse_json(data)["layers"]
        if (not isinstance(layers, list) or len(layers) != 1
                or not descriptor_ok(layers[0]) or layers[0]["mediaType"] != RECORD_LAYER
                or layers[0]["size"] > MAX_RECORD):
            raise not_ours
        with tempfile.TemporaryDirectory(prefix=".cache-record.") as tmp:
            envelope = parse_json(blob_bytes(client, ref, layers[0], Path(tmp) / "record"))
    except (ValueError, KeyError, TypeError):
        raise not_ours from None
    payload, _ = open_envelope(envelope, cache.trusted, RECORD_PAYLOAD)
    try:
        record = parse_json(payload)
        assert isinstance(record, dict)
    except (ValueError, AssertionError):
        raise SignatureError("the signed record is not JSON") from None
    if record.get("action_key") != key or record.get("fingerprint") != fingerprint:
        raise SignatureError("the signed record is of another build")
    manifest = record.get("manifest")
    if not isinstance(manifest, str) or not manifest.startswith("sha256:"):
        raise SignatureError("the signed record names no manifest")
    return manifest, client.received_bytes


def _pull(repository: str, manifest: str, fingerprint: str, target: Path,
          store: WeightStore, jobs: int, deadline: float) -> int:
    """Pull the manifest the record signs into ``target`` (published whole, its blobs
    verified, its payloads in the store and the folder a root of it, as any pull), within
    ``deadline`` seconds; the bytes read."""
    import shutil

    from ..errors import IntegrityError
    from ..registry.pull import pull

    target.parent.mkdir(parents=True, exist_ok=True)
    report = pull(f"{repository}@{manifest}", target, store=store,
                  transport=_transport(deadline=deadline), jobs=jobs)
    summary = parse_json((target / "summary.json").read_bytes())
    if summary.get("fingerprint") != fingerprint:  # a trusted key signed a wrong record
        shutil.rmtree(target, ignore_errors=True)
        raise IntegrityError("the cached package is of another build",
                             fingerprint=summary.get("fingerprint"))
    return report.received_bytes


def store_entries(cache: CacheSettings, packages: list[tuple[Path, dict[str, Any], bool]],
                  store: WeightStore, jobs: int) -> None:
    """Push to ``cache.write`` the entry of each ``(folder, summary, converted)``: a
    package this build converted always; any other (up to date, materialized from the
    store, fetched from another cache) when the repository holds no sound entry of it
    (none, gone, or a record neither a trusted key nor this build's key signed: one a
    trusted key signed is left alone, so runners signing with different trusted keys do
    not rewrite each other's records). So a runner whose store already holds the builds
    still fills a cache that lost them."""
    from ..caches.build_actions import action_key

    assert cache.write is not None and cache.signer is not None
    mine = CacheSettings(trusted=[*cache.trusted, cache.signer.public], timeout=cache.timeout)
    for target, summary, converted in packages:
        if cache.write in cache.down:
            cache.say(f"{cache.write}: could not store {target.name} (it did not answer "
                      "earlier in this build)")
            continue
        if not converted:
            fingerprint = summary["fingerprint"]
            try:
                if _holds(mine, cache.write, fingerprint, action_key(fingerprint)):
                    continue
            except (RegistryUnreachableError, OSError) as exc:
                cache.not_stored(target, exc)
                continue
        publish(cache, target, summary, store, jobs)


def _holds(trusting: CacheSettings, repository: str, fingerprint: str, key: str) -> bool:
    """Does ``repository`` hold a record of ``key`` a key of ``trusting`` signed, and the
    package manifest it names?"""
    from ..registry.client import RegistryClient
    from ..registry.reference import parse_reference

    try:
        found = _trusted_manifest(trusting, repository, fingerprint, key)
        if found is None:
            return False
        ref = parse_reference(f"{repository}@{found[0]}")
        RegistryClient(ref.host, _transport(lookup=True, deadline=trusting.timeout),
                       ).get_manifest(ref)
    except RegistryUnreachableError:
        raise
    except WeightstoreError:  # a signature no key of ``trusting`` made, a manifest gone,
        return False  # a malformed answer: replaced by a sound entry
    return True


def publish(cache: CacheSettings, target: Path, summary: dict[str, Any],
            store: WeightStore, jobs: int) -> None:
    """Push the package at ``target`` and its signed record to ``cache.write``; a
    registry that refuses or does not answer is said in one line, never fatal."""
    assert cache.write is not None and cache.signer is not None
    from ..caches.build_actions import action_key
    from ..registry.push import push

    fingerprint = summary["fingerprint"]
    try:
        report = push(target, _entry(cache.write, fingerprint), store=store,
                      transport=_transport(), jobs=jobs)
        record = json.dumps({"action_key": action_key(fingerprint),
                             "fingerprint": fingerprint,
                             "layout": summary.get("layout", {}).get("name"),
                             "manifest": report.manifest_digest},
                            sort_keys=True, separators=(",", ":")).encode()
        _push_record(cache, _entry(cache.write, fingerprint, RECORD_SUFFIX), record)
    except (RegistryError, OSError) as exc:
        cache.not_stored(target, exc)
        return
    cache.say(f"{cache.write}: stored {target.name}, signed by {cache.signer.public.text}")


def _push_record(cache: CacheSettings, reference: str, record: bytes) -> None:
    from ..registry.artifact import sha256_digest
    from ..registry.client import RegistryClient
    from ..registry.push import bytes_pieces, upload_blob
    from ..registry.reference import parse_reference
    from ..signing.dsse import bundle_line, envelope

    assert cache.signer is not None
    ref = parse_reference(reference)
    layer = bundle_line(envelope(record, cache.signer, RECORD_PAYLOAD))
    config = b"{}"
    client = RegistryClient(ref.host, _transport(), push=True)
    descriptors = []
    for data, media in ((config, EMPTY_CONFIG), (layer, RECORD_LAYER)):
        digest = sha256_digest(data)
        upload_blob(client, ref, digest, len(data), bytes_pieces(data), [])
        descriptors.append({"mediaType": media, "digest": digest, "size": len(data)})
    manifest = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "artifactType": RECORD_ARTIFACT, "config": descriptors[0],
                           "layers": [descriptors[1]]},
                          sort_keys=True, separators=(",", ":")).encode()
    client.put_manifest(ref, ref.tag or "latest", manifest)
