"""What an index row says about one payload: which store file holds it, where, how long."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Kind, kind_of

MAX_INT = 2**63 - 1  # SQLite's INTEGER range: larger offsets or sizes are damage


@dataclass(frozen=True)
class StoredObject:
    """Where the bytes of one payload live: ``size`` bytes of ``file`` at ``offset``."""

    key: str
    file: str
    offset: int
    size: int

    @property
    def kind(self) -> Kind:
        return kind_of(self.file)

    @property
    def end(self) -> int:
        return self.offset + self.size
