"""``weightstore scenario list|show|add|remove|replay``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import onnx

from .._proto import weightstore_pb2 as pb
from ..catalogue.payload import SMALL_VALUE_LIMIT
from ..catalogue.reader import read_catalogue
from ..convert.weights import ModelWeights
from ..model_io import save_model
from ..outputs import check_outputs, files_read, scenario_locations
from .api import (
    AddModificationScenarioOptions,
    add_modification_scenario,
    check_scenarios,
    find_scenario,
    remove_modification_scenario,
)
from .files import rewrite_scenarios_file
from .package import check_name
from .rewriting import derivations_of
from .storage import read_scenarios
from .variants import runnable_variant, scenario_rewrites


def run(args: argparse.Namespace) -> int:
    return ACTIONS[args.scenario_command](args)


def _summary(s: pb.ModelModificationScenarioProto) -> dict[str, Any]:
    return {"name": s.scenario, "records": len(s.rewrites),
            "digest_algorithm": s.digest_algorithm,
            "base_graph_digest": s.base_graph_digest.hex(),
            "replay_format_version": s.replay_format_version,
            "operations": sorted({r.operation_name for r in s.rewrites})}


def _record(r: pb.LocalRewritingProto) -> dict[str, Any]:
    derived = derivations_of(r)
    return {
        "operation": r.operation_name,
        "graph_path": list(r.graph_path),
        "removed_nodes": list(r.removed_nodes),
        "added_nodes": [{"op_type": n.op_type, "name": n.name, "outputs": list(n.output),
                         "position": p}
                        for n, p in zip(r.added_nodes, r.added_nodes_positions, strict=False)],
        "added_initializers": [
            {"name": t.name, "dtype": onnx.TensorProto.DataType.Name(t.data_type),
             "shape": list(t.dims),
             "derived": ({"operation": derived[t.name].operation,
                          "sources": list(derived[t.name].sources)}
                         if t.name in derived else None)}
            for t in r.added_initializers],
        "removed_initializers": list(r.removed_initializers),
    }


def _list(args: argparse.Namespace) -> int:
    with read_catalogue(args.model) as catalogue:
        scenarios = [_summary(s) for s in check_scenarios(catalogue.model)]
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
    with read_catalogue(args.model) as catalogue:
        check_scenarios(catalogue.model)
        s = find_scenario(catalogue.model, args.name)
    doc = {**_summary(s), "rewrites": [_record(r) for r in s.rewrites]}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"scenario {s.scenario}: {len(s.rewrites)} record(s)")
    for i, r in enumerate(doc["rewrites"]):
        where = "/".join(r["graph_path"]) or "main graph"
        print(f"  [{i}] {r['operation']} in {where}: removes nodes {r['removed_nodes']}, "
              f"adds {[n['op_type'] for n in r['added_nodes']]} at "
              f"{[n['position'] for n in r['added_nodes']]}, "
              f"+{len(r['added_initializers'])}/-{len(r['removed_initializers'])} "
              "initializers")
    return 0


def _output(args: argparse.Namespace, *, replaces_input: bool) -> Path:
    """Where the command writes; refuses to overwrite what the input model reads (the
    model itself only when the command rewrites it in place by design)."""
    src = Path(args.model)
    out = Path(args.output) if args.output else src
    with ModelWeights.open(src) as mw:
        meta = mw.metadata_model(SMALL_VALUE_LIMIT)
        inputs = files_read(src, meta, {d.file for d in mw.descriptors.values()})
        external = any(d.is_external for d in mw.descriptors.values())
    if replaces_input:
        inputs.discard(src.resolve())
    check_outputs(src, inputs, [out],
                  keeps_folder=replaces_input and (external or bool(scenario_locations(meta))))
    return out


def _add(args: argparse.Namespace) -> int:
    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    check_name(args.name, args.model)
    out = _output(args, replaces_input=True)
    with ModelWeights.open(args.model) as mw:
        rewrites, _ = scenario_rewrites(mw, passes)
        model = mw.metadata_model(SMALL_VALUE_LIMIT)
        check_scenarios(model)
        add_modification_scenario(model, args.name, rewrites, AddModificationScenarioOptions(
            digest_algorithm=args.digest, replace_existing=args.replace))
        scenarios = read_scenarios(model)
    rewrite_scenarios_file(args.model, out, scenarios)
    print(f"added scenario {args.name} ({len(rewrites)} record(s) from "
          f"{', '.join(passes)}) to {out}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    out = _output(args, replaces_input=True)
    with read_catalogue(args.model) as catalogue:
        model = catalogue.model
        remove_modification_scenario(model, args.name)
        scenarios = read_scenarios(model)
    rewrite_scenarios_file(args.model, out, scenarios)
    print(f"removed scenario {args.name} from {out}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    _output(args, replaces_input=False)
    model = runnable_variant(args.model, args.name)
    size = save_model(model, Path(args.output))
    print(f"wrote {args.output} ({size} bytes), scenario {args.name} replayed")
    return 0


ACTIONS = {"list": _list, "show": _show, "add": _add, "remove": _remove, "replay": _replay}
