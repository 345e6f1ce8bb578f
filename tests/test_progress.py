"""Progress bars: rate and ETA on a terminal for every long command, silence elsewhere.

Each command runs as a real process: once with its output on a pseudo-terminal (the bar
must be drawn, with its rate and ETA), once on pipes (nothing on stderr: CI logs stay
clean), and once on a terminal under ``-q`` (nothing but what was asked for).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from weightstore.builder.run import BuildOptions, build

from .helpers import empty_store
from .registry_server import BINARY, running_registry
from .samples import make_encoder

# tqdm's tail: "[elapsed<remaining, rate]", e.g. "[00:00<00:00, 41.3MB/s]"
BAR = re.compile(r"\d+%\|.*\| *[\d.]+[kMG]?/[\d.]+[kMG]?B? \[\d\d:\d\d<\d\d:\d\d, *"
                 r"(?:[\d.]+|\?)[kMG]?B/s\]")

RECIPE = """\
package: pg
version: "1"
store: {{path: {store}}}
models:
  - {{name: encoder, source: {src}}}
layouts:
  - {{name: c, external_weight: combined}}
devices:
  - {{name: d}}
output: {out}
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # CI silences bars
    env["COLUMNS"] = "120"
    return env


def on_terminal(argv: list[str]) -> tuple[int, str]:
    """Run ``weightstore argv`` with stdout and stderr on a pseudo-terminal; its exit code
    and everything it drew there."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "weightstore", *argv],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=_env())
    os.close(slave)
    out = bytearray()
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    return proc.wait(timeout=300), out.decode(errors="replace")


def on_pipes(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightstore", *argv], env=_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("progress")
    src = folder / "encoder.onnx"
    onnx.save(make_encoder(), str(src))
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(store=folder / "store", src=src, out=folder / "out"))
    package = build(recipe, BuildOptions(jobs=2)).packages[0].path
    registry = None
    with running_registry(folder / "registry") if BINARY else _nothing() as server:
        registry = server
        if registry is not None:  # something to pull
            assert on_pipes(["push", str(package), f"{registry.host}/pg/enc:pulled",
                             "--store", str(folder / "store")]).returncode == 0
        yield {"folder": folder, "src": src, "recipe": recipe, "package": package,
               "store": folder / "store", "registry": registry, "runs": itertools.count()}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def _out(p: dict, name: str) -> Path:
    return p["folder"] / f"{name}-{next(p['runs'])}"


# command -> argv from the project; every run writes to a new place
COMMANDS: dict[str, Callable[[dict], list[str]]] = {
    "build": lambda p: ["build", str(p["recipe"]), "--force", "--store",
                        str(_out(p, "store"))],
    "store verify": lambda p: ["store", "verify", "--store", str(p["store"])],
    "verify": lambda p: ["verify", str(p["package"])],
    "check --verify": lambda p: ["check", str(p["package"]), "--verify"],
    "convert": lambda p: ["convert", "to-external", str(p["src"]),
                          str(_out(p, "converted") / "m.onnx")],
    "convert to-inline": lambda p: ["convert", "to-inline", str(p["package"] / "encoder.onnx"),
                                    str(_out(p, "inlined") / "m.onnx")],
    "bundle": lambda p: ["bundle", str(p["package"]), "d", "--output", str(_out(p, "bundle"))],
    "release": lambda p: ["release", str(p["package"]), "--output", str(_out(p, "release"))],
    "push": lambda p: ["push", str(p["package"]),
                       f"{p['registry'].host}/pg/enc:{next(p['runs'])}",
                       "--store", str(empty_store(_out(p, "push-store")))],
    "pull": lambda p: ["pull", f"{p['registry'].host}/pg/enc:pulled",
                       str(_out(p, "pulled")), "--store", str(_out(p, "pull-store"))],
}


def _argv(project: dict, command: str) -> list[str]:
    if command in ("push", "pull") and project["registry"] is None:
        pytest.skip("docker-registry is not installed")
    argv = COMMANDS[command](project)
    if command.startswith("convert"):
        Path(argv[-1]).parent.mkdir()
    return argv


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_terminal_shows_a_bar_with_rate_and_eta(project, command):
    code, shown = on_terminal(_argv(project, command))
    assert code == 0, shown
    assert BAR.search(shown), shown


@pytest.mark.parametrize("command", list(COMMANDS))
def test_pipes_get_no_bar(project, command):
    result = on_pipes(_argv(project, command))
    assert result.returncode == 0, result.stderr
    assert _without_unproven(result.stderr) == ""
    assert "B/s" not in result.stdout


def test_a_warm_build_draws_only_whole_bars(project):
    """Every key cached (the project's store was filled by the same source): nothing is
    hashed, so no hashing bar stays on screen at 0 % of nothing, and the storing bar counts
    to its total, with percentage and ETA."""
    argv = ["build", str(project["recipe"]), "--force"]
    assert on_pipes(argv).returncode == 0  # the keys are cached now, whatever ran before
    code, shown = on_terminal(argv)
    assert code == 0, shown
    bars = [line for line in re.split(r"[\r\n]+", shown) if "B/s" in line]
    assert bars and all(re.search(r"\d+%\|", line) for line in bars), shown
    assert BAR.search(bars[-1]) and "100%" in bars[-1], shown
    assert "hashing" not in shown and "/1.00 " not in shown, shown


@pytest.mark.parametrize("command", ["store verify", "check --verify", "bundle", "release",
                                     "pull"])
def test_quiet_terminal_gets_no_bar(project, command):
    code, shown = on_terminal(["-q", *_argv(project, command)])
    assert code == 0, shown
    assert _without_unproven(shown) == ""


def _without_unproven(text: str) -> str:
    """Without the line release of a package folder and push print when the store does
    not know the build (the module's build signed its records under another test's key)."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if "proven only internally consistent" not in line)
