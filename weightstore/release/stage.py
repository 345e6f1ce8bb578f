"""One pipeline stage on a thread of its own, behind a bounded queue.

Archiving feeds zstd's workers from one thread; whatever else that thread does (hashing
and writing the output) leaves them without input meanwhile. Such jobs run here instead,
in order, with at most ``depth`` items waiting (bounded memory); an error is raised again
on the feeding thread at its next call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Stage(Generic[T]):
    def __init__(self, work: Callable[[T], None], name: str, depth: int = 8,
                 done: Callable[[T], None] | None = None) -> None:
        """``done``, if given, gets every item once the stage is through with it, whether
        its work ran, failed or was skipped after an earlier error (to recycle buffers)."""
        self._work = work
        self._done = done
        self._queue: queue.Queue[tuple[T] | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._work(item[0])
                except BaseException as exc:  # re-raised on the feeding thread
                    self._error = exc
            if self._done is not None:
                self._done(item[0])

    def put(self, item: T) -> None:
        """Queue one item; the stage owns it until its work is done."""
        if self._error is not None:
            raise self._error
        self._queue.put((item,))

    def close(self) -> None:
        """Wait until every queued item is done; raise the stage's error, if any."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
