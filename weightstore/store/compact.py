"""Compaction: copy the live ranges of a combined file to a new file, swap the rows.

Under the file's own lock (appends to it wait), the live ranges are copied in offset
order to a temp file, each re-hashed against its key, fsynced and renamed to a new name
``<stem>.c<random>_weight_combined``; then one transaction re-points every row of the old
file to the new one, and only after it commits is the old file deleted. A kill at any
point leaves a temp file no process holds (removed by the next writer or gc, see
:mod:`.temps`), an orphan new file, or an orphan old file: garbage for the next gc,
never a row without its bytes. A file some live build holds a key of (a lease) is skipped
this time, since that build may be about to read it.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, StoreError
from ..io.digests import digest_fd, split_key
from ..io.files import (
    WRITE_ERRNOS,
    align_up,
    copy_range,
    file_mode,
    fsync_dir,
    locked_temp,
    open_regular,
)
from .layout import COMBINED_SUFFIX
from .objects import StoredObject

if TYPE_CHECKING:
    from .core import Store

KEPT_ALIGNMENT = 4096  # the largest alignment compaction keeps (a store file's, not a package's)


def compacted_name(file: str) -> str:
    """``enc_weight_combined`` -> ``enc.c<8 hex>_weight_combined`` (any earlier ``.c<hex>``
    is replaced, so names do not grow with every compaction)."""
    stem = file[: -len(COMBINED_SUFFIX)]
    base, dot, tail = stem.rpartition(".c")
    if dot and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail):
        stem = base
    return f"{stem}.c{os.urandom(4).hex()}{COMBINED_SUFFIX}"


def alignment_of(objects: list[StoredObject]) -> int:
    """The alignment the ranges were written with: the largest power of two (at most
    4096) dividing every offset."""
    g = 0
    for obj in objects:
        g = math.gcd(g, obj.offset)
    if g == 0:
        return KEPT_ALIGNMENT
    return min(KEPT_ALIGNMENT, g & -g)


def compact_file(store: Store, file: str) -> dict[str, Any]:
    """Compact ``file``; returns what happened (``new_file`` set when it was done)."""
    with store.file_lock(file):
        with store.index.reading() as conn:
            objects = list(store.index.objects(conn, file))
        if not objects:
            return {"file": file, "reason": "no live rows left"}
        old_path = store.root / file
        old_size = os.lstat(old_path).st_size
        new_name = compacted_name(file)
        placed = _copy_live(store, file, objects, new_name)
        if isinstance(placed, str):
            return {"file": file, "reason": placed}
        try:
            with store.index.writing() as conn:
                busy = conn.execute(
                    "SELECT 1 FROM lease_keys lk JOIN objects o ON o.key = lk.key "
                    "WHERE o.file = ? LIMIT 1", (file,)).fetchone()
                if busy:
                    raise _Busy
                for old, new in placed:
                    conn.execute("UPDATE objects SET file = ?, offset = ? WHERE key = ? AND "
                                 "file = ? AND offset = ?",
                                 (new.file, new.offset, old.key, old.file, old.offset))
        except _Busy:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store.root / new_name)
            return {"file": file, "reason": "a running build holds some of its keys"}
        # Rows no longer name the old file: delete it (still under its lock).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old_path)
        fsync_dir(store.root)
        new_size = os.lstat(store.root / new_name).st_size
        return {"file": file, "new_file": new_name, "objects": len(placed),
                "old_size": old_size, "new_size": new_size,
                "freed_bytes": old_size - new_size}


class _Busy(Exception):
    pass


def _copy_live(store: Store, file: str, objects: list[StoredObject], new_name: str,
               ) -> list[tuple[StoredObject, StoredObject]] | str:
    """Write the live ranges to ``new_name``, verified and durable; a string says why not."""
    alignment = alignment_of(objects)
    fd, tmp = locked_temp(store.root, f".{new_name}.")  # held until renamed or removed
    placed: list[tuple[StoredObject, StoredObject]] = []
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, file_mode())
        src = open_regular(store.root / file, nofollow=True)  # never waits on a FIFO
        try:
            end = 0
            for obj in objects:
                offset = align_up(end, alignment)
                try:
                    copy_range(src, obj.offset, fd, offset, obj.size)
                except EOFError:
                    return f"range of {obj.key} runs past the file's end; run 'store verify'"
                algo, expected = split_key(obj.key)
                if digest_fd(algo, fd, offset, obj.size) != expected:
                    return (f"bytes of {obj.key} do not match it; run 'weightstore store "
                            f"verify --repair' first")
                placed.append((obj, StoredObject(obj.key, new_name, offset, obj.size)))
                end = offset + obj.size
            if os.fstat(fd).st_size < end:
                os.ftruncate(fd, end)
        finally:
            os.close(src)
        os.fsync(fd)
        os.replace(tmp, store.root / new_name)
        tmp = ""
        fsync_dir(store.root)
        return placed
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:  # every later compaction would fail alike: stop gc
            raise StoreError(f"cannot compact {file}: {exc.strerror} while writing its "
                             f"{sum(o.size for o in objects)} live bytes to a new file; "
                             f"gc stopped, the file and its rows are unchanged",
                             path=str(store.root / new_name)) from exc
        return f"cannot copy: {exc}"
    except IntegrityError as exc:
        return f"cannot copy: {exc}"
    finally:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        os.close(fd)  # the lock last: once the temp name is gone
