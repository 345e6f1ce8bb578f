"""Pure planning: which payload goes to which file at which offset.

No I/O happens here. A plan depends only on the ordered payload list, the mode and the
alignment, which is what makes packages byte-identical whatever the state of the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..io.files import align_up, alignment_problem
from ..store.layout import combined_file_name, separate_file_name

Mode = Literal["embedded", "separate", "combined"]


@dataclass(frozen=True)
class PlannedPayload:
    key: str
    size: int
    file: str
    offset: int


@dataclass(frozen=True)
class PlannedFile:
    name: str
    size: int
    payloads: tuple[PlannedPayload, ...]

    @property
    def padding(self) -> int:
        return self.size - sum(p.size for p in self.payloads)


@dataclass(frozen=True)
class LayoutPlan:
    mode: Mode
    alignment: int
    files: tuple[PlannedFile, ...]

    def placement(self) -> dict[str, PlannedPayload]:
        return {p.key: p for f in self.files for p in f.payloads}

    @property
    def padding(self) -> int:
        return sum(f.padding for f in self.files)


def check_alignment(alignment: int) -> None:
    problem = alignment_problem(alignment)
    if problem is not None:
        raise ValueError(problem)


def plan_layout(stem: str, payloads: Sequence[tuple[str, int]], mode: Mode,
                alignment: int = 512) -> LayoutPlan:
    """Plan files for ``payloads`` (``(key, size)`` in first-use order, duplicates allowed)."""
    check_alignment(alignment)
    unique: dict[str, int] = {}
    for key, size in payloads:
        unique.setdefault(key, size)
    if mode == "embedded":
        return LayoutPlan(mode, alignment, ())
    if mode == "separate":
        files = tuple(
            PlannedFile(separate_file_name(k), s,
                        (PlannedPayload(k, s, separate_file_name(k), 0),))
            for k, s in unique.items())
        return LayoutPlan(mode, alignment, files)
    if mode == "combined":
        name = combined_file_name(stem)
        entries = []
        end = 0
        for key, size in unique.items():
            offset = align_up(end, alignment)
            entries.append(PlannedPayload(key, size, name, offset))
            end = offset + size
        files = (PlannedFile(name, end, tuple(entries)),) if entries else ()
        return LayoutPlan(mode, alignment, files)
    raise ValueError(f"unknown layout mode {mode!r}")


def plan_groups(groups: Sequence[tuple[str, Sequence[tuple[str, int]]]], mode: Mode,
                alignment: int = 512) -> LayoutPlan:
    """Plan named file groups (split layouts): each group is one combined file called by
    its name, or (separate mode) a folder of that name holding ``weight_<hex>`` files."""
    check_alignment(alignment)
    files: list[PlannedFile] = []
    for group, payloads in groups:
        if mode == "combined":
            sub = plan_layout("group", payloads, "combined", alignment)
            for f in sub.files:
                entries = tuple(PlannedPayload(p.key, p.size, group, p.offset)
                                for p in f.payloads)
                files.append(PlannedFile(group, f.size, entries))
        elif mode == "separate":
            sub = plan_layout("", payloads, "separate", alignment)
            for f in sub.files:
                name = f"{group}/{f.name}"
                files.append(PlannedFile(name, f.size, (PlannedPayload(
                    f.payloads[0].key, f.payloads[0].size, name, 0),)))
        else:
            raise ValueError(f"mode {mode!r} has no weight files to split")
    return LayoutPlan(mode, alignment, tuple(files))
