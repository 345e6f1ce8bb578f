"""The measurement harness shared by the benchmark scripts in this folder.

Each measured command runs in a fresh subprocess, timed around the process, with its peak
RSS taken from ``os.wait4``. The scripts are run as ``python bench/<name>.py``, which puts
this folder first on the import path, so they reach this module as ``import harness``.

On Linux a child's ``ru_maxrss`` starts from the peak RSS of the process that spawned it, so
the parent must stay small: this module imports nothing heavy, and ``rss_floor`` gives the
lowest peak any child can report.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000
RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KiB on Linux, bytes on macOS

T = TypeVar("T")


class BenchError(Exception):
    """A measured command failed or did not do what its variant expects."""


def child_env(workdir: Path, checkout: Path = REPO) -> dict[str, str]:
    """The environment for children: this checkout (or ``checkout``, another one) first on
    the import path, and a bytecode cache in the workdir, so that no run recompiles its
    modules (as an installed package would not) even where ``PYTHONDONTWRITEBYTECODE`` is
    set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    return env


@dataclass
class Process:
    """One finished child process."""

    seconds: float  # wall time around the whole process
    peak_rss: int  # bytes
    output: str  # stdout (and stderr too, where they were merged)
    killed: bool = False  # ran past its timeout
    cpu_seconds: float = 0.0  # user + system time of the child, less sensitive to load


def run_process(argv: list[str], workdir: Path, log_name: str, timeout: float | None = None,
                *, merge_stderr: bool = False, checkout: Path = REPO,
                cwd: Path | None = None, env: dict[str, str] | None = None) -> Process:
    """Run ``argv`` in a fresh process; its output, wall time and peak RSS.

    Stderr goes to ``<log_name>.log`` in the workdir and is quoted when the process fails;
    with ``merge_stderr`` stdout goes there as well and the output is both. A process still
    running after ``timeout`` seconds is killed and returned with ``killed`` set; any other
    non-zero exit raises ``BenchError``. ``checkout``: the weightstore the child imports
    (another checkout of the project, to compare with an earlier version; give a ``cwd``
    outside this checkout then, since Python puts the current folder first on the path).
    ``env``: variables set for the child besides the usual ones.
    """
    log_path = workdir / f"{log_name}.log"
    with open(log_path, "w+b") as err, tempfile.TemporaryFile(dir=workdir) as out:
        sink = err if merge_stderr else out
        expired = threading.Event()
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=sink, stderr=err,
                                env={**child_env(workdir, checkout), **(env or {})}, cwd=cwd,
                                stdin=subprocess.DEVNULL)

        def kill() -> None:
            expired.set()
            proc.kill()

        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, kill)
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer is not None:
                timer.cancel()
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        sink.seek(0)
        text = sink.read().decode("utf-8", "replace")
        errors = ""
        if not merge_stderr:
            err.seek(0)
            errors = err.read().decode("utf-8", "replace")
    killed = expired.is_set() and proc.returncode < 0
    if proc.returncode != 0 and not killed:
        raise BenchError(f"{' '.join(argv)} exited with {proc.returncode}:\n{text}{errors}")
    return Process(seconds, usage.ru_maxrss * RSS_UNIT, text, killed,
                   usage.ru_utime + usage.ru_stime)


def rss_floor() -> int:
    """This process's peak RSS: the lowest peak any child can report."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT


@dataclass(frozen=True)
class Target:
    """A figure and its target: an upper bound, or None where it is shown for scale only."""

    name: str
    value: float
    target: float | None
    digits: int = 2  # decimals shown

    @property
    def passed(self) -> bool | None:
        """Whether the value is within the target; None where there is none."""
        return None if self.target is None else self.value <= self.target

    def as_json(self) -> dict[str, Any]:
        """The figure as JSON: name, value, target and whether it passed."""
        return {"name": self.name, "value": self.value, "target": self.target,
                "pass": self.passed}


def target_table(found: list[Target], heading: str, name_width: int,
                 value_width: int) -> list[str]:
    """The lines of a table of figures against their targets, PASS or MISS, followed by a
    MISS line for each target missed, saying by how much."""
    lines = [f"{heading:<{name_width}}{'value':>{value_width}}{'target':>10}  result"]
    for t in found:
        target = "(scale)" if t.target is None else f"<= {t.target:g}"
        verdict = "" if t.passed is None else "PASS" if t.passed else "MISS"
        lines.append(f"{t.name:<{name_width}}{t.value:>{value_width}.{t.digits}f}{target:>10}"
                     f"  {verdict}".rstrip())
    misses = [t for t in found if t.passed is False]
    if misses:
        lines.append("")
        for t in misses:
            assert t.target is not None
            over = (f"{(t.value / t.target - 1) * 100:.0f}% over" if t.target
                    else "any is over")  # a count that must be zero
            lines.append(f"MISS: {t.name} = {t.value:.{t.digits}f}, target <= {t.target:g} "
                         f"({over})")
    return lines


def print_figures(as_json: bool, summary: dict[str, Any], targets: list[Target],
                  text: Callable[[], str], **extra: Any) -> None:
    """Print a benchmark's figures: as JSON (summary, targets and ``extra``), or its text
    report."""
    if as_json:
        print(json.dumps({"summary": summary, "targets": [t.as_json() for t in targets],
                          **extra}, indent=2))
    else:
        print(text())


def median_lines(runs: int, median: dict[str, float], median_cpu: dict[str, float],
                 ) -> list[str]:
    """A report's lines of the median wall and CPU seconds of each measured process."""
    return [f"medians of {runs} rounds (s): " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(median.items())),
            "CPU (user + system, s): " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(median_cpu.items()))]


def log(message: str) -> None:
    """A progress line on stderr, so that stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


def add_common_arguments(parser: argparse.ArgumentParser, holds: str) -> None:
    """Add ``--workdir``, ``--keep`` and ``--json``; ``holds`` says what the workdir holds."""
    parser.add_argument("--workdir", type=Path,
                        help=f"folder for {holds}; kept, and the models are reused by later "
                             "runs (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument("--json", action="store_true", help="print all figures as JSON")


def in_workdir(workdir: Path | None, keep: bool, work: Callable[[Path], T]) -> T | None:
    """Call ``work`` with the (resolved, created) workdir; by default a temp folder, removed
    afterwards unless ``keep``. A ``BenchError`` is printed and gives None."""
    temp = workdir is None
    folder = (Path(tempfile.mkdtemp(prefix="weightstore-bench-")) if workdir is None
              else workdir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return work(folder)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return None
    finally:
        if temp and not keep:
            shutil.rmtree(folder, ignore_errors=True)
        elif temp:
            log(f"kept {folder}")


def measure(args: argparse.Namespace, run: Callable[[Path], dict[str, Any]],
            figures: Callable[[dict[str, Any]], tuple[dict[str, Any], list[Target]]],
            report: Callable[[dict[str, Any], dict[str, Any], list[Target]], str]) -> int:
    """A benchmark's whole course: ``run`` in the workdir (``--workdir``/``--keep``),
    its ``figures``, printed as JSON (``--json``) or as its ``report``. Exit code 0."""

    def work(workdir: Path) -> int:
        data = run(workdir)
        summary, targets = figures(data)
        print_figures(args.json, summary, targets, lambda: report(data, summary, targets))
        return 0

    in_workdir(args.workdir, args.keep, work)
    return 0
