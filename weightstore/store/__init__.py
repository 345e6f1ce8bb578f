"""Content-addressed weight store: payload bytes keyed by digest, deduplicated across builds.

See :mod:`weightstore.store.writer` for the on-disk layout. Names are loaded on first use
(PEP 562), so that resolving the store's location does not import the writer, the
verifier and the lock: an up-to-date ``weightstore build`` needs none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

_EXPORTS = {
    "ENV_VAR": "location",
    "resolve_store_path": "location",
    "user_cache_dir": "location",
    "FORMAT_VERSION": "index",
    "StoredObject": "objects",
    "RootRecord": "roots",
    "Root": "roots",
    "GcPlan": "gc",
    "BytesPayload": "payload",
    "FilePayload": "payload",
    "PayloadSource": "payload",
    "RepairReport": "repair",
    "StoreStats": "stats",
    "PutReport": "store",
    "WeightStore": "store",
    "Problem": "verify",
    "VerifyReport": "verify",
}

__all__ = [
    "ENV_VAR",
    "FORMAT_VERSION",
    "BytesPayload",
    "FilePayload",
    "GcPlan",
    "PayloadSource",
    "Problem",
    "PutReport",
    "RepairReport",
    "Root",
    "RootRecord",
    "StoreStats",
    "StoredObject",
    "VerifyReport",
    "WeightStore",
    "resolve_store_path",
    "user_cache_dir",
]

if TYPE_CHECKING:
    from .gc import GcPlan
    from .index import FORMAT_VERSION
    from .location import ENV_VAR, resolve_store_path, user_cache_dir
    from .objects import StoredObject
    from .payload import BytesPayload, FilePayload, PayloadSource
    from .repair import RepairReport
    from .roots import Root, RootRecord
    from .stats import StoreStats
    from .store import PutReport, WeightStore
    from .verify import Problem, VerifyReport


__getattr__, __dir__ = lazy_exports(
    __name__, {name: (module, name) for name, module in _EXPORTS.items()}, __all__)
