"""A narrow view of the weight store for resolution and loading: where are these keys?

Resolution and loading only ever ask "where do the bytes of these digests live": this
adapter is the one place that talks to the store's API, so the store can change its index
(and this call become a batched ``locate``) without touching resolution or the loader.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import StoreError
from ..store.layout import is_store


@dataclass(frozen=True)
class StoredRange:
    path: Path
    offset: int
    length: int


class StoreLocator(Protocol):
    def locate(self, keys: Iterable[str]) -> dict[str, StoredRange]:
        """Where each key's bytes are; keys the store lacks are left out."""
        ...


class WeightStoreLocator:
    """:class:`StoreLocator` over a :class:`~weightstore.store.WeightStore` root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def locate(self, keys: Iterable[str]) -> dict[str, StoredRange]:
        from ..store import WeightStore

        if not is_store(self.root):
            return {}
        store = WeightStore(self.root)
        out: dict[str, StoredRange] = {}
        try:
            found = store.locate(keys)  # one batched lookup, whatever the store's size
        except (StoreError, ValueError):
            return out
        for key, obj in found.items():
            try:
                out[key] = StoredRange(store.path_of(obj), obj.offset, obj.size)
            except StoreError:
                continue
        return out
