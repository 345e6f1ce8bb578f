"""Recipe sources pinned by digest, fetched once into the store.

A model's ``source`` may be ``{url, sha256[, size]}`` (an HTTPS file; plain HTTP on
loopback only, at every hop of a redirect) or ``{ref: host/repository@sha256:…, path}``
(a file of an OCI artifact, pulled as ``weightstore pull`` pulls one, weightstore's or
another client's). The build's
fingerprint takes the pinned digest in place of the file's content, so a build whose
layouts are up to date, in the store or in a build cache fetches nothing; only a
conversion fetches, into::

    <store>/sources/sha256-<hex>/<the URL's file name>    a url source
    <store>/sources/oci-<hex of the manifest digest>/     a ref source (the artifact)
    <store>/sources/oci-<hex>.json                        its files' SHA-256, signed

A url source is streamed to a temp file and hashed on the way; a digest that is not the
pinned one is an error naming the source, and nothing is kept. A file already there is
used while its SHA-256 (through the MAC'd stat cache) is the pinned one. A pulled
artifact is verified blob by blob as it is pulled; its files' SHA-256 are then recorded
beside it under the user's MAC (:mod:`weightstore.store.mac`), and a later build uses the
folder only while every file still has its recorded digest (the stat cache again), else
pulls it anew.

No fetch holds a build for long (:func:`source_transport`: the registry's minimum rate,
tries of :data:`ANSWER_TIMEOUT` seconds, ``$WEIGHTSTORE_SOURCE_TIMEOUT`` for the whole of
one source) or fills the disk: a url's body stops at the pinned ``size`` and, without
one, while the store's file system still has :func:`_reserve` free.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ..errors import (
    IntegrityError,
    RecipeError,
    RegistryError,
    RegistryUnreachableError,
    WeightstoreError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..package.fingerprint import FileDigests
    from ..recipe.schema import ModelEntry, PinnedSource
    from ..registry.client import Transport

FOLDER = "sources"
TIMEOUT_ENV = "WEIGHTSTORE_SOURCE_TIMEOUT"
DEADLINE = 3600.0  # seconds for fetching one pinned source, whatever its size
ANSWER_TIMEOUT = 30.0  # seconds for each answer, and each window of the minimum rate
ATTEMPTS = 3  # tries of a request that breaks off or is not answered
RESERVE = 1 << 30  # bytes a url fetch leaves free on the store's disk (see _reserve)


def pinned_path(entry: ModelEntry, store_root: Path, digests: FileDigests) -> Path:
    """The local model file of ``entry``'s pinned source, fetched when missing."""
    pin = entry.source
    assert not isinstance(pin, str)
    return pinned_file(entry.name, pin, store_root, digests)


def pinned_file(name: str, pin: PinnedSource, store_root: Path, digests: FileDigests, *,
                what: str = "model") -> Path:
    """The local file of the pinned source ``pin`` of the recipe's ``what`` (a model, or
    a companion ``file``) ``name``, fetched when missing."""
    if pin.url is not None:
        return _url_source(name, pin, store_root, digests, what)
    return _ref_source(name, pin, store_root, digests, what)


def _url_source(name: str, pin: PinnedSource, store_root: Path, digests: FileDigests,
                what: str) -> Path:
    assert pin.url is not None and pin.sha256 is not None
    base = PurePosixPath(unquote(urlsplit(pin.url).path)).name
    file_name = base if base and base not in (".", "..") else "model.onnx"
    folder = store_root / FOLDER / f"sha256-{pin.sha256}"
    path = folder / file_name
    if path.is_file():
        with contextlib.suppress(OSError, WeightstoreError):
            if digests.of(path, "sha256") == pin.digest:
                return path
    folder.mkdir(parents=True, exist_ok=True)
    try:
        _download(name, pin, path, what)
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # empty unless an earlier fetch kept a good file
        raise
    return path


def source_transport(env: Mapping[str, str] | None = None) -> Transport:
    """How a pinned source is fetched (a url's file, a ref's artifact): 10 s to connect,
    :data:`ANSWER_TIMEOUT` for each answer and each window of the registry's minimum rate
    (:func:`weightstore.registry.client.body_pieces`), :data:`ATTEMPTS` tries (a ref's
    requests), and ``$WEIGHTSTORE_SOURCE_TIMEOUT`` seconds (default :data:`DEADLINE`, and
    no answer timeout or rate window longer) for the whole fetch of one source."""
    import os

    from ..io.net import seconds_setting
    from ..registry.client import Transport

    env = os.environ if env is None else env
    deadline = seconds_setting(env, TIMEOUT_ENV, DEADLINE, RecipeError)
    return Transport(read_timeout=min(ANSWER_TIMEOUT, deadline), attempts=ATTEMPTS,
                     deadline=deadline)


def _download(name: str, pin: PinnedSource, path: Path, what: str) -> None:
    """Stream the url to ``path`` (a temp file beside it, published only when the bytes
    have the pinned digest), every hop of a redirect checked (:func:`~weightstore.io.net.
    allowed_url`), the body read at the registry's minimum rate, within the deadline, and
    never past the pinned ``size`` nor the store's free space but :func:`_reserve`."""
    import hashlib
    import time

    from ..io import http, tls
    from ..io.files import atomic_writer
    from ..io.net import hop_guard
    from ..registry.client import body_pieces, timeouts

    t = source_transport()
    ends = time.monotonic() + (t.deadline or 0)
    where = {what: name, "url": pin.url}

    def refused(target: str) -> RecipeError:
        return RecipeError("the source redirects to plain http outside loopback (or to "
                           "another scheme); refused", **where, location=target)

    # the TLS a registry gets (trust, the host's certs.d folder); no proxy for loopback
    host = urlsplit(pin.url).netloc.rpartition("@")[2]
    session = http.Session(lambda: tls.context(host, RecipeError), RecipeError,
                           proxies=not _loopback_url(pin.url), guard=hop_guard(refused))
    try:
        with session, session.request("GET", pin.url, timeout=timeouts(t, ends)) as resp, \
                atomic_writer(path, sweep=True) as out:
            if resp.status_code != 200:
                raise RecipeError(f"cannot fetch the source: HTTP {resp.status_code}",
                                  **where)
            hasher, got = hashlib.sha256(), 0
            room = _room(path.parent)
            for chunk in body_pieces(resp, t, ends, **{what: name}):
                got += len(chunk)
                if pin.size is not None and got > pin.size:
                    raise IntegrityError("the source is larger than its pinned size",
                                         **where, size=pin.size)
                if got > room:
                    room = _room(path.parent) + got - len(chunk)  # asked again, then sure
                    if got > room:
                        raise RecipeError("the source would fill the store's disk; "
                                          "stopped", **where, received=got,
                                          reserve=_reserve(path.parent))
                hasher.update(chunk)
                out.write(chunk)
            if hasher.hexdigest() != pin.sha256:  # raised inside: the temp file goes
                raise IntegrityError("the source does not have its pinned digest",
                                     **where, expected=pin.digest,
                                     got=f"sha256:{hasher.hexdigest()}")
    except (http.Broken, http.TooManyRedirects) as exc:
        kind = exc.kind if isinstance(exc, http.Broken) else type(exc).__name__
        raise RecipeError(f"cannot fetch the source: {kind}", **where) from None
    except RegistryError as exc:  # too slow, past the deadline
        raise RecipeError(f"cannot fetch the source: {exc.message}", **where,
                          timeout=t.deadline) from None


def _loopback_url(url: str) -> bool:
    from ..io.net import loopback_name

    return loopback_name(urlsplit(url).hostname or "")


def _reserve(folder: Path) -> int:
    """Bytes a source fetch leaves free on the store's file system: :data:`RESERVE`, or
    a twentieth of a smaller file system."""
    import os

    st = os.statvfs(folder)
    return min(RESERVE, st.f_blocks * st.f_frsize // 20)


def _room(folder: Path) -> int:
    """Bytes a source fetch may still write into ``folder`` before the disk holds only
    :func:`_reserve` free."""
    import os

    st = os.statvfs(folder)
    return max(0, st.f_bavail * st.f_frsize - _reserve(folder))


def _listing(folder: Path) -> Path:
    return folder.with_name(folder.name + ".json")


def _record(folder: Path, digests: FileDigests) -> None:
    """Sign the SHA-256 of every file of a freshly pulled artifact."""
    from ..io.files import atomic_write_bytes
    from ..store.mac import entry_mac

    doc = {"folder": str(folder), "files": {
        p.relative_to(folder).as_posix(): digests.of(p, "sha256")
        for p in sorted(folder.rglob("*")) if p.is_file()}}
    mac = entry_mac(doc)
    if mac is not None:  # without the user's key nothing is trusted: pulled again
        atomic_write_bytes(_listing(folder), json.dumps({**doc, "mac": mac}).encode())


def _intact(folder: Path, digests: FileDigests) -> bool:
    """Is ``folder`` the artifact as pulled: its signed listing sound, every file there
    with its recorded SHA-256?"""
    from ..io.files import parse_json, read_record_bytes
    from ..store.mac import verify_mac

    try:
        doc = parse_json(read_record_bytes(_listing(folder)))
        mac = doc.pop("mac")
        if doc.get("folder") != str(folder) or not verify_mac(doc, mac):
            return False
        return all(digests.of(folder / name, "sha256") == digest
                   for name, digest in doc["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, WeightstoreError):
        return False


def _ref_source(name: str, pin: PinnedSource, store_root: Path, digests: FileDigests,
                what: str) -> Path:
    from ..io.files import discard_temp_dir, make_temp_dir, publish_dir
    from ..registry.pull import pull
    from ..store import WeightStore
    from ..store.temps import SOURCE_STAGE_PREFIX

    assert pin.ref is not None
    folder = store_root / FOLDER / f"oci-{pin.digest.partition(':')[2]}"
    if not _intact(folder, digests):
        folder.parent.mkdir(parents=True, exist_ok=True)
        transport = source_transport()
        stage = make_temp_dir(folder.parent, SOURCE_STAGE_PREFIX)
        try:  # the pull checks the manifest against the pinned digest, every blob its own
            try:
                pull(pin.ref, stage / "artifact", store=WeightStore(store_root),
                     transport=transport)
            except RegistryUnreachableError as exc:  # not answering, or past the deadline
                raise RecipeError(f"cannot fetch the source: {exc.message}", **{what: name},
                                  ref=pin.ref, timeout=transport.deadline) from None
            publish_dir(stage / "artifact", folder, replace=folder.exists())
        finally:
            discard_temp_dir(stage)
        _record(folder, digests)
    if pin.path is not None:
        path = folder / pin.path
        if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
            raise RecipeError(f"the pinned artifact has no such {what} file",
                              **{what: name}, ref=pin.ref, path=pin.path)
        return path
    models = sorted(p for p in folder.rglob("*.onnx") if p.is_file())
    if len(models) != 1:
        raise RecipeError("the pinned artifact holds no single .onnx file: give its path",
                          model=name, ref=pin.ref,
                          found=", ".join(str(p.relative_to(folder)) for p in models)
                          or "none")
    return models[0]
