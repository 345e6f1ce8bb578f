"""Named arrays from a ``.npz`` file (``numpy.savez``) someone else wrote, read safely.

No pickle (``allow_pickle=False``), a FIFO, device or folder refused before any read, and
each member's header checked before its array is allocated: an array cannot claim more
bytes than its member holds once inflated, nor all of them together more than a limit,
so a small hostile file never makes the reader allocate gigabytes. Every refusal is one
error of the caller's type, never numpy's advice about pickles.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .files import open_regular

ErrorType = Callable[..., Exception]


def read_npz(path: str | os.PathLike[str], error: ErrorType, *, what: str,
             limit: int | None = None) -> dict[str, Any]:
    """The arrays of the ``.npz`` at ``path``, by name, in the file's order.

    ``what`` names the file in messages ("the inputs"); ``limit``: the most bytes all the
    arrays may hold together (None: no limit beyond each member's own size)."""
    import zipfile
    import zlib

    import numpy as np

    not_npz = (f"cannot read {what}: they must be a .npz file of arrays (numpy.savez), "
               "one per model input")
    # RuntimeError: zipfile's answer to an encrypted member, and (a subclass) to a
    # compression method it cannot read
    damaged = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError,
               MemoryError)
    try:
        f = os.fdopen(open_regular(path), "rb")
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}", file=str(path)) from None
    arrays: dict[str, Any] = {}
    with f:
        try:
            archive = zipfile.ZipFile(f)
        except damaged:
            raise error(not_npz, file=str(path)) from None
        with archive:
            total = 0
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                if not info.filename.endswith(".npy") or name in arrays:
                    raise error(not_npz, file=str(path), member=info.filename)
                try:
                    with archive.open(info) as member:
                        nbytes = _declared_bytes(np, member)
                    if nbytes > info.file_size:
                        raise ValueError("the header claims more than the member holds")
                except damaged:
                    raise error(not_npz, file=str(path), member=name) from None
                total += nbytes
                if limit is not None and total > limit:
                    raise error(f"cannot read {what}: its arrays hold more than "
                                f"{limit >> 20} MiB", file=str(path), member=name)
                try:
                    with archive.open(info) as member:
                        arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
                except damaged:
                    raise error(not_npz, file=str(path), member=name) from None
    return arrays


def _declared_bytes(np: Any, member: Any) -> int:
    """The bytes the array of an ``.npy`` member declares in its header (no object
    arrays: they need a pickle)."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise ValueError("an .npy format this reader does not know")
    if dtype.hasobject:
        raise ValueError("object arrays need a pickle")
    count = 1
    for dim in shape:
        count *= dim
    return count * dtype.itemsize
