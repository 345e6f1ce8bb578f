"""The process-level weight manager: one buffer per payload digest, shared by sessions.

GE's ExternalWeightManager, keyed by what the bytes are (their digest) rather than by
where they were read from, so two models of two packages sharing a weight read it once.
Each load takes a reference on every buffer it uses and gives it back when its session
is collected; a buffer whose count drops to zero is released. Buffers are views of a
load's mapped data file, the very pages onnxruntime maps. A weight that every consumer
pre-packs is not held: onnxruntime drops it once packed, and holding it would keep a
second copy for the session's lifetime (a later load reads it again).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Held:
    data: memoryview
    refs: int


class WeightManager:
    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def acquire(self, digest: str) -> memoryview | None:
        """The shared buffer of ``digest`` with one more reference, or None."""
        with self._lock:
            held = self._held.get(digest)
            if held is None:
                return None
            held.refs += 1
            return held.data

    def publish(self, digest: str, data: memoryview) -> memoryview:
        """Share ``data`` under ``digest`` (one reference); an existing buffer wins."""
        with self._lock:
            held = self._held.get(digest)
            if held is None:
                self._held[digest] = _Held(data, 1)
                return data
            held.refs += 1
            return held.data

    def release(self, digests: list[str]) -> None:
        with self._lock:
            for d in digests:
                held = self._held.get(d)
                if held is None:
                    continue
                held.refs -= 1
                if held.refs <= 0:
                    del self._held[d]

    def refcount(self, digest: str) -> int:
        with self._lock:
            held = self._held.get(digest)
            return 0 if held is None else held.refs

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(h.data) for h in self._held.values())


WEIGHTS = WeightManager()
