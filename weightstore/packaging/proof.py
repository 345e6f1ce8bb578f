"""Is this package folder the build the store recorded?

A folder's ``summary.json`` lists every file with its digest, so re-hashing proves that the
folder agrees with its summary: internal consistency, nothing more. Anyone who can write
the folder can change a model file and write its new size and digest into the summary,
leaving the fingerprint alone. The store knows better: a build records the very
``summary.json`` its fingerprint produced as a store key inside the action record
(:mod:`weightstore.caches.build_actions`), which carries a MAC under the user's own secret.
A folder whose summary has that key, and whose files agree with that summary, is the build.

:func:`recorded_build` answers from metadata alone (the action record and the summary's
bytes); the up-to-date check of ``build``, ``verify``, ``release`` and ``push`` all ask it.
Where the store does not know the build (another store, a deleted or unsound record, no
private key), only internal consistency can be proven: ``build`` then rebuilds the folder,
and ``verify``, ``release`` of a package folder and ``push`` say so.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import PackageError, StoreError
from ..io.digests import digest_bytes, make_key
from ..package.summary import SUMMARY_NAME

PROVEN_BUILD = "build"  # the folder is the build the store recorded
PROVEN_INTERNAL = "internal-consistency"  # the folder agrees with its own summary
NOT_THE_BUILD = ("package folder is not the build the store recorded for its fingerprint "
                 "(its summary.json differs)")
UNPROVEN_NOTE = "proven only internally consistent, not the build"


def proving_store(flag: str | None) -> Path:
    """The store a command proves a package folder against (``verify``, ``release`` of a
    package folder, ``push``): ``--store``, else ``$WEIGHTSTORE_DIR`` or the user cache
    folder. A ``--store`` given that is not a weightstore store (neither its index nor its
    ``meta.json`` there: a mistyped or an empty folder) would prove nothing: a
    :class:`~weightstore.errors.StoreError` naming the path."""
    from ..store.layout import is_store
    from ..store.location import resolve_store_path

    store = resolve_store_path(flag, None)
    if flag and not is_store(store):
        raise StoreError("--store is not a weightstore store (no index.sqlite or meta.json "
                         "there), so it can prove nothing about the package", path=str(store))
    return store


def recorded_summary_key(store_root: Path, fingerprint: object) -> str | None:
    """The store key of the ``summary.json`` the build of ``fingerprint`` wrote, from its
    action record when the record is sound (its MAC holds); None when the store does
    not know that build."""
    from ..caches import build_actions

    if not isinstance(fingerprint, str):
        return None
    record = build_actions.load(store_root, fingerprint)
    if record is None:
        return None
    return next((f.pieces[0].key for f in record.files if f.name == SUMMARY_NAME), None)


def recorded_build(store_root: Path | None, summary_bytes: bytes,
                   summary: Mapping[str, Any]) -> bool | None:
    """Does the store at ``store_root`` know the build of this summary's fingerprint, and
    is this summary (its exact bytes) the one that build wrote? True: yes; False: the
    store knows the build and this is not its summary; None: the store does not know it
    (or there is no store)."""
    if store_root is None:
        return None
    key = recorded_summary_key(store_root, summary.get("fingerprint"))
    if key is None:
        return None
    algo = key.partition(":")[0]
    return make_key(algo, digest_bytes(algo, summary_bytes)) == key


def check_recorded_build(folder: Path, store_root: Path | None, summary_bytes: bytes,
                         summary: Mapping[str, Any]) -> str:
    """What the store proves about the folder's summary: :data:`PROVEN_BUILD` when it is
    the one the store recorded, :data:`PROVEN_INTERNAL` when the store does not know the
    build; a :class:`~weightstore.errors.PackageError` when the store knows the build and
    this is not it (the caller re-hashes the files against the summary either way, and then
    says so with :func:`say_unproven` when only internal consistency is proven)."""
    found = recorded_build(store_root, summary_bytes, summary)
    if found is False:
        raise PackageError(NOT_THE_BUILD, folder=str(folder), store=str(store_root),
                           fingerprint=summary.get("fingerprint"))
    return PROVEN_BUILD if found else PROVEN_INTERNAL


def say_unproven(folder: Path, store_root: Path | None) -> None:
    """One stderr line: the store does not know the build of the folder, whose files were
    checked against its summary, so only internal consistency is proven (as ``verify``
    says it; ``release`` of a package folder and ``push`` go on: they cannot rebuild)."""
    print(f"weightstore: {folder}: {UNPROVEN_NOTE} (the store {store_root} holds no "
          "record of this build)", file=sys.stderr, flush=True)
