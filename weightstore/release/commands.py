"""``weightstore verify|release|unpack|diff``: argument parsing and rendering only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..io.workers import add_jobs_option

EXIT_OK, EXIT_FAILED = 0, 1


def add_parsers(sub: Any, jobs: Any, integer: Any) -> None:
    """Register the release commands on the CLI's subparsers (``jobs``: its --jobs type,
    ``integer``: its type for other integer options)."""
    v = sub.add_parser("verify", help="re-hash every file of a package against its summary")
    v.add_argument("package", help="a package folder (holding summary.json)")
    v.add_argument("--store", help="store whose record of the build the folder must match "
                                   "(default: $WEIGHTSTORE_DIR or the user cache folder)")
    add_jobs_option(v, jobs, "worker threads for hashing")
    v.add_argument("--json", action="store_true", help="print JSON")

    r = sub.add_parser("release", help="write reproducible .tar.zst archives, SHA256SUMS and "
                                       "release.json (SLSA provenance)")
    r.add_argument("target", metavar="RECIPE|PACKAGE|DIR",
                   help="a recipe (built first) or a package folder / version folder; with "
                        "--verify, a release folder")
    r.add_argument("--output", help="release folder (default: <output>/releases/"
                                    "<package>-<version> for recipes)")
    r.add_argument("--store", help="store folder for the build; for a package folder, the "
                                   "store whose record of the build it must match")
    add_jobs_option(r, jobs, "zstd workers; the archive's bytes do not depend on it")
    r.add_argument("--level", type=integer, default=None,
                   help="zstd level, 1 to 19 (default 3)")
    r.add_argument("--long", action="store_true",
                   help="zstd long-distance matching (128 MiB window)")
    r.add_argument("--report", action="store_true",
                   help="also write each layout's HTML report (weightstore report) beside "
                        "its archive, listed in SHA256SUMS and release.json (needs "
                        "weightstore[report])")
    r.add_argument("--check", action="store_true",
                   help="rebuild from scratch in a temp folder with a fresh store and compare "
                        "byte for byte with the release in --output; exit 1 on a difference")
    r.add_argument("--sign", nargs="?", const="", metavar="KEY",
                   help="also write release.intoto.jsonl: release.json in a DSSE envelope "
                        "signed with this Ed25519 private key file (without KEY: "
                        "$WEIGHTSTORE_SIGNING_KEY or $WEIGHTSTORE_SIGNING_KEY_B64)")
    r.add_argument("--force", action="store_true",
                   help="replace a release of another date (another SOURCE_DATE_EPOCH) in "
                        "the output folder")
    r.add_argument("--verify", action="store_true",
                   help="check the signed provenance of the release folder DIR: the "
                        "signature, every archive's SHA-256 and SHA256SUMS; exit 1 when "
                        "anything does not match")
    r.add_argument("--key", action="append", default=[], metavar="PUB",
                   help="with --verify: a public key (ed25519:<hex>) or a file holding "
                        "one (repeatable; default: the trusted keys)")
    r.add_argument("--json", action="store_true", help="print JSON")

    u = sub.add_parser("unpack", help="extract a release archive into a new, verified folder")
    u.add_argument("archive")
    u.add_argument("folder", metavar="DIR", help="created; must not exist")
    u.add_argument("--json", action="store_true", help="print JSON")

    d = sub.add_parser("diff", help="compare two packages (folders or archives), each "
                                    "verified against its summary first")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--no-verify", dest="verify", action="store_false",
                   help="hash no file: compare what the summaries claim (kinds, paths, "
                        "sizes and the archives' structure are still checked)")
    add_jobs_option(d, jobs, "worker threads for hashing a folder")
    d.add_argument("--json", action="store_true", help="print JSON")


def _failures(args: argparse.Namespace) -> Any:
    """Where the reasons of a failure go: stdout with the report, stderr under ``-q``."""
    return sys.stderr if getattr(args, "quiet", False) else sys.stdout


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def run_verify(args: argparse.Namespace) -> int:
    from ..packaging.inventory import verify_package
    from ..packaging.proof import PROVEN_BUILD, proving_store
    from ..progress import requested

    store = proving_store(args.store)
    report = verify_package(args.package, jobs=args.jobs, progress=requested(args),
                            store=store)
    if args.json:
        _print_json(report.to_dict())
    else:
        for problem in report.problems:  # -q: still shown, as errors are
            print(f"problem: {problem}", file=_failures(args))
        state = f"{len(report.problems)} problem(s)"
        if report.ok:
            state = ("ok, the build the store recorded" if report.proven == PROVEN_BUILD
                     else "ok, internal consistency only (the store does not know this "
                          "build: pass the --store that built it to prove it is the build)")
        unproven = [p for p in report.prepared if p["proven"] is None]
        for p in unproven:  # run does not use them: it loads the portable weights
            print(f"unproven: {p['record']}: {p['detail']}; run does not use it")
        if unproven:
            state += f"; {len(unproven)} prepared record(s) unproven"
        print(f"verified {report.files} files ({report.bytes_hashed / 1e6:.1f} MB): {state}")
    return EXIT_OK if report.ok else EXIT_FAILED


def run_release(args: argparse.Namespace) -> int:
    from ..progress import requested
    from .api import ReleaseOptions, check_release, release
    from .compression import DEFAULT_LEVEL, Compression

    if args.verify:
        return _verify_release(args)
    signer = None
    if args.sign is not None:  # before anything is built: a key that cannot sign fails now
        from ..signing.keys import load_private

        signer = load_private(args.sign or None)

    if args.output and not args.check:  # before anything is built, as build checks its own
        from ..io.files import check_output_folder

        check_output_folder(Path(args.output))
    options = ReleaseOptions(
        output=args.output, store=args.store, jobs=args.jobs,
        compression=Compression(args.level or DEFAULT_LEVEL, long_distance=args.long),
        progress=requested(args), report=args.report, signer=signer,
        force=args.force)
    if args.report and not args.check:  # before anything is built: the drawing library
        from ..report.treemap import squarify_module

        squarify_module()
    if args.check:
        result = check_release(args.target, options)
        if args.json:
            _print_json(result.to_dict())
        elif result.ok:
            print(f"reproducible: {len(result.compared)} files in {result.output} are "
                  "identical to a rebuild from scratch")
        else:
            print(f"not reproducible: {result.difference}", file=_failures(args))
        return EXIT_OK if result.ok else EXIT_FAILED
    out = release(args.target, options)
    if args.json:
        _print_json(out.to_dict())
        return EXIT_OK
    for a in out.archives:
        print(f"{a.sha256}  {out.output / a.file_name} ({a.size / 1e6:.1f} MB)")
    for r in out.reports:
        print(f"{r.sha256}  {out.output / r.file_name}")
    print(f"wrote {out.output / 'SHA256SUMS'} and {out.output / 'release.json'}")
    if out.signed_by:
        print(f"signed {out.output / 'release.intoto.jsonl'} with {out.signed_by}")
    return EXIT_OK


def _verify_release(args: argparse.Namespace) -> int:
    from ..errors import SignatureError
    from ..signing.keys import parse_public, trusted_keys
    from .attestation import verify_release

    keys = [parse_public(k) for k in args.key] if args.key else trusted_keys()
    if not keys:
        raise SignatureError("no key to verify with: pass --key or trust one "
                             "(trusted-keys, $WEIGHTSTORE_TRUSTED_KEYS)")
    try:
        result = verify_release(args.target, keys)
    except SignatureError as exc:  # the release is not what a trusted key signed
        if args.json:
            _print_json({"folder": args.target, "ok": False, "error": str(exc)})
        else:
            print(f"not verified: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(result.to_dict())
    else:
        for problem in result.problems:
            print(f"problem: {problem}", file=_failures(args))
        if result.ok:
            print(f"verified: {len(result.subjects)} file(s) in {result.folder} are the "
                  f"ones release.json names, signed by {result.key}")
    return EXIT_OK if result.ok else EXIT_FAILED


def run_unpack(args: argparse.Namespace) -> int:
    from ..packaging.unpack import unpack

    result = unpack(args.archive, args.folder)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(f"unpacked {result.files} verified files ({result.bytes / 1e6:.1f} MB) into "
              f"{result.folder}")
    return EXIT_OK


def run_diff(args: argparse.Namespace) -> int:
    from ..packaging.diff import diff_packages, open_view

    result = diff_packages(*(open_view(p, verify=args.verify, jobs=args.jobs)
                             for p in (args.a, args.b)))
    if args.json:
        _print_json(result.to_dict())
    else:
        if not result.verified:
            print("not verified (--no-verify): no file was hashed; the summaries' digests "
                  "were taken at their word")
        for change in result.changes:
            print(change)
        print(f"fetch to go from A to B: {result.fetch_file_bytes} bytes by file, "
              f"{result.fetch_payload_bytes} bytes by payload")
        for name, size in sorted(result.device_fetch_bytes.items()):
            print(f"  device {name}: {size} bytes")
        if result.identical:
            print("identical")
    return EXIT_OK if result.identical else EXIT_FAILED


COMMANDS = {"verify": run_verify, "release": run_release, "unpack": run_unpack,
            "diff": run_diff}
