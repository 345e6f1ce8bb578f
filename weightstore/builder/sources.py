"""Recipe sources pinned by digest, fetched once into the store.

A model's ``source`` may be ``{url, sha256}`` (an HTTPS file; plain HTTP on loopback
only) or ``{ref: host/repository@sha256:…, path}`` (a file of an OCI artifact, pulled
as ``weightstore pull`` pulls one, weightstore's or another client's). The build's
fingerprint takes the pinned digest in place of the file's content, so a build whose
layouts are up to date, in the store or in a build cache fetches nothing; only a
conversion fetches, into::

    <store>/sources/sha256-<hex>/<the URL's file name>    a url source
    <store>/sources/oci-<hex of the manifest digest>/     a ref source (the artifact)

A url source is streamed to a temp file and hashed on the way; a digest that is not the
pinned one is an error naming the source, and nothing is kept. A file already there is
used while its SHA-256 (through the MAC'd stat cache) is the pinned one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ..errors import IntegrityError, RecipeError, WeightstoreError

if TYPE_CHECKING:
    from ..package.fingerprint import FileDigests
    from ..recipe.schema import ModelEntry, PinnedSource

FOLDER = "sources"
CHUNK = 1 << 20


def pinned_path(entry: ModelEntry, store_root: Path, digests: FileDigests) -> Path:
    """The local model file of ``entry``'s pinned source, fetched when missing."""
    pin = entry.source
    assert not isinstance(pin, str)
    if pin.url is not None:
        return _url_source(entry.name, pin, store_root, digests)
    return _ref_source(entry.name, pin, store_root)


def _url_source(name: str, pin: PinnedSource, store_root: Path, digests: FileDigests) -> Path:
    import hashlib

    import requests

    from ..io.files import atomic_writer

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
        with requests.get(pin.url, stream=True, timeout=(10, 60)) as resp, \
                atomic_writer(path) as out:
            if resp.status_code != 200:
                raise RecipeError(f"cannot fetch the source: HTTP {resp.status_code}",
                                  model=name, url=pin.url)
            hasher = hashlib.sha256()
            for chunk in resp.iter_content(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
            if hasher.hexdigest() != pin.sha256:  # raised inside: the temp file goes
                raise IntegrityError("the source does not have its pinned digest",
                                     model=name, url=pin.url, expected=pin.digest,
                                     got=f"sha256:{hasher.hexdigest()}")
    except requests.RequestException as exc:
        raise RecipeError(f"cannot fetch the source: {type(exc).__name__}", model=name,
                          url=pin.url) from None
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # empty unless an earlier fetch kept a good file
        raise
    return path


def _ref_source(name: str, pin: PinnedSource, store_root: Path) -> Path:
    from ..io.files import discard_temp_dir, make_temp_dir, publish_dir
    from ..registry.pull import pull
    from ..store import WeightStore

    assert pin.ref is not None
    folder = store_root / FOLDER / f"oci-{pin.digest.partition(':')[2]}"
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        stage = make_temp_dir(folder.parent, ".source.")
        try:  # the pull checks the manifest against the pinned digest, every blob its own
            pull(pin.ref, stage / "artifact", store=WeightStore(store_root))
            with contextlib.suppress(FileExistsError, OSError):
                publish_dir(stage / "artifact", folder)
        finally:
            discard_temp_dir(stage)
    if pin.path is not None:
        path = folder / pin.path
        if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
            raise RecipeError("the pinned artifact has no such model file", model=name,
                              ref=pin.ref, path=pin.path)
        return path
    models = sorted(p for p in folder.rglob("*.onnx") if p.is_file())
    if len(models) != 1:
        raise RecipeError("the pinned artifact holds no single .onnx file: give its path",
                          model=name, ref=pin.ref,
                          found=", ".join(str(p.relative_to(folder)) for p in models)
                          or "none")
    return models[0]
