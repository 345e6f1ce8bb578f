"""Run the examples of a Markdown page: the runner behind tests/test_doc_examples.py.

Which blocks run
    Every fenced block whose info string is ``sh``, ``bash``, ``console`` or ``python``
    (```` ``` ```` or ``~~~`` fences, indented ones inside list items too). Other info
    strings (``yaml``, ``text``, ``json``, none) are never run. A block with
    ``<!-- not-run: reason -->`` on the line right before its opening fence is skipped;
    the reason must not be empty, and a marker that is not followed by a fence is an error.

Where they run
    Each page gets its own temp folder, and its blocks run there in page order. The folder
    is like a fresh clone: the repository's ``recipes/`` and ``examples/`` copied in, as a
    git repository with one commit (so ``git log -1 --format=%ct`` answers). ``HOME`` is a
    fresh empty folder and the XDG, Docker and weightstore variables of the caller are
    removed, so ``~/.config/weightstore`` and ``~/.docker`` do not exist until a block
    makes them. ``weightstore``, ``python`` and ``python3`` on ``PATH`` run the tree under
    test with the current interpreter. ``SOURCE_DATE_EPOCH`` is unset: a block that means
    a release date sets it.

Shell blocks (sh, bash)
    Each runs as one ``bash -e -o pipefail`` script: every command must succeed. ``cd``
    and *exported* variables carry over to the page's later blocks (plain assignments do
    not). A failure names the page, the line of the failing command and its stderr.

Console blocks
    Lines starting with ``$ `` are commands (a line ending in ``\\`` continues on the next
    line); the lines after a command, up to the next one, are its output as shown. Each
    command runs as a shell block of its own and must succeed. Its output is checked
    loosely: every shown line must occur in the output (stdout and stderr together, the
    page's folder written as a relative path and ``HOME`` as ``~``), in order, with other
    lines in between allowed; runs of white space compare equal; ``...`` or ``…`` matches
    anything within a line (sizes, timings, digests), and a line that is only ``...`` or
    ``…`` is skipped. To show a command that fails, write ``cmd || echo "exit $?"``.

Python blocks
    A page's Python blocks run in one interpreter, in order, sharing their variables (as in
    a session: a later block uses what an earlier one made), each in the shell's current
    folder with its exported variables.

Registry
    A page whose blocks that run mention ``$REGISTRY`` (or ``${REGISTRY}``) gets a real
    registry (``docker-registry``, tests/registry_server.py) on 127.0.0.1, plain HTTP and
    no auth, for the whole page, with ``REGISTRY=127.0.0.1:<port>`` exported: the docs
    write ``$REGISTRY/team/tiny-bert:1.0.0``. Such a page is skipped only when the
    registry binary is absent.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_LANGUAGES = {"sh": "shell", "bash": "shell", "console": "console", "python": "python"}
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
REGISTRY_USE = re.compile(r"\$\{?REGISTRY\b")
BLOCK_TIMEOUT = 300  # seconds for one block; the whole run is budgeted at about two minutes
# the caller's settings that would make a fresh home not fresh
DROPPED = ("SOURCE_DATE_EPOCH", "DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "CONTAINERS_CONF",
           "CONTAINERS_REGISTRIES_CONF", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PYTHONSTARTUP")
DROPPED_PREFIXES = ("WEIGHTSTORE_", "XDG_")


class ExampleError(AssertionError):
    """A block failed or a page's markers are wrong: the message names page and line."""


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    language: str  # "shell", "console" or "python"
    text: str
    not_run: str | None = None  # the reason, when marked


@dataclass
class Page:
    path: Path
    name: str
    blocks: list[Block] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # wrong markers


def parse_page(path: Path, name: str | None = None) -> Page:
    """The page's runnable blocks, in order, and the errors of its not-run markers."""
    name = name or str(path.relative_to(REPO))
    page = Page(path, name)
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        marker = NOT_RUN.match(lines[i])
        if marker and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
            page.errors.append(f"{name}:{i + 1}: a not-run marker must be on the line "
                               "right before a block's opening fence")
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        info = m["info"].strip().split(None, 1)
        language = info[0].lower() if info else ""
        body = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (closing and closing["fence"][0] == fence[0]
                    and len(closing["fence"]) >= len(fence) and not closing["info"].strip()):
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent)
                        else lines[j].lstrip())
            j += 1
        if language in RUN_LANGUAGES:
            reason = None
            before = NOT_RUN.match(lines[i - 1]) if i else None
            if before:
                reason = before[1].strip()
                if not reason:
                    page.errors.append(f"{name}:{i}: a not-run marker needs a reason")
            page.blocks.append(Block(name, i + 1, RUN_LANGUAGES[language],
                                     "\n".join(body) + "\n", reason))
        i = j + 1
    return page


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


# the page's Python interpreter: runs each block it is sent in one namespace, with the
# block's output in a file of its own, and answers true or false on its first stdout
SESSION = """
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
saved = os.dup(1), os.dup(2)
namespace = {"__name__": "__main__"}
for request in sys.stdin:
    request = json.loads(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    ok = True
    try:
        with open(request["file"]) as f:
            exec(compile(f.read(), request["file"], "exec"), namespace)
    except SystemExit as exc:
        ok = exc.code in (None, 0)
    except BaseException:
        traceback.print_exc()
        ok = False
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    answers.write(json.dumps(ok) + "\\n")
    answers.flush()
"""


@dataclass
class Sandbox:
    """A page's fresh clone, home and tools; ``env`` is what every block starts from."""

    root: Path
    work: Path
    home: Path
    env: dict[str, str]
    state: Path  # bash: the exported variables and folder a block leaves to the next
    session: subprocess.Popen[str] | None = None  # the page's Python interpreter

    def shell_context(self) -> tuple[str, dict[str, str]]:
        """The folder and exported variables the page's last shell block left."""
        proc = subprocess.run(["bash", "-c", f'. {shlex.quote(str(self.state))} && '
                               'printf "%s\\0" "$PWD" && env -0'], env=self.env,
                              capture_output=True, check=True)
        cwd, *pairs = proc.stdout.decode().split("\0")
        return cwd, dict(p.split("=", 1) for p in pairs if "=" in p)

    def python(self, script: Path) -> tuple[bool, str]:
        """Run ``script`` in the page's interpreter: (succeeded, its output)."""
        if self.session is None:
            self.session = subprocess.Popen(
                [sys.executable, "-c", SESSION], env=self.env, cwd=self.work, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.session.stdin is not None and self.session.stdout is not None
        cwd, env = self.shell_context()
        output = script.with_suffix(".out")
        self.session.stdin.write(json.dumps({"file": str(script), "cwd": cwd, "env": env,
                                             "output": str(output)}) + "\n")
        self.session.stdin.flush()
        ready, _, _ = select.select([self.session.stdout], [], [], BLOCK_TIMEOUT)
        answer = self.session.stdout.readline() if ready else ""
        text = output.read_text() if output.exists() else ""
        if not answer:
            self.close()
            return False, text + f"\n(the interpreter ended or took over {BLOCK_TIMEOUT} s)"
        return json.loads(answer), text

    def close(self) -> None:
        if self.session is not None:
            self.session.kill()
            self.session.wait()
            self.session = None


def make_sandbox(root: Path) -> Sandbox:
    work, home, bin_dir = root / "work", root / "home", root / "bin"
    for d in (home, bin_dir):
        d.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    work.mkdir()
    for folder in ("recipes", "examples"):
        shutil.copytree(REPO / folder, work / folder, ignore=ignore)
    python = shlex.quote(sys.executable)
    for tool, argv in (("weightstore", f"{python} -m weightstore"), ("python", python),
                       ("python3", python)):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in DROPPED and not k.startswith(DROPPED_PREFIXES)}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
               GIT_CONFIG_NOSYSTEM="1")
    git_env = {**env, "GIT_AUTHOR_NAME": "docs", "GIT_AUTHOR_EMAIL": "docs@example.invalid",
               "GIT_COMMITTER_NAME": "docs", "GIT_COMMITTER_EMAIL": "docs@example.invalid",
               "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z",
               "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z"}
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                 ["git", "commit", "-q", "-m", "a fresh clone"]):
        subprocess.run(argv, cwd=work, env=git_env, check=True, capture_output=True)
    state = root / "state.sh"
    state.write_text(f"cd {shlex.quote(str(work))}\n")
    return Sandbox(root, work, home, env, state)


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    failed_line: int | None  # the block's line (1-based) of the command that failed


def run_shell(box: Sandbox, script: str, name: str) -> Outcome:
    """``script`` in bash -e with the state of the page's earlier blocks; leaves its own."""
    state = shlex.quote(str(box.state))
    failed = box.root / "failed-line"
    failed.unlink(missing_ok=True)
    header = [
        f". {state}",
        f"trap '__rc=$?; {{ export -p; printf \"cd %q\\n\" \"$PWD\"; }} > {state}; "
        "exit $__rc' EXIT",
        f"trap 'echo $((LINENO - {{offset}})) > {shlex.quote(str(failed))}' ERR",
        "set -e -o pipefail",
    ]
    offset = len(header)
    header[2] = header[2].replace("{offset}", str(offset))
    path = box.root / f"{name}.sh"
    path.write_text("\n".join(header) + "\n" + script)
    proc = subprocess.run(["bash", str(path)], env=box.env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    line = None
    if proc.returncode and failed.exists():
        text = failed.read_text().strip()
        line = int(text) if text.isdigit() else None
    return Outcome(proc.returncode, proc.stdout, proc.stderr, line)


def console_commands(text: str) -> list[tuple[int, str, list[str]]]:
    """(offset of the command's first line in the block, command, output lines shown)."""
    found: list[tuple[int, str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ ") or line == "$":
            start, command = i, [line[2:]]
            while command[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            found.append((start, "\n".join(command), []))
        elif found:
            found[-1][2].append(line)
        elif line.strip():
            raise ExampleError(f"output before any `$ ` command: {line!r}")
        i += 1
    return found


def _loose(line: str) -> str:
    return " ".join(line.split())


def _pattern(shown: str) -> re.Pattern[str]:
    parts = re.split(r"\.\.\.|…", _loose(shown))
    return re.compile(".*".join(re.escape(p) for p in parts))


def missing_output(shown: list[str], actual: str) -> str | None:
    """The first shown line not found (in order) in ``actual``, or None."""
    got = [_loose(line) for line in actual.splitlines()]
    at = 0
    for line in shown:
        if not line.strip() or _loose(line) in ("...", "…"):
            continue
        pattern = _pattern(line)
        while at < len(got) and not pattern.search(got[at]):
            at += 1
        if at == len(got):
            return line
        at += 1
    return None


def _as_shown(box: Sandbox, text: str) -> str:
    """Output as a reader in the clone would see it: the clone relative, HOME as ~."""
    return text.replace(f"{box.work}/", "").replace(str(box.work), ".").replace(
        str(box.home), "~")


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_block(box: Sandbox, block: Block) -> None:
    """Run one block; an :class:`ExampleError` names page, line, command and stderr."""
    where = f"{block.page}:{block.line}"
    name = f"{Path(block.page).name}-L{block.line}"
    if block.language == "shell":
        out = run_shell(box, block.text, name)
        if out.returncode:
            line = block.line + out.failed_line if out.failed_line else block.line
            command = (block.text.splitlines()[out.failed_line - 1]
                       if out.failed_line and out.failed_line <= block.text.count("\n")
                       else block.text.strip())
            raise ExampleError(f"{block.page}:{line}: exit {out.returncode}: "
                               f"{command.strip()}\n--- stderr ---\n{_tail(out.stderr)}"
                               f"\n--- stdout ---\n{_tail(out.stdout, 15)}")
    elif block.language == "console":
        try:
            commands = console_commands(block.text)
        except ExampleError as exc:
            raise ExampleError(f"{where}: {exc}") from None
        for k, (offset, command, shown) in enumerate(commands):
            out = run_shell(box, command + "\n", f"{name}-{k}")
            line = block.line + 1 + offset
            if out.returncode:
                raise ExampleError(f"{block.page}:{line}: exit {out.returncode}: {command}"
                                   f"\n--- stderr ---\n{_tail(out.stderr)}"
                                   f"\n--- stdout ---\n{_tail(out.stdout, 15)}")
            actual = _as_shown(box, out.stdout + out.stderr)
            lost = missing_output(shown, actual)
            if lost is not None:
                raise ExampleError(f"{block.page}:{line}: {command}\nshown output line not "
                                   f"in the output (in order): {lost!r}\n--- output ---\n"
                                   f"{_tail(actual)}")
    else:
        script = box.root / f"{name}.py"
        script.write_text(block.text)
        ok, output = box.python(script)
        if not ok:
            raise ExampleError(f"{where}: python block failed (the traceback's {script.name} "
                               f"line N is page line {block.line}+N)\n--- output ---\n"
                               f"{_tail(output)}")


def needs_registry(page: Page) -> bool:
    return any(REGISTRY_USE.search(b.text) for b in page.blocks if b.not_run is None)
