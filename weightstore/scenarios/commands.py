"""``weightstore scenario list|show|add|remove``: printing around :mod:`.operations`
(``scenario replay`` resolves a variant: :mod:`weightstore.resolve.commands`)."""

from __future__ import annotations

import argparse
import json

from ..errors import ScenarioError
from ..io.files import parse_json
from . import operations


def run(args: argparse.Namespace) -> int:
    return ACTIONS[args.scenario_command](args)


def _list(args: argparse.Namespace) -> int:
    scenarios = operations.list_scenarios(args.model)
    if args.json:
        print(json.dumps(scenarios, indent=2, sort_keys=True))
    elif not scenarios:
        print("no scenarios")
    else:
        for s in scenarios:
            print(f"{s['name']}: {s['records']} record(s) "
                  f"({', '.join(s['operations']) or 'none'}), "
                  f"{s['digest_algorithm']} {s['base_graph_digest'][:16]}")
    return 0


def _show(args: argparse.Namespace) -> int:
    doc = operations.show_scenario(args.model, args.name)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"scenario {doc['name']}: {doc['records']} record(s)")
    for i, r in enumerate(doc["rewrites"]):
        where = "/".join(r["graph_path"]) or "main graph"
        print(f"  [{i}] {r['operation']} in {where}: removes nodes {r['removed_nodes']}, "
              f"adds {[n['op_type'] for n in r['added_nodes']]} at "
              f"{[n['position'] for n in r['added_nodes']]}, "
              f"+{len(r['added_initializers'])}/-{len(r['removed_initializers'])} "
              "initializers")
    return 0


def _passes(text: str) -> list:
    """``--passes``: comma-separated names, or a JSON list of names and
    ``{"name": ..., <parameters>}`` objects."""
    if not text.lstrip().startswith("["):
        return [p.strip() for p in text.split(",") if p.strip()]
    try:
        passes = parse_json(text)
    except ValueError as exc:
        raise ScenarioError(f"--passes is not a JSON list: {exc}") from None
    if not isinstance(passes, list):
        raise ScenarioError("--passes is not a JSON list")
    return passes


def _add(args: argparse.Namespace) -> int:
    passes = _passes(args.passes)
    out = operations.add_scenario(args.model, args.name, passes, output=args.output,
                                  replace=args.replace, digest=args.digest)
    records = next(s["records"] for s in operations.list_scenarios(out)
                   if s["name"] == args.name)
    names = [p if isinstance(p, str) else str(p.get("name")) for p in passes]
    print(f"added scenario {args.name} ({records} record(s) from "
          f"{', '.join(names)}) to {out}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    out = operations.remove_scenario(args.model, args.name, output=args.output)
    print(f"removed scenario {args.name} from {out}")
    return 0


ACTIONS = {"list": _list, "show": _show, "add": _add, "remove": _remove}
