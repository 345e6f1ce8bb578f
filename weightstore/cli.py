"""The ``weightstore`` command. Errors print one line and exit with code 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from .errors import WeightstoreError
from .io.workers import add_jobs_option
from .progress import requested
from .version import __version__

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def _integer(text: str) -> int:
    """The argument type of every integer option: one message for a value that is not one."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer") from None


def _count(text: str) -> int:
    """Sizes and thresholds: an integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return value


MAX_JOBS = 256  # workers a command may start: more buys nothing, and a 20-digit count
# overflowed the thread pool's C integer
MAX_CHUNK = 1 << 30  # bytes a push sends in one request: each chunk is held in memory


def _bounded(text: str, low: int, high: int) -> int:
    """An integer from ``low`` to ``high``, each bound named when it is crossed."""
    value = _integer(text)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be at least {low} and at most {high}")
    return value


def _jobs(text: str) -> int:
    """``--jobs``: worker threads, from 1 to :data:`MAX_JOBS`."""
    return _bounded(text, 1, MAX_JOBS)


def _chunk(text: str) -> int:
    """``--chunk-size``: bytes, from 1 to :data:`MAX_CHUNK`."""
    return _bounded(text, 1, MAX_CHUNK)


class _UsageError(WeightstoreError, ValueError):
    """A command line argparse refuses; reported like every other error."""


class _Parser(argparse.ArgumentParser):
    """argparse, its usage errors raised rather than printed with the usage text, so that
    they take the one-line (or, under ``--json``, JSON) form of every other error."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, usage=f"{self.prog} --help")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With ``command`` (one of :data:`COMMANDS`), only the
    parsers of that command's group are built, so that a command pays neither for
    importing nor for building the others; otherwise (help, an unknown command) all."""
    p = _Parser(prog="weightstore", description=__doc__.replace("``", ""))
    p.add_argument("--version", action="version", version=f"weightstore {__version__}")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true",
                      help="print nothing but errors (and what --json asks for)")
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="on an error, also print where in the code it happened")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for names, add in _GROUPS:
        if command not in COMMANDS or command in names:
            add(sub)
    for parser in _subparsers(p):
        _add_global_options(parser)
    return p


def _add_build(sub: Any) -> None:
    b = sub.add_parser("build", help="build every layout of a recipe into packages")
    b.add_argument("recipe", help="the recipe YAML file")
    b.add_argument("--store", help="store folder (beats the recipe, $WEIGHTSTORE_DIR and the "
                                   "user cache folder)")
    add_jobs_option(b, _jobs, "worker threads for hashing and copying")
    b.add_argument("--force", action="store_true",
                   help="rebuild and replace package folders, even up-to-date or different ones")
    b.add_argument("--json", action="store_true", help="print the build summaries as JSON")
    b.add_argument("--dry-run", action="store_true",
                   help="print the plan (layouts to build or skip, bytes to write and to "
                        "reuse) and write nothing")
    b.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="package only this model (repeatable; default: every model)")
    b.add_argument("--layout", action="append", default=[], metavar="NAME",
                   help="build only this layout (repeatable; default: every layout)")
    b.add_argument("--cache", metavar="REF",
                   help="a registry repository used as a signed build cache, read and "
                        "written (default: $WEIGHTSTORE_CACHE)")
    b.add_argument("--cache-from", action="append", default=[], metavar="REF",
                   help="a build cache only read (repeatable; default: "
                        "$WEIGHTSTORE_CACHE_FROM)")
    b.add_argument("--cache-to", metavar="REF",
                   help="a build cache only written: the entry of each package converted, "
                        "and of any other it lacks (default: $WEIGHTSTORE_CACHE_TO)")
    b.add_argument("--cache-key", metavar="FILE",
                   help="the Ed25519 private key cache entries are signed with (default: "
                        "$WEIGHTSTORE_SIGNING_KEY or $WEIGHTSTORE_SIGNING_KEY_B64)")


def _add_store(sub: Any) -> None:
    from .store.location import add_store_options

    s = sub.add_parser("store", help="the weight store: statistics, verification, roots, "
                                     "garbage collection")
    ssub = s.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    for name, text in (("stats", "object counts and sizes"),
                       ("verify", "re-hash every object; exit 1 on any mismatch")):
        sp = ssub.add_parser(name, help=text)
        add_store_options(sp, "store folder (beats $WEIGHTSTORE_DIR and the user cache "
                              "folder)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        if name == "verify":
            add_jobs_option(sp, _jobs, "worker threads for hashing")
            sp.add_argument("--repair", action="store_true",
                            help="drop damaged objects from the index (and delete their "
                                 "per-weight files) so the next build writes them again; "
                                 "exit 0 when everything left is sound")

    from .store.commands import add_parsers as add_store_parsers

    add_store_parsers(ssub, "store folder (beats $WEIGHTSTORE_DIR and the user cache folder)")


def _add_convert(sub: Any) -> None:
    c = sub.add_parser("convert", help="convert one model between weight forms")
    csub = c.add_subparsers(dest="direction", required=True, metavar="DIRECTION")
    for name, text in (("to-external", "inline -> ONNX external data in one aligned file"),
                       ("to-file-constant", "inline -> FileConstant nodes (GE)"),
                       ("to-inline", "external data and FileConstant nodes -> inline")):
        cd = csub.add_parser(name, help=text)
        cd.add_argument("input", help="the ONNX model to convert")
        cd.add_argument("output", help="the model file to write, every weight inside"
                        if name == "to-inline" else "the model file to write (its data "
                        "file goes beside it); replaced as a pair when it exists")
        if name == "to-inline":
            cd.add_argument("--value-bins", action="append", default=[], metavar="ID=PATH",
                            help="the file a GE FileConstant's file_id names (GE's "
                                 "ge.exec.value_bins); repeatable")
        else:
            cd.add_argument("--threshold", type=_count, default=1024,
                            help="payloads of at least this many bytes move out "
                                 "(default 1024)")
            cd.add_argument("--hash", choices=("blake3", "sha256"), default="blake3",
                            help="digest of each payload (default blake3)")
            cd.add_argument("--alignment", type=_integer, default=512,
                            help="each payload starts at a multiple of this many bytes, a "
                                 "power of two (default 512)")
        cd.add_argument("--json", action="store_true", help="print JSON")


def _add_inspect(sub: Any) -> None:
    i = sub.add_parser("inspect", help="list every weight of a model without reading payloads")
    i.add_argument("model")
    i.add_argument("--json", action="store_true", help="print JSON")


def _add_scenario(sub: Any) -> None:
    scen = sub.add_parser("scenario", help="modification scenarios stored in a model")
    ssc = scen.add_subparsers(dest="scenario_command", required=True, metavar="ACTION")
    sl = ssc.add_parser("list", help="the scenarios of a model")
    sl.add_argument("model")
    sl.add_argument("--json", action="store_true", help="print JSON")
    ss = ssc.add_parser("show", help="the records of one scenario")
    ss.add_argument("model")
    ss.add_argument("name")
    ss.add_argument("--json", action="store_true", help="print JSON")
    sa = ssc.add_parser("add", help="run passes on the model's metadata and store the "
                                    "records as a scenario")
    sa.add_argument("model")
    sa.add_argument("name")
    sa.add_argument("--passes", required=True,
                    help="comma-separated passes, in order (e.g. fuse-qkv,cleanup), or a "
                         "JSON list of names and {\"name\": ..., <parameters>} objects")
    sa.add_argument("--output", help="write here instead of replacing MODEL in place")
    sa.add_argument("--replace", action="store_true", help="replace a scenario of that name")
    sa.add_argument("--digest", choices=("blake3", "sha256"), default="blake3")
    sr = ssc.add_parser("remove", help="remove one scenario")
    sr.add_argument("model")
    sr.add_argument("name")
    sr.add_argument("--output", help="write here instead of replacing MODEL in place")
    sp = ssc.add_parser("replay", help="write the scenario's model, runnable, weights inline")
    sp.add_argument("model")
    sp.add_argument("name")
    sp.add_argument("--output", required=True, help="the model file to write")


def _add_check(sub: Any) -> None:
    ck = sub.add_parser("check", help="resolve a package for a scenario or device and check "
                                      "the files its live weights need")
    ck.add_argument("package", help="a package folder (holding summary.json), a device "
                                     "folder (holding bundle.json: bundle, pull --device), "
                                     "or a model file (a package's, a device folder's or "
                                     "any other)")
    which = ck.add_mutually_exclusive_group()
    which.add_argument("--scenario", help="resolve this scenario (default: the base graph)")
    which.add_argument("--device", help="resolve the scenario this device runs")
    ck.add_argument("--verify", action="store_true",
                    help="also re-hash every live payload against its checksum")
    ck.add_argument("--json", action="store_true", help="print JSON")


def _add_bundle(sub: Any) -> None:
    bd = sub.add_parser("bundle", help="assemble a device's self-contained folder from a "
                                       "package: its models, only the weight files they "
                                       "need and its companion files (a runtime folder)")
    bd.add_argument("package")
    bd.add_argument("device")
    bd.add_argument("--output", required=True, help="the folder to create")
    bd.add_argument("--no-verify", action="store_true",
                    help="skip resolving the written folder from its own record and "
                    "re-hashing its live payloads once more (each is still re-hashed as it "
                    "is written)")


def _add_release(sub: Any) -> None:
    from .release.commands import add_parsers

    add_parsers(sub, _jobs, _integer)


def _add_resolve(sub: Any) -> None:
    from .resolve.commands import register

    register(sub)


def _add_load(sub: Any) -> None:
    from .load.commands import register

    register(sub)


def _add_registry(sub: Any) -> None:
    from .registry.commands import add_parsers

    add_parsers(sub, _jobs, _chunk)


def _add_report(sub: Any) -> None:
    from .report.commands import add_parsers

    add_parsers(sub)


def _add_key(sub: Any) -> None:
    from .signing.commands import add_parsers

    add_parsers(sub)


def _add_schema(sub: Any) -> None:
    sc = sub.add_parser("schema", help="print the recipe JSON Schema")
    sc.add_argument("--output", help="write it to this file instead (the project's copy is "
                                     "schemas/recipe.schema.json)")


# each group's commands, in the order of the help, and the function that adds their parsers
_GROUPS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("build",), _add_build),
    (("store",), _add_store),
    (("convert",), _add_convert),
    (("inspect",), _add_inspect),
    (("scenario",), _add_scenario),
    (("check",), _add_check),
    (("bundle",), _add_bundle),
    (("verify", "release", "unpack", "diff"), _add_release),
    (("resolve",), _add_resolve),
    (("run", "prepare"), _add_load),
    (("push", "pull", "assemble"), _add_registry),
    (("report",), _add_report),
    (("key",), _add_key),
    (("schema",), _add_schema),
)


def _add_global_options(p: argparse.ArgumentParser) -> None:
    """``-q``/``-v`` after a command too (``weightstore build r.yaml -q``), as pip takes
    them; their defaults are left to the top-level parser's. Each parser also records its
    own help, so that arguments it does not know point at it."""
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                      help="print nothing but errors (and what --json asks for)")
    loud.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                      help="on an error, also print where in the code it happened")
    p.set_defaults(usage_help=f"{p.prog} --help")


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p``, at any depth."""
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += [child, *_subparsers(child)]
    return out


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, or None where the top-level parser acts before any
    command (help, version, ``--``) and must know them all. Top-level options take no
    values, so the first argument not starting with ``-`` is the command."""
    for arg in argv:
        if arg == "--" or (arg.startswith("--") and ("--help".startswith(arg)
                                                     or "--version".startswith(arg))):
            return None
        if arg.startswith("-"):
            if "h" in arg[1:]:  # -h, or -h among other short flags (-qh)
                return None
            continue
        return arg
    return None


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line; unknown arguments are reported against the help of the command
    that was given them, and ``-q`` with ``-v`` is refused wherever each stands."""
    parser = _parser(_command(argv))
    args, extra = parser.parse_known_args(argv)
    usage = getattr(args, "usage_help", f"{parser.prog} --help")
    if extra:
        raise _UsageError(f"unrecognized arguments: {' '.join(extra)}", usage=usage)
    if args.quiet and args.verbose:
        raise _UsageError("argument -v/--verbose: not allowed with argument -q/--quiet",
                          usage=usage)
    _refuse_nul(argv, args, usage)
    return args


def _refuse_nul(argv: list[str], args: argparse.Namespace, usage: str) -> None:
    """No path, name or reference can hold a NUL byte (a command line cannot either, but
    ``main([...])`` can be given one): refused here, naming the argument, rather than by
    whichever system call meets it first ("embedded null byte", no context)."""
    for i, arg in enumerate(argv):
        if "\0" not in arg:
            continue
        if arg.startswith("--") and "=" in arg:
            name = arg.split("=", 1)[0]
        elif i and argv[i - 1].startswith("-") and argv[i - 1] != "--":
            name = argv[i - 1]
        else:
            name = next((dest for dest, value in vars(args).items()
                         if value == arg or (isinstance(value, list) and arg in value)),
                        "value")
        raise _UsageError(f"argument {name}: contains a NUL byte, which no path or name "
                          "can hold", usage=usage, argument=name)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _cmd_build(args: argparse.Namespace) -> int:
    from .builder.run import BuildOptions, build

    result = build(args.recipe, BuildOptions(store=args.store, jobs=args.jobs,
                                             force=args.force, models=tuple(args.model),
                                             layouts=tuple(args.layout),
                                             progress=requested(args),
                                             dry_run=args.dry_run, cache=args.cache,
                                             cache_from=tuple(args.cache_from),
                                             cache_to=args.cache_to,
                                             cache_key=args.cache_key))
    if args.json:
        _print_json(result.to_dict())
        return EXIT_OK
    if args.dry_run:
        from .builder.plan import render_plan

        print(render_plan(result))
        return EXIT_OK
    r = result.store_report
    if any(r.values()):
        print(f"store {result.store}: wrote {r['written_objects']} objects "
              f"({_mb(r['written_bytes'])}), reused {r['reused_objects']} "
              f"({_mb(r['reused_bytes'])})")
    for p in result.packages:
        t = p.summary["totals"]
        status = "fetched" if p.cache else p.status
        print(f"{status:>10} {p.layout}: {p.path} — {t['models']} model(s), "
              f"{t['external_weights']} external weights in {t['weight_files']} file(s), "
              f"{_mb(t['weight_file_bytes'])} weights, dedup saved "
              f"{_mb(t['dedup_saved_bytes'])}")
    return EXIT_OK


def _open_store(args: argparse.Namespace):
    from .store import WeightStore, resolve_store_path

    configured = None
    if args.recipe:
        from .recipe.schema import load_recipe

        configured = load_recipe(args.recipe).store_path()
    return WeightStore(resolve_store_path(args.store, configured))


def _cmd_store(args: argparse.Namespace) -> int:
    store = _open_store(args)
    if args.store_command not in ("stats", "verify"):
        from .store.commands import run

        return run(store, args)
    if args.store_command == "stats":
        stats = store.stats()
        if args.json:
            _print_json(stats.to_dict())
        else:
            for k, v in stats.to_dict().items():
                print(f"{k:>20}: {v}")
        return EXIT_OK
    if args.repair:
        return _cmd_store_repair(store, args)
    report = store.verify(jobs=args.jobs, progress=requested(args))
    if args.json:
        _print_json(report.to_dict())
    else:
        _print_findings(report.problems, report.warnings, _failures(args))
        state = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        print(f"verified {report.objects} objects ({_mb(report.bytes_hashed)}): {state}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _cmd_store_repair(store: Any, args: argparse.Namespace) -> int:
    report = store.repair(jobs=args.jobs, progress=requested(args))
    if args.json:
        _print_json(report.to_dict())
        return EXIT_OK if report.ok else EXIT_FAILED
    if report.rebuilt is not None:
        print(f"rebuilt the lost index from {report.rebuilt} per-weight objects (what was "
              f"left of it is kept beside it as *.broken); combined files cannot be "
              f"re-indexed, and the roots are gone: build your recipes again to register "
              f"their packages before running gc")
    _print_findings(report.found.problems, ())
    for obj in report.dropped:
        print(f"dropped: {obj.key} {obj.file} [{obj.offset}, {obj.end})")
    for name in report.deleted_files:
        print(f"deleted: {name}")
    for fix in report.fixed_rows:
        print(f"{fix.action}: {fix.table} row {fix.row} ({fix.detail})")
    for name in report.restored_schema:
        print(f"restored: {name} (created again in the index, every row kept)")
    for name in report.removed_temps:
        print(f"removed temp file: {name} (left by an interrupted write)")
    for name in report.removed_locks:
        print(f"removed lock file: locks/{name} (its combined file is gone)")
    if report.restored_marker:
        print("restored: meta.json (the format 2 marker; what it held, if anything, is "
              "kept as meta.json.broken)")
    left = report.remaining
    _print_findings(left.problems, left.warnings, _failures(args))
    state = "ok" if report.ok else f"{len(left.problems)} problem(s)"
    print(f"verified {report.found.objects} objects ({_mb(report.found.bytes_hashed)}), "
          f"dropped {len(report.dropped)}, {left.objects} left: {state}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _failures(args: argparse.Namespace) -> Any:
    """Where a command's problem lines go: stdout with the rest of its report, stderr
    under ``-q`` (quiet means nothing but errors, and a failure's reasons are errors)."""
    return sys.stderr if getattr(args, "quiet", False) else sys.stdout


def _print_findings(problems: Sequence[Any], warnings: Sequence[Any],
                    failures: Any = None) -> None:
    for problem in problems:
        print(f"problem: {problem.kind}: {problem.key or ''} {problem.file or ''} "
              f"{problem.detail}".rstrip(), file=failures or sys.stdout)
    for warning in warnings:
        print(f"warning: {warning.kind}: {warning.file or ''} {warning.detail}".rstrip())


def _cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert_to_external, convert_to_inline
    from .convert.api import parse_value_bins

    if args.direction == "to-inline":
        report = convert_to_inline(args.input, args.output,
                                   value_bins=parse_value_bins(args.value_bins),
                                   progress=requested(args))
    else:
        form = "file-constant" if args.direction == "to-file-constant" else "external-data"
        report = convert_to_external(args.input, args.output, form=form,
                                     threshold=args.threshold, algo=args.hash,
                                     alignment=args.alignment,
                                     progress=requested(args))
    if args.json:
        _print_json(report.to_dict())
    else:
        extra = f" + {report.data_file.name}" if report.data_file else ""
        what = "tensors brought inline" if args.direction == "to-inline" else "external tensors"
        print(f"wrote {report.output}{extra} ({report.external_tensors} {what})")
    return EXIT_OK


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .catalogue.inspect import inspect_model, render_table

    report = inspect_model(args.model)
    if args.json:
        _print_json(report)
    else:
        print(render_table(report))
    return EXIT_OK


def _cmd_scenario(args: argparse.Namespace) -> int:
    if args.scenario_command == "replay":  # resolves the variant: the deploy side's
        from .resolve import commands as resolve_commands

        return resolve_commands.replay_command(args)
    from .scenarios import commands

    return commands.run(args)


def _cmd_check(args: argparse.Namespace) -> int:
    from .packaging.check import check_package

    report = check_package(args.package, scenario=args.scenario, device=args.device,
                           verify=args.verify, progress=requested(args))
    if args.json:
        _print_json(report.to_dict())
    else:
        for problem in report.problems:
            print(f"problem: {problem}", file=_failures(args))
        for m in report.models:
            where = (f"{m['live_weights']} live weights in weight files "
                     f"({_mb(m['live_bytes'])}): {', '.join(m['files'])}" if m["files"]
                     else "every live weight inside the model (no weight file)")
            print(f"{m['file']}: scenario {m['scenario'] or '(default)'}, {where}")
        print("ok" if report.ok else f"{len(report.problems)} problem(s)")
    return EXIT_OK if report.ok else EXIT_FAILED


def _cmd_bundle(args: argparse.Namespace) -> int:
    from .packaging.bundles import assemble

    record = assemble(args.package, args.device, args.output, verify=not args.no_verify,
                      progress=requested(args))
    files = ", ".join(f["name"] for f in record["files"]) or "no weight files"
    companions = record.get("companions", [])
    also = f" + {len(companions)} companion file{'s' * (len(companions) != 1)}" \
        if companions else ""
    print(f"assembled {args.device} in {args.output}: "
          f"{', '.join(m['file'] for m in record['models'])} + {files}{also}")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from .recipe.schema import render_schema, write_schema

    if args.output is None:
        sys.stdout.write(render_schema())
    else:
        print(f"wrote {write_schema(args.output)}")
    return EXIT_OK


def _cmd_resolve(args: argparse.Namespace) -> int:
    from .resolve import commands

    return commands.resolve_command(args)


def _cmd_load(args: argparse.Namespace) -> int:
    from .load import commands

    return {"run": commands.run_command, "prepare": commands.prepare_command}[args.command](
        args)


def _registry(handler: str, args: argparse.Namespace) -> int:
    from .registry import commands

    return getattr(commands, handler)(args)


def _report_command(args: argparse.Namespace) -> int:
    from .report.commands import run

    return run(args)


def _key_command(args: argparse.Namespace) -> int:
    from .signing.commands import run

    return run(args)


def _release(args: argparse.Namespace) -> int:
    from .release.commands import COMMANDS as RELEASE_COMMANDS

    return RELEASE_COMMANDS[args.command](args)


COMMANDS = {"build": _cmd_build, "store": _cmd_store, "convert": _cmd_convert,
            "inspect": _cmd_inspect, "scenario": _cmd_scenario, "check": _cmd_check,
            "bundle": _cmd_bundle, "schema": _cmd_schema, "resolve": _cmd_resolve,
            "run": _cmd_load, "prepare": _cmd_load,
            "push": lambda args: _registry("run_push", args),
            "pull": lambda args: _registry("run_pull", args),
            "assemble": lambda args: _registry("run_assemble", args),
            "verify": _release, "release": _release, "unpack": _release, "diff": _release,
            "report": _report_command, "key": _key_command}


def run() -> NoReturn:
    """The ``weightstore`` process (its console script and ``python -m weightstore``):
    :func:`main`, then exit with its code.

    The collector's objects are frozen (:func:`gc.freeze`) before the interpreter shuts
    down: its last collections would walk every object the imports made, which the
    process's end frees anyway, about 20 ms of a small pull. Objects left in reference
    cycles are then not finalized at exit: every file a command writes is closed (and
    synced) by its own ``with`` before :func:`main` returns. Only the process does this:
    a caller of :func:`main` keeps collecting as before."""
    import gc

    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parse(argv)
    except _UsageError as exc:
        return _report(exc, argparse.Namespace(json="--json" in argv, verbose=False))
    quiet = args.quiet and not getattr(args, "json", False)
    try:
        with contextlib.ExitStack() as stack:
            if quiet:
                sink = stack.enter_context(open(os.devnull, "w"))
                stack.enter_context(contextlib.redirect_stdout(sink))
            if not args.verbose:
                stack.enter_context(_warnings_in_one_line())
            return COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        print("weightstore: interrupted", file=sys.stderr)
        return 130
    except (WeightstoreError, ValueError, OSError) as exc:
        return _report(exc, args)


@contextlib.contextmanager
def _warnings_in_one_line() -> Iterator[None]:
    """A library's Python warning (filelock falling back to its soft lock on a file system
    without ``flock``, a deprecation) is one stderr line like every other message,
    ``weightstore: warning: <text>``, instead of Python's source path and line of code
    (``-v`` keeps those)."""
    import warnings

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        print(f"weightstore: warning: {_one_line(str(message))}", file=sys.stderr,
              flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _report(exc: Exception, args: argparse.Namespace) -> int:
    """One line on stderr (``--json``: one JSON object, still on stderr); exit code 2."""
    if isinstance(exc, WeightstoreError):
        message, context = exc.message, dict(exc.context)
    elif isinstance(exc, OSError) and not isinstance(exc, WeightstoreError):
        message = exc.strerror or str(exc)
        context = {"path": exc.filename} if exc.filename else {}
    else:  # argument values the parser cannot judge (e.g. alignment)
        message, context = str(exc), {}
    if args.verbose:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "context": context}, default=str,
                         sort_keys=True), file=sys.stderr)
    elif isinstance(exc, OSError) and not isinstance(exc, WeightstoreError):
        where = f": {exc.filename}" if exc.filename else ""
        print(f"weightstore: error: {_one_line(f'{message}{where}')}", file=sys.stderr)
    else:
        print(f"weightstore: error: {_one_line(str(exc))}", file=sys.stderr)
    return EXIT_ERROR


def _one_line(text: str) -> str:
    """``text`` with every character a terminal would act on or that is no text escaped:
    newlines (a runtime's message of several lines), control characters (``ESC[31m``),
    line and paragraph separators, formatting marks, and the bytes of an argument that is
    not UTF-8 (``\\xff``). What an error quotes stays on its one line, as it was given."""
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
