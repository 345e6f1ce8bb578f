"""The dependency direction between the build side and the deploy side."""

from __future__ import annotations

import ast
from pathlib import Path

import weightstore

PACKAGE = Path(weightstore.__file__).parent


def _imports(path: Path) -> set[str]:
    """Absolute names of the weightstore modules ``path`` imports (anywhere in it)."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level]
                out.add(".".join((*base, node.module or "")).rstrip("."))
            elif node.module:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_scenarios_never_import_resolution():
    """Scenarios (records, replay, build-side planning) sit below resolution: resolve/
    replays their records, never the other way round, not even inside a function."""
    offenders = {p.name: sorted(i for i in _imports(p) if i.startswith("weightstore.resolve"))
                 for p in (PACKAGE / "scenarios").glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_scan_sees_function_level_imports():
    inner = PACKAGE / "resolve" / "runnable.py"  # imports scenarios modules at the top
    assert "weightstore.scenarios.api" in _imports(inner)
    assert "weightstore.resolve.commands" in _imports(PACKAGE / "cli.py")  # in a function
