"""``weightstore key``: generate a signing key, or print the public half of one."""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OK = 0


def add_parsers(sub: Any) -> None:
    k = sub.add_parser("key", help="Ed25519 signing keys (release provenance)")
    ksub = k.add_subparsers(dest="key_command", required=True, metavar="ACTION")
    g = ksub.add_parser("generate", help="write a new private key (0600) and print its "
                                         "public key")
    g.add_argument("path", help="the private key file to create (refused if it exists)")
    p = ksub.add_parser("public", help="print the public key of a private key")
    p.add_argument("path", nargs="?", help="the private key file (default: "
                                           "$WEIGHTSTORE_SIGNING_KEY or "
                                           "$WEIGHTSTORE_SIGNING_KEY_B64)")


def run(args: argparse.Namespace) -> int:
    from .keys import generate, load_private

    if args.key_command == "generate":
        public = generate(args.path)
    else:
        public = load_private(args.path).public
    print(public.text)
    return EXIT_OK
