"""What a report was asked for: the one type every view's collector takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReportRequest:
    """What the report was asked for: ``target`` (a package folder, a release archive, or
    with ``store`` a store reference ``PACKAGE[/VERSION[/LAYOUT]]``), ``against`` (an older
    package or archive, for the diff view) and ``store`` (a store folder, for the store
    view and store references); ``folder`` is the target as a package folder (an archive
    unpacked, a store reference's build assembled from the store), None when the target is
    no package."""

    target: Path | None
    against: Path | None = None
    store: Path | None = None
    folder: Path | None = None
