"""Content-addressed weight store: payload bytes keyed by digest, deduplicated across builds.

See :mod:`weightstore.store.writer` for the on-disk layout.
"""

from __future__ import annotations

from .index import FORMAT_VERSION, StoredObject
from .location import ENV_VAR, resolve_store_path, user_cache_dir
from .payload import BytesPayload, FilePayload, PayloadSource
from .stats import StoreStats
from .store import PutReport, WeightStore
from .verify import Problem, VerifyReport

__all__ = [
    "ENV_VAR",
    "FORMAT_VERSION",
    "BytesPayload",
    "FilePayload",
    "PayloadSource",
    "Problem",
    "PutReport",
    "StoreStats",
    "StoredObject",
    "VerifyReport",
    "WeightStore",
    "resolve_store_path",
    "user_cache_dir",
]
