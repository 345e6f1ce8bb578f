"""``weightstore store ls | gc | pin | unpin | rm | export-meta``: roots, gc and GE's index."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..errors import StoreError
from .location import add_store_options

ACTIONS = ("ls", "gc", "pin", "unpin", "rm", "export-meta")


def add_parsers(ssub: Any, store_help: str) -> None:
    """Register the actions under ``weightstore store``."""
    def common(name: str, text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        sp = ssub.add_parser(name, help=text, description=text)
        add_store_options(sp, store_help)
        if json_flag:
            sp.add_argument("--json", action="store_true", help="print JSON")
        return sp

    common("ls", "list roots (packages that keep objects alive) with their size and the "
                 "bytes only they hold")
    gc = common("gc", "delete the objects no live root references, and compact combined "
                      "files")
    gc.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    gc.add_argument("--older-than", default="0s", metavar="DURATION",
                    help="keep objects written less than this long ago (e.g. 30m, 12h, 7d)")
    gc.add_argument("--compact-ratio", type=_ratio, default=0.5, metavar="R",
                    help="compact a combined file once this share of it is garbage "
                         "(default 0.5)")
    gc.add_argument("--no-roots-ok", action="store_true",
                    help="collect even when the store has no root at all (as right after "
                         "an upgrade from format 1, before any build registered its root)")
    for name, text in (("pin", "keep a root's objects even after its folder changes"),
                       ("unpin", "undo pin"), ("rm", "drop a root; the next gc may delete "
                                                      "what only it kept")):
        sp = common(name, text, json_flag=False)
        sp.add_argument("root", help="root id, package folder, or PACKAGE[/VERSION[/LAYOUT]]")
    ex = common("export-meta", "write meta.json in GE's shape (hash_to_weight_file, "
                               "hash_to_weight_offset, hash_to_weight_size)", json_flag=False)
    ex.add_argument("--output", help="where to write it (default: meta.json in the store)")


def _ratio(text: str) -> float:
    """``--compact-ratio``: a share of a file, more than 0 and at most 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 1 (a share of "
                                         "the file, e.g. 0.5)")
    return value


def run(store: Any, args: argparse.Namespace) -> int:
    action = args.store_command
    if action == "ls":
        return _ls(store, args)
    if action == "gc":
        return _gc(store, args)
    if action == "export-meta":
        path, count = store.export_meta(args.output)
        print(f"wrote {path} ({count} objects)")
        return 0
    if action == "rm":
        ids = store.remove_roots(args.root)
        print(f"removed {len(ids)} root(s)")
        return 0
    ids = store.pin(args.root, pinned=action == "pin")
    print(f"{action}ned {len(ids)} root(s)")
    return 0


def _ls(store: Any, args: argparse.Namespace) -> int:
    from .roots import malformed_roots

    roots = store.roots()
    if args.json:
        print(json.dumps([r.to_dict() for r in roots], indent=2, sort_keys=True))
        return 0
    with store.index.reading() as conn:
        damaged = len(malformed_roots(conn))
    print(f"{'ID':>5} {'PACKAGE':<20} {'VERSION':<10} {'LAYOUT':<14} {'SIZE':>10} "
          f"{'ONLY HERE':>10} {'STATE':<8} FOLDER")
    for r in roots:
        state = "pinned" if r.pinned else "live" if r.live else "dead"
        print(f"{r.id:>5} {r.package:<20} {r.version:<10} {r.layout:<14} {_mb(r.size):>10} "
              f"{_mb(r.exclusive_bytes):>10} {state:<8} {r.folder}")
    note = (f", {damaged} damaged (not listed: run 'weightstore store verify')" if damaged
            else "")
    print(f"{len(roots)} root(s), {sum(not r.live for r in roots)} dead{note}")
    return 0


def _gc(store: Any, args: argparse.Namespace) -> int:
    from .gc import parse_duration

    try:
        older = parse_duration(args.older_than)
    except ValueError as exc:
        raise StoreError(str(exc), option="--older-than") from None
    # a format 1 store is migrated, the temp files of killed writers removed, as by any
    # first write
    swept = [] if args.dry_run else store.open_for_writing()
    plan = store.plan_gc(older_than=older, compact_ratio=args.compact_ratio)
    refusal = None
    if plan.garbage and not plan.roots and not args.no_roots_ok:
        refusal = StoreError("the store has no roots, so gc would delete every object; build "
                             "your recipes first (each package registers its root, "
                             "up-to-date ones too) or pass --no-roots-ok",
                             objects=len(plan.garbage))
    if args.dry_run:  # what the real run would do, its refusal too
        if args.json:
            doc = {"dry_run": True, **plan.to_dict()}
            if refusal is not None:
                doc["refused"] = refusal.message
            print(json.dumps(doc, indent=2, sort_keys=True))
            return 0
        if refusal is not None:
            print(f"refused: {refusal.message}")
        for r in plan.dead_roots:
            print(f"drop root {r.id}: {r.package}/{r.version}/{r.layout} ({r.folder})")
        print(f"delete {len(plan.garbage)} objects "
              f"({_mb(sum(o.size for o in plan.garbage))}), {len(plan.delete_files)} files")
        for f in plan.compact:
            print(f"compact {f.file}: {_mb(f.live_bytes)} live of {_mb(f.size)}")
        for name in plan.temps:
            print(f"remove stale temp file {name}")
        _damaged_note(plan.damaged_rows)
        condition = "" if refusal is None else " with --no-roots-ok"
        print(f"would free about {_mb(plan.freed_bytes)}{condition} (dry run: nothing changed)")
        return 0
    if refusal is not None:
        raise refusal
    start = time.perf_counter()
    result = plan.execute(store)
    result.removed_temps[:0] = swept
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return 0
    for c in result.compacted:
        print(f"compacted {c['file']} -> {c['new_file']} (freed {_mb(c['freed_bytes'])})")
    for c in result.skipped:
        print(f"skipped {c['file']}: {c['reason']}")
    for name in result.removed_temps:
        print(f"removed stale temp file {name}")
    for name in result.removed_locks:
        print(f"removed lock file locks/{name} (its combined file is gone)")
    _damaged_note(plan.damaged_rows)
    print(f"dropped {result.dropped_roots} root(s), deleted {result.deleted_objects} objects "
          f"and {len(result.deleted_files)} files, freed {_mb(result.freed_bytes)} "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


def _damaged_note(rows: int) -> None:
    if rows:
        print(f"{rows} damaged root or lease row(s) keep the objects they name until "
              f"'weightstore store verify --repair' drops them")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
