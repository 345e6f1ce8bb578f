"""The declared dependency range, both ends, for CI.

``floors``: every runtime dependency (``project.dependencies``, the ``runtime`` and
``sign`` extras) pinned at its declared lower bound, as a pip constraints file; a
dependency that declares no lower bound is an error, since nothing would say which
version it was tested with.

``newest``: reads ``pip list --outdated --format=json`` and fails when an environment
holds an older release of a runtime dependency than the newest one (something held it
back, so the newest would go untested).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    listed = project["dependencies"] + extras["runtime"] + extras["sign"]
    return [Requirement(text) for text in listed]


def floor(requirement: Requirement) -> str:
    lower = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    if len(lower) != 1:
        raise SystemExit(f"{requirement}: declare exactly one lower bound (>=X)")
    return lower[0]


def floors() -> str:
    return "".join(f"{r.name}=={floor(r)}\n" for r in runtime_requirements())


def behind(outdated: list[dict[str, str]]) -> list[str]:
    names = {canonicalize_name(r.name) for r in runtime_requirements()}
    return [f"{p['name']} {p['version']} (newest {p['latest_version']})" for p in outdated
            if canonicalize_name(p["name"]) in names]


def main(argv: list[str]) -> int:
    if argv == ["floors"]:
        sys.stdout.write(floors())
        return 0
    if argv == ["newest"]:
        old = behind(json.load(sys.stdin))
        for line in old:
            print(f"not the newest release: {line}", file=sys.stderr)
        return 1 if old else 0
    print("usage: dependencies.py floors | newest < outdated.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
