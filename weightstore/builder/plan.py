"""``weightstore build --dry-run``: the plan of a build, in words, with nothing written."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import BuildResult


VERBS = {"would-build": "build", "would-materialize": "materialize"}


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def render_plan(result: BuildResult) -> str:
    """One line per layout (build, materialize from the store by its action record, or
    skip), then what the store would gain and reuse."""
    lines = []
    for p in result.packages:
        verb = VERBS.get(p.status, "skip (up-to-date)")
        lines.append(f"{verb:>17} {p.layout}: {p.path}")
    r = result.store_report
    if any(r.values()):
        lines.append(f"store {result.store}: would write {r['written_objects']} objects "
                     f"({_mb(r['written_bytes'])}), reuse {r['reused_objects']} "
                     f"({_mb(r['reused_bytes'])})")
        if r.get("derived_objects"):
            lines.append(f"  plus {r['derived_objects']} weights the scenarios derive "
                         f"({_mb(r['derived_bytes'])}), computed when built")
    elif not any(p.status in VERBS for p in result.packages):
        lines.append("nothing to build")
    return "\n".join(lines)
