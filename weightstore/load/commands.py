"""``weightstore run`` (resolve, load exactly the live payloads into onnxruntime, run once)
and ``weightstore prepare`` (a device's prepared weights built once, put in the store)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import LoadError
from ..resolve.commands import SOURCE_HELP, add_source_options, store_of


def register(sub: Any) -> None:
    """Add the commands' parsers to the ``weightstore`` subcommands."""
    rn = sub.add_parser("run", help="resolve, load exactly the live payloads into "
                                    "onnxruntime, and run once on given inputs")
    rn.add_argument("source", help=SOURCE_HELP)
    add_source_options(rn)
    rn.add_argument("--inputs", required=True, help="a .npz file with one array per input")
    rn.add_argument("--output", help="write the outputs to this .npz file")
    rn.add_argument("--json", action="store_true", help="print the load report as JSON")

    pp = sub.add_parser("prepare", help="build a device's prepared (prepacked) weights once "
                                        "and put them in the store")
    pp.add_argument("source", help="a package folder")
    pp.add_argument("--model", help="the model of a package holding several")
    pp.add_argument("--device", help="a device of the package (its scenario)")
    pp.add_argument("--scenario", help="a scenario (instead of a device)")
    pp.add_argument("--store", help="store folder (default: $WEIGHTSTORE_DIR or the user cache)")
    pp.add_argument("--json", action="store_true", help="print what was prepared as JSON")


def run_command(args: argparse.Namespace) -> int:
    import numpy as np

    from ..io.files import atomic_writer, check_output_file
    from ..resolve.api import resolve
    from . import LoadReport, load

    if args.output:  # before the run: a FIFO or a device is never replaced
        check_output_file(args.output)
    feed = _read_inputs(args.inputs)
    report = LoadReport()
    with resolve(args.source, model=args.model, device=args.device, scenario=args.scenario,
                 store=store_of(args)) as resolved:
        session = load(resolved, report=report)
        names = [o.name for o in session.get_outputs()]
        try:
            outputs = session.run(None, feed)
        except Exception as exc:
            raise LoadError(f"the model did not run on these inputs: {exc}",
                            inputs=args.inputs) from None
    if args.output:
        with atomic_writer(args.output) as f:
            np.savez(f, **dict(zip(names, outputs, strict=True)))
    summary = {"scenario": resolved.selected_scenario, "read_bytes": report.read_bytes,
               "live_bytes": report.live_bytes, "entries_read": report.entries_read,
               "fell_back": report.fell_back,
               "outputs": {n: {"shape": list(o.shape), "dtype": str(o.dtype)}
                           for n, o in zip(names, outputs, strict=True)}}
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        for n, o in zip(names, outputs, strict=True):
            print(f"{n}: {o.dtype} {list(o.shape)}")
        print(f"read {report.read_bytes} of {report.live_bytes} live bytes")
    return 0


def _read_inputs(path: str) -> dict[str, Any]:
    """``--inputs``: a .npz of arrays (``numpy.savez``), read safely (:mod:`..io.npz`)."""
    from ..io.npz import read_npz

    return read_npz(path, LoadError, what="the inputs")


def prepare_command(args: argparse.Namespace) -> int:
    from .prepare import prepare

    result = prepare(args.source, model=args.model, device=args.device,
                     scenario=args.scenario, store=store_of(args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(result.describe())
    return 0
