"""The dependency direction between the build side and the deploy side."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import weightstore

PACKAGE = Path(weightstore.__file__).parent


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of weightstore by its dotted name (a package by its own name)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, text: str | None = None) -> set[str]:
    """The modules ``path`` imports, anywhere in it (inside functions and
    ``TYPE_CHECKING`` blocks too): weightstore's each resolved to the module it names
    (``from . import x`` imports the submodule ``x``, ``from .m import name`` the module
    ``m``), any other by its name. The one exception is the API table's
    ``TYPE_CHECKING`` block (``weightstore/__init__.py``), which types the names it
    exports lazily from every folder: the package root sits above everything by design.
    ``text``: the source to read as if it were ``path``'s (the scan's own tests)."""
    modules = _modules()
    tree = ast.parse(path.read_text() if text is None else text)
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts == ("weightstore", "__init__"):
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level] if node.level else ()
            module = ".".join((*base, *(node.module or "").split("."))).strip(".")
            if module.split(".")[0] != "weightstore":
                out.add(module)
                continue
            subs = {f"{module}.{a.name}" for a in node.names} & modules.keys()
            out |= subs
            if len(subs) < len(node.names):
                out.add(module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out - {".".join(parts[:-1] if parts[-1] == "__init__" else parts)}


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


ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "lazy", "progress", "version"}


def _folder_imports(folder: str) -> set[str]:
    """The top-level weightstore names (folders or root modules) ``folder`` imports, its own
    left out."""
    out = set()
    for path in (PACKAGE / folder).glob("*.py"):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "weightstore" and len(parts) > 1 and parts[1] != folder:
                out.add(parts[1])
    return out


def test_the_package_root_holds_only_the_entry_points_and_shared_basics():
    """Every concept lives in a folder named after it (docs/explanation/architecture.md);
    the root keeps the entry points (``cli``, ``__main__``), the public API table and the
    four basics every folder may use (errors, lazy exports, progress, the version)."""
    assert {p.stem for p in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_io_and_the_store_sit_at_the_bottom():
    """File primitives know nothing but errors; the store knows nothing of models,
    recipes or packages."""
    assert _folder_imports("io") <= {"errors"}
    assert _folder_imports("store") <= {"errors", "io", "lazy", "progress"}


def test_only_the_command_line_and_releases_start_builds():
    importers = {folder.name for folder in PACKAGE.iterdir()
                 if folder.is_dir() and "builder" in _folder_imports(folder.name)}
    root = {p.stem for p in PACKAGE.glob("*.py")
            if any(i.startswith("weightstore.builder") for i in _imports(p))}
    assert importers <= {"release"} and root <= {"cli", "__init__"}


def test_no_module_imports_the_package_root():
    """The package's ``__init__`` is the API table, above everything: no module of the
    package imports it (``from .. import __version__`` climbed back up to it); the
    version lives on the ground floor, ``weightstore.version``."""
    importers = sorted(name for name, path in _modules().items()
                       if name != "weightstore" and "weightstore" in _imports(path))
    assert importers == []


def test_the_scan_sees_an_import_of_the_package_root():
    run = PACKAGE / "builder" / "run.py"
    assert "weightstore" in _imports(run, "from .. import __version__\n")
    assert "weightstore" in _imports(run, "import weightstore\n")
    assert "weightstore" not in _imports(run, "from .. import version\n")


def test_the_folder_scan_sees_imports():
    assert "io" in _folder_imports("store") and "recipe" in _folder_imports("builder")


def test_offline_assembly_reaches_no_registry():
    """``weightstore assemble`` works offline on what a generic client pulled, or on an
    OCI image layout: its modules (and the registry modules they import, followed) take
    the artifact's naming (``registry.artifact``), the OCI layout's reader, the foreign
    planner, the manifest kinds and the pure parsing of references and digests
    (``registry.reference``), and the package's assembly, never the registry client,
    push or pull, nor onnx."""
    seen, todo = set(), ["assemble"]
    names: set[str] = set()
    while todo:
        module = todo.pop()
        seen.add(module)
        found = _imports(PACKAGE / "registry" / f"{module}.py")
        names |= found
        todo += [n.rsplit(".", 1)[-1] for n in found if n.startswith("weightstore.registry.")
                 and n.rsplit(".", 1)[-1] not in seen]
    assert seen == {"assemble", "artifact", "oci_layout", "foreign_plan", "kinds",
                    "reference"}
    assert "weightstore.package.assembly" in names
    assert not any(n == "onnx" or n.startswith(("onnx.", "requests")) for n in names)


def test_only_the_command_line_the_api_and_releases_import_the_report():
    """The report sits just below release/, which may include it: it reads packages,
    release archives (through packaging/unpack and diff), resolution (through
    packaging/check), the store and the builds it records (a store reference's action
    record), and nothing below it knows it exists."""
    importers = {folder.name for folder in PACKAGE.iterdir()
                 if folder.is_dir() and "report" in _folder_imports(folder.name)}
    root = {p.stem for p in PACKAGE.glob("*.py")
            if any(i.startswith("weightstore.report") for i in _imports(p))}
    assert importers <= {"release"} and root <= {"cli", "__init__"}
    assert _folder_imports("report") <= {"errors", "io", "lazy", "progress", "version",
                                         "package", "packaging", "resolve", "store"}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_between_modules():
    """No module imports, however indirectly and wherever in the file (a function, a
    ``TYPE_CHECKING`` block), a module that imports it back: each concept sits on the
    ones it needs (docs/explanation/architecture.md, "No circles")."""
    modules = _modules()
    graph = {name: _imports(path) & modules.keys() for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_scan_sees_circles_and_every_kind_of_import():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    # a function-level import, a TYPE_CHECKING one, and "from . import submodule"
    assert "weightstore.store.gc" in _imports(PACKAGE / "store" / "store.py")  # in plan_gc
    assert "weightstore.store.core" in _imports(PACKAGE / "store" / "gc.py")
    assert {"weightstore.report.diff", "weightstore.report.store_view"} <= _imports(
        PACKAGE / "report" / "views.py")


# The layers, bottom first (docs/explanation/architecture.md, "Layers"): a module imports modules of
# its own folder, of a lower layer, and the root's basics (errors, lazy, progress, version).
LAYERS = ("io", "_proto", "store", "signing", "layout", "recipe", "catalogue", "package", "caches",
          "convert", "passes", "scenarios", "resolve", "packaging", "load", "registry",
          "builder", "report", "release")
# Imports that still climb a layer, each (file, the folder it reaches up to), explained in
# docs/explanation/architecture.md (at most two). A climb added
# fails the test below, and so does one removed but still listed here.
CLIMBS = {
    ("convert/api.py", "scenarios"),
}


def _climbs() -> set[tuple[str, str]]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    out = set()
    for path in PACKAGE.rglob("*.py"):
        folder = path.relative_to(PACKAGE).parts[0]
        if folder not in rank:
            continue  # the root's modules sit above every layer
        for name in _imports(path):
            parts = name.split(".")
            if (parts[0] == "weightstore" and len(parts) > 1 and parts[1] in rank
                    and rank[parts[1]] > rank[folder]):
                out.add((str(path.relative_to(PACKAGE)), parts[1]))
    return out


def test_every_folder_has_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)


def test_imports_climb_no_layer_but_the_listed_ones():
    """No import reaches up to a higher layer than its own, inside a function or a
    TYPE_CHECKING block too, but the ones listed (and each listed one still exists)."""
    assert _climbs() == CLIMBS
