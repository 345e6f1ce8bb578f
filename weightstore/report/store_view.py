"""The store view (``report --store DIR``): which roots keep the store's bytes alive.

Every figure is the store's own: its objects and payload bytes from the index's
well-formed rows (``store stats``' figures), its roots as ``weightstore store ls`` lists
them (the bytes each names, and the bytes only it names: what removing it frees), the
pinned ones, what ``weightstore store gc`` would free now (its plan,
:meth:`WeightStore.plan_gc`, read from one snapshot of the index: dead roots, garbage
objects, files deleted or compacted), and the objects by age. Ages are counted back from
the store's newest object, never from the clock, so the same store gives the same page
whenever it is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .html import count, esc, figure, table

if TYPE_CHECKING:
    from .request import ReportRequest

DAY = 86_400
AGES = (("the newest day", 1 * DAY), ("1 to 7 days older", 7 * DAY),
        ("7 to 30 days older", 30 * DAY), ("30 to 90 days older", 90 * DAY),
        ("more than 90 days older", None))


def collect(request: ReportRequest) -> dict[str, Any] | None:
    if request.store is None:
        return None
    from ..errors import StoreError
    from ..store import WeightStore
    from ..store.index import INDEX_NAME

    if not (request.store / INDEX_NAME).is_file():
        raise StoreError("not a weight store (no index.sqlite)", path=str(request.store))
    store = WeightStore(request.store)
    roots = store.roots()
    plan = store.plan_gc()
    rows = store.object_ages()
    return {
        "store": request.store.name,
        "totals": {"objects": len(rows), "payload_bytes": sum(n for _, n in rows),
                   "roots": len(roots), "pinned": sum(r.pinned for r in roots),
                   "dead": sum(not r.live for r in roots)},
        "roots": [{"id": r.id, "package": r.package, "version": r.version,
                   "layout": r.layout, "folder": r.folder, "created": r.created,
                   "pinned": r.pinned, "live": r.live, "objects": r.objects,
                   "bytes": r.size, "exclusive_bytes": r.exclusive_bytes}
                  for r in sorted(roots, key=lambda r: (-r.exclusive_bytes, r.id))],
        "gc": {"dead_roots": len(plan.dead_roots), "garbage_objects": len(plan.garbage),
               "garbage_bytes": sum(o.size for o in plan.garbage),
               "delete_files": len(plan.delete_files), "compact_files": len(plan.compact),
               "freed_bytes": plan.freed_bytes},
        "ages": _ages(rows),
    }


def _ages(rows: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Objects and their bytes per age bucket, counted back from the newest object."""
    newest = max((c for c, _ in rows), default=0)
    buckets = [{"label": label, "objects": 0, "bytes": 0} for label, _ in AGES]
    for created, size in rows:
        age = newest - created
        i = next(i for i, (_, limit) in enumerate(AGES) if limit is None or age < limit)
        buckets[i]["objects"] += 1
        buckets[i]["bytes"] += size
    return buckets


def render(view: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    t, gc = view["totals"], view["gc"]
    cards = [
        ("objects", count("store.objects", t["objects"]), ""),
        ("payload bytes", figure("store.payload_bytes", t["payload_bytes"]), ""),
        ("roots", count("store.roots", t["roots"]),
         f"{t['pinned']} pinned, {t['dead']} dead"),
        ("gc would free", figure("gc.freed_bytes", gc["freed_bytes"]),
         f"{gc['garbage_objects']:,} garbage objects, {gc['dead_roots']} dead roots"),
    ]
    body = "".join(f'<div class="card"><div class="big">{value}</div><div>{esc(label)}'
                   f'</div><div class="sub">{esc(sub)}</div></div>'
                   for label, value, sub in cards)
    roots = table(["root", "state", "#objects", "#bytes", "#only here", "folder"], [
        (esc(f"{r['package']}/{r['version']}/{r['layout']}@{r['id']}"),
         esc("pinned" if r["pinned"] else "live" if r["live"] else "dead"),
         count(f"roots.{r['id']}.objects", r["objects"]),
         figure(f"roots.{r['id']}.bytes", r["bytes"]),
         figure(f"roots.{r['id']}.exclusive_bytes", r["exclusive_bytes"]),
         f"<code>{esc(r['folder'])}</code>") for r in view["roots"]])
    ages = table(["age (back from the newest object)", "#objects", "#bytes"], [
        (esc(a["label"]), count(f"ages.{i}.objects", a["objects"]),
         figure(f"ages.{i}.bytes", a["bytes"])) for i, a in enumerate(view["ages"])])
    plan = table(["gc would", "#"], [
        ("drop dead roots", count("gc.dead_roots", gc["dead_roots"])),
        ("delete garbage objects", count("gc.garbage_objects", gc["garbage_objects"])),
        ("of bytes", figure("gc.garbage_bytes", gc["garbage_bytes"])),
        ("delete files", count("gc.delete_files", gc["delete_files"])),
        ("compact combined files", count("gc.compact_files", gc["compact_files"])),
    ])
    return (f'<h2>Store {esc(view["store"])}</h2><div class="cards">{body}</div>'
            f"<h3>Roots, by the bytes only each holds</h3>{roots}"
            f"<h3>What gc would do now</h3>{plan}<h3>Objects by age</h3>{ages}")


def summarize(view: Mapping[str, Any]) -> list[str]:
    t, gc = view["totals"], view["gc"]
    lines = [f"store {view['store']}: {t['objects']:,} objects, {t['payload_bytes']:,} "
             f"payload bytes, {t['roots']} roots ({t['pinned']} pinned, {t['dead']} dead); "
             f"gc would free {gc['freed_bytes']:,} bytes"]
    lines += [f"  {r['package']}/{r['version']}/{r['layout']}@{r['id']}: "
              f"{r['exclusive_bytes']:,} bytes only here" for r in view["roots"][:10]]
    return lines
