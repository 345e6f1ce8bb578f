"""``weightstore.report(...)``: the command's work as one function."""

from __future__ import annotations

import os
from typing import Any


def report(target: str | os.PathLike[str] | None,
           output: str | os.PathLike[str] | None = None, *,
           against: str | os.PathLike[str] | None = None,
           store: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The report's data (what ``report --json`` prints); with ``output``, the HTML page
    written there too (temp file, fsync, rename: an older page is replaced whole)."""
    from ..io.files import atomic_write_bytes, check_output_file
    from .data import collect_report

    if output is not None:  # before the work: a FIFO or a device is never replaced
        check_output_file(output)
    data = collect_report(target, against=against, store=store)
    if output is not None:
        from .page import render_page

        atomic_write_bytes(output, render_page(data).encode())
    return data
