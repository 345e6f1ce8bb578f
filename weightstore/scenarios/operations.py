"""Scenarios of model files, as functions: what ``weightstore scenario`` runs.

Each takes a model file and works from its metadata (no payload byte is read); the
writing ones refuse, before writing anything, an output that would overwrite a file the
input model reads. ``replay_scenario``, which resolves a variant and writes it runnable,
is the deploy side's (:mod:`weightstore.resolve.runnable`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._proto import weightstore_pb2 as pb
from ..catalogue.reader import read_catalogue
from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..convert.weights import ModelWeights
from ..io.files import check_outputs
from ..io.onnx_proto import TensorProto
from ..passes.rewriting import derivations_of
from .api import (
    AddModificationScenarioOptions,
    add_modification_scenario,
    check_scenarios,
    find_scenario,
    remove_modification_scenario,
)
from .files import rewrite_scenarios_file
from .inputs import files_read, scenario_locations
from .package import check_name
from .recorded_passes import passes_entry, passes_of, steps_of, stored_digest
from .storage import read_scenarios
from .variants import scenario_rewrites

PathLike = str | os.PathLike[str]


def list_scenarios(model: PathLike) -> list[dict[str, Any]]:
    """The scenarios stored in ``model``: name, record count, digest and operations."""
    with read_catalogue(model) as catalogue:
        return [_summary(s) for s in check_scenarios(catalogue.model)]


def show_scenario(model: PathLike, name: str) -> dict[str, Any]:
    """One scenario's records: removed and added nodes, added weights, derivations."""
    with read_catalogue(model) as catalogue:
        check_scenarios(catalogue.model)
        s = find_scenario(catalogue.model, name)
    return {**_summary(s), "rewrites": [_record(r) for r in s.rewrites]}


def add_scenario(model: PathLike, name: str,
                 passes: Sequence[str | Mapping[str, Any]], *,
                 output: PathLike | None = None, replace: bool = False,
                 digest: str = "blake3") -> Path:
    """Run ``passes`` (names, or ``{name, <parameters>}`` mappings) on the model's
    metadata and store their records as scenario ``name``, with the passes they came
    from, in place unless ``output``; returns the file written."""
    check_name(name, str(model))
    steps = steps_of(passes)
    out = output_path(model, output, replaces_input=True)
    with ModelWeights.open(model) as mw:
        rewrites, _ = scenario_rewrites(mw, steps)  # the command prints the records' count
        meta = mw.metadata_model(SMALL_VALUE_LIMIT)
        check_scenarios(meta)
        add_modification_scenario(meta, name, rewrites, AddModificationScenarioOptions(
            digest_algorithm=digest, replace_existing=replace,
            metadata=dict([passes_entry(steps)])))
        scenarios = read_scenarios(meta)
    rewrite_scenarios_file(model, out, scenarios)
    return out


def remove_scenario(model: PathLike, name: str, *, output: PathLike | None = None) -> Path:
    """Drop scenario ``name``, in place unless ``output``; returns the file written."""
    out = output_path(model, output, replaces_input=True)
    with read_catalogue(model) as catalogue:
        meta = catalogue.model
        remove_modification_scenario(meta, name)
        scenarios = read_scenarios(meta)
    rewrite_scenarios_file(model, out, scenarios)
    return out


def _summary(s: pb.ModelModificationScenarioProto) -> dict[str, Any]:
    return {"name": s.scenario, "records": len(s.rewrites),
            "digest_algorithm": s.digest_algorithm,
            "base_graph_digest": s.base_graph_digest.hex(),
            "scenario_digest": stored_digest(s), "passes": passes_of(s),
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
            {"name": t.name, "dtype": TensorProto.DataType.Name(t.data_type),
             "shape": list(t.dims),
             "derived": ({"operation": derived[t.name].operation,
                          "sources": list(derived[t.name].sources)}
                         if t.name in derived else None)}
            for t in r.added_initializers],
        "removed_initializers": list(r.removed_initializers),
    }


def output_path(model: PathLike, output: PathLike | None, *, replaces_input: bool) -> Path:
    """Where the operation writes; refuses to overwrite what the input model reads (the
    model itself only when the operation rewrites it in place by design)."""
    src = Path(model)
    out = Path(output) if output else src
    with ModelWeights.open(src) as mw:
        meta = mw.metadata_model(SMALL_VALUE_LIMIT)
        inputs = files_read(src, meta, {d.file for d in mw.descriptors.values()})
        external = any(d.is_external for d in mw.descriptors.values())
    if replaces_input:
        inputs.discard(src.resolve())
    check_outputs(src, inputs, [out],
                  keeps_folder=replaces_input and (external or bool(scenario_locations(meta))))
    return out


__all__ = ["add_scenario", "list_scenarios", "output_path", "remove_scenario",
           "show_scenario"]
