"""The number of worker threads a command uses unless told: one per CPU, at most eight."""

from __future__ import annotations

import os
from typing import Any

# how default_jobs() chooses, in words: what the command reference shows as the default of
# every --jobs, so that it reads the same on every machine
DEFAULT_JOBS_RULE = "one per CPU, at most 8"


def default_jobs() -> int:
    """``--jobs``' default: one worker per CPU, at most eight (four where the CPUs are
    unknown)."""
    return min(8, os.cpu_count() or 4)


def add_jobs_option(parser: Any, kind: Any, help: str) -> None:
    """``--jobs`` on an argparse parser, defaulting to :func:`default_jobs` (``kind``: the
    command line's type for it); the option records its rule as ``default_rule``."""
    action = parser.add_argument("--jobs", type=kind, default=default_jobs(), help=help)
    action.default_rule = DEFAULT_JOBS_RULE
