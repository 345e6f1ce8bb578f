"""``weightstore report``: argument parsing and writing only."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    r = sub.add_parser("report", help="a self-contained HTML report of a package: where "
                                      "the bytes go, what dedup saved, what each device "
                                      "needs")
    r.add_argument("target", nargs="?", metavar="TARGET",
                   help="a package folder or a release archive (.tar.zst)")
    r.add_argument("--output", metavar="FILE",
                   help="write the HTML page here (without it: a short text summary)")
    r.add_argument("--json", action="store_true",
                   help="print the data behind the page as JSON")
    r.add_argument("--against", metavar="OLD",
                   help="an older package folder or archive to compare with (diff view)")
    r.add_argument("--store", help="a store folder (store view, store references)")


def run(args: argparse.Namespace) -> int:
    import os

    from ..errors import ReportError
    from .api import report
    from .data import render_json

    if args.target is None and args.store is None:
        raise ReportError("a report needs a TARGET (a package folder or a release archive) "
                          "or --store")
    data = report(args.target, args.output, against=args.against, store=args.store)
    if args.output is not None and not args.json:
        print(f"wrote {args.output} ({os.path.getsize(args.output):,} bytes)")
    if args.json:
        sys.stdout.write(render_json(data))
    elif args.output is None:
        from .text import render_text

        sys.stdout.write(render_text(data))
    return 0
