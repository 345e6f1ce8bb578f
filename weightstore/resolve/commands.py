"""``weightstore resolve`` and ``weightstore scenario replay`` (a variant resolved, then
written runnable); ``run`` and ``prepare``, which load, are :mod:`weightstore.load.commands`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..store.location import add_store_options

SOURCE_HELP = ("a package folder, a device folder (bundle, pull --device), a model file, "
               "or a build in the store: PACKAGE[/VERSION[/LAYOUT]][@ROOT_ID|@SUMMARY_DIGEST]")


def register(sub: Any) -> None:
    """Add the command's parser to the ``weightstore`` subcommands."""
    r = sub.add_parser("resolve", help="resolve a package or model from metadata and print "
                                       "its payload manifest (no payload read)")
    r.add_argument("source", help=SOURCE_HELP)
    add_source_options(r)
    r.add_argument("--transform", default="",
                   help="comma-separated passes to apply after the scenario")
    r.add_argument("--json", action="store_true",
                   help="print the resolved model (manifest, phases, requirements) as JSON")


def add_source_options(p: argparse.ArgumentParser) -> None:
    """--model, --device | --scenario and the store options of a command that resolves."""
    p.add_argument("--model", help="the model of a package holding several")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--device", help="a device of the package (its scenario and "
                                        "capabilities)")
    group.add_argument("--scenario", help="a scenario stored in the model")
    add_store_options(p, "store folder to take weights missing from the package from, and "
                         "store references' builds (default: $WEIGHTSTORE_DIR or the user "
                         "cache)")


def store_of(args: argparse.Namespace) -> Path:
    """The store a resolving command uses: ``--store``, the recipe's, or the default."""
    from ..store.location import resolve_store_path

    configured = None
    if getattr(args, "recipe", None):
        from ..recipe.schema import load_recipe

        configured = load_recipe(args.recipe).store_path()
    return resolve_store_path(args.store, configured)


def resolve_command(args: argparse.Namespace) -> int:
    from .api import resolve

    passes = [p for p in args.transform.split(",") if p]
    with resolve(args.source, model=args.model, device=args.device, scenario=args.scenario,
                 transformations=passes, store=store_of(args)) as resolved:
        m = resolved.payload_manifest
        if args.json:
            print(json.dumps(resolved.to_dict(), indent=2, sort_keys=True))
            return 0
        print(f"{resolved.source.name}: scenario {resolved.selected_scenario or '(default)'}"
              f", device {resolved.device}")
        for e in m.active:
            print(f"  active  {e.source.file or '(model)'}@{e.source.offset}+"
                  f"{e.source.length}  {', '.join(e.values)}  <- {'; '.join(e.reasons[:2])}")
        for e in m.dormant:
            print(f"  dormant {e.source.file or '(model)'}@{e.source.offset}+"
                  f"{e.source.length}  {', '.join(e.values)}  (fallback of {e.fallback_for})")
        print(f"{len(m.active)} active entries ({m.active_bytes} bytes), "
              f"{len(m.dormant)} dormant, {len(m.derivations)} derivations")
    return 0


def replay_command(args: argparse.Namespace) -> int:
    from .runnable import replay_scenario

    size = replay_scenario(args.model, args.name, args.output)
    print(f"wrote {args.output} ({size} bytes), scenario {args.name} replayed")
    return 0
