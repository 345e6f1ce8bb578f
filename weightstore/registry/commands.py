"""``weightstore push``, ``pull`` and ``assemble``: parsers and handlers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the HTTP client loads only when push or pull runs: every command parses here
    from .client import Transport

STORE_HELP = "store folder (beats $WEIGHTSTORE_DIR and the user cache folder)"


MAX_TIMEOUT = 86400.0  # a day: a finite wait a socket and a clock can hold


def _seconds(text: str) -> float:
    """``--timeout``: a number of seconds, more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None
    if not 0 < value <= MAX_TIMEOUT:  # nan and inf fail too
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT:g}")
    return value


def _transport_flags(p: argparse.ArgumentParser, jobs: Any) -> None:
    p.add_argument("--store", help=STORE_HELP)
    p.add_argument("--jobs", type=jobs, default=4, help="blobs in flight (default 4)")
    p.add_argument("--insecure", action="store_true",
                   help="plain HTTP, to any registry (TLS otherwise; a loopback registry "
                        "that speaks only plain HTTP is found without it)")
    p.add_argument("--timeout", type=_seconds, default=120.0,
                   help="seconds to wait for a registry answer, and the window over which "
                        "an answer's body must average 1 KiB/s (default 120)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--username", help="registry user; the password is read from stdin "
                                      "(--password-stdin). Beats every other source of "
                                      "credentials (docs/how-to/registry-auth-and-tls.md)")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password (or token) for --username from stdin")


def add_parsers(sub: Any, jobs: Any, chunk: Any) -> None:
    """Register push, pull and assemble (``jobs``: the CLI's type for --jobs, ``chunk``:
    its type for --chunk-size)."""
    ps = sub.add_parser("push", help="push a package folder to an OCI registry (CNCF "
                                     "ModelPack shape, one layer per weight)")
    ps.add_argument("package", help="a package folder (holding summary.json)")
    ps.add_argument("reference", help="host[:port]/repository[:tag]")
    ps.add_argument("--mount-from", action="append", default=[], metavar="REPOSITORY",
                    help="another repository of the same registry to mount blobs from")
    ps.add_argument("--chunk-size", type=chunk, default=None, metavar="BYTES",
                    help="blobs larger than this are sent in chunks of this size, each "
                         "recorded so a killed push resumes (default 64 MiB)")
    _transport_flags(ps, jobs)
    pl = sub.add_parser("pull", help="pull a package (or one device's or scenario's "
                                     "live weights) from an OCI registry")
    pl.add_argument("reference", help="host[:port]/repository[:tag|@sha256:...]")
    pl.add_argument("output", nargs="?", help="folder to write (default: the repository's "
                                             "last name component)")
    which = pl.add_mutually_exclusive_group()
    which.add_argument("--device", help="fetch only what this device runs")
    which.add_argument("--scenario", help="fetch only what this scenario runs")
    pl.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    _transport_flags(pl, jobs)
    am = sub.add_parser("assemble", help="make the package, offline, from the folder a "
                                         "generic ModelPack or ORAS client pulled")
    am.add_argument("folder", help="the pulled folder (models, summary.json, per-weight "
                                   "files, payloads/)")
    am.add_argument("--output", help="write the package here (a new or empty folder); "
                                     "default: replace the folder in place")
    am.add_argument("--jobs", type=jobs, default=4, help="parallel payload checks and copies")
    am.add_argument("--json", action="store_true", help="print the report as JSON")


def _store(args: argparse.Namespace) -> Any:
    from ..store import WeightStore, resolve_store_path

    return WeightStore(resolve_store_path(args.store, None))


def _transport(args: argparse.Namespace) -> Transport:
    chunk = getattr(args, "chunk_size", None)
    if args.jobs < 1 or args.timeout <= 0 or (chunk is not None and chunk < 1):
        raise ValueError("--jobs and --chunk-size must be at least 1 and --timeout positive")
    from .client import Transport

    transport = Transport(insecure=args.insecure, read_timeout=args.timeout)
    return transport if chunk is None else replace(transport, chunk_size=chunk)


def _credentials(args: argparse.Namespace) -> Any:
    """The ``--username`` / ``--password-stdin`` credentials, or None."""
    if args.username is None and not args.password_stdin:
        return None
    if args.username is None or not args.password_stdin:
        raise ValueError("--username and --password-stdin go together (a password is "
                         "never taken on the command line)")
    if not args.username or ":" in args.username:
        raise ValueError("--username must be a non-empty name without ':'")
    from .auth import Credentials

    password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not password:
        raise ValueError("--password-stdin read no password from stdin")
    return Credentials(args.username, password)


def run_push(args: argparse.Namespace) -> int:
    from ..packaging.proof import proving_store
    from ..progress import requested
    from ..store import WeightStore
    from .push import push

    report = push(args.package, args.reference, store=WeightStore(proving_store(args.store)),
                  transport=_transport(args),
                  jobs=args.jobs, mount_from=args.mount_from, progress=requested(args),
                  credentials=_credentials(args))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"pushed {report.reference}@{report.manifest_digest}: {report.blobs} blobs, "
              f"{report.uploaded} uploaded ({report.uploaded_bytes / 1e6:.1f} MB), "
              f"{report.present} already there, {report.mounted} mounted"
              + (f", {report.resumed} resumed ({report.resumed_bytes / 1e6:.1f} MB "
                 f"already sent)" if report.resumed else ""))
    return 0


def run_pull(args: argparse.Namespace) -> int:
    from ..progress import requested
    from .pull import pull

    report = pull(args.reference, args.output, store=_store(args), transport=_transport(args),
                  jobs=args.jobs, device=args.device, scenario=args.scenario,
                  force=args.force, progress=requested(args),
                  credentials=_credentials(args))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"pulled {report.reference} into {os.fspath(report.output)}: "
              f"{report.payloads} weights ({report.payload_bytes / 1e6:.1f} MB), "
              f"{report.fetched} fetched ({report.fetched_bytes / 1e6:.1f} MB), "
              f"{report.payloads - report.fetched} from the store")
    return 0


def run_assemble(args: argparse.Namespace) -> int:
    from .assemble import assemble_folder

    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    report = assemble_folder(args.folder, args.output, jobs=args.jobs)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"assembled {report.source} into {report.output}: {report.files} files, "
              f"{report.weight_files} weight files from {report.payloads} payloads "
              f"({report.payload_bytes / 1e6:.1f} MB), each checked against its key")
    return 0
