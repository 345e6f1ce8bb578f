"""One pipeline stage on a thread of its own, behind a bounded queue.

Archiving feeds zstd's workers from one thread; whatever else that thread does (hashing
the input, hashing and writing the output) leaves them without input meanwhile. Those
jobs run here instead, in order, with at most ``depth`` chunks waiting (bounded memory);
an error is raised again on the feeding thread at its next call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Stage:
    def __init__(self, work: Callable[[bytes], None], name: str, depth: int = 8) -> None:
        self._work = work
        self._queue: queue.Queue[bytes | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._work(data)
                except BaseException as exc:  # re-raised on the feeding thread
                    self._error = exc

    def put(self, data: bytes) -> None:
        """Queue one chunk; it must not be changed afterwards (pass ``bytes``)."""
        if self._error is not None:
            raise self._error
        self._queue.put(data)

    def close(self) -> None:
        """Wait until every queued chunk is done; raise the stage's error, if any."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
