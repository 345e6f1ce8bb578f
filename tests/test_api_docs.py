"""The public API: its surface is pinned, and every example in docs/reference/api.md runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import weightstore

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md"

PUBLIC = [
    "BuildOptions", "BuildResult", "CheckReport", "ConvertReport", "PackageResult",
    "PreparedOptions", "Recipe", "ResolvedModel", "ScenarioSelectionContext", "StoreReference",
    "WeightStore",
    "WeightstoreError", "__version__", "add_scenario", "build", "bundle", "check_package",
    "convert_to_external", "convert_to_inline", "inspect", "list_scenarios", "load",
    "load_recipe", "prepare", "remove_scenario", "replay_scenario", "report", "resolve",
    "show_scenario",
]


def test_public_surface_is_pinned() -> None:
    """Adding, removing or renaming a public name must update this list and
    docs/reference/api.md, where each is rendered from its docstring."""
    assert sorted(weightstore.__all__) == sorted(PUBLIC)
    assert sorted(weightstore._EXPORTS) == sorted(n for n in PUBLIC if n != "__version__")
    documented = DOCS.read_text()
    for name in PUBLIC:
        if name != "__version__":
            assert f"`{name}" in documented, f"{name} is not in docs/reference/api.md"
            assert f'heading: "weightstore.{name}"' in documented, f"{name} is not rendered"


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "__version__"])
def test_public_names_resolve_and_are_documented(name: str) -> None:
    value = getattr(weightstore, name)
    assert callable(value)
    assert value.__doc__, f"{name} has no docstring"  # a callable submodule: its own
    # a dataclass without one gets its signature as __doc__: that documents nothing
    assert not value.__doc__.startswith(f"{name}("), f"{name} has no docstring"


def test_submodule_names_stay_callable_whatever_was_imported_first() -> None:
    code = ("import weightstore.builder.run, weightstore.catalogue.inspect, weightstore.resolve, "
            "weightstore.load, weightstore\n"
            "assert all(callable(getattr(weightstore, n)) for n in "
            "('build', 'inspect', 'resolve', 'load'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_is_cheap() -> None:
    """``import weightstore`` loads none of its dependencies."""
    code = ("import sys, weightstore\n"
            "heavy = {'onnx', 'numpy', 'pydantic', 'yaml', 'blake3', 'google.protobuf'}\n"
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"


def test_py_typed_is_package_data() -> None:
    assert (Path(weightstore.__file__).parent / "py.typed").is_file()
    pyproject = (DOCS.parents[2] / "pyproject.toml").read_text()
    assert re.search(r'weightstore\s*=\s*\[[^\]]*"py\.typed"', pyproject)


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_examples_run(tmp_path: Path, encoder_model: onnx.ModelProto,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(DOCS.read_text())
    assert len(blocks) >= 6
    onnx.save(encoder_model, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_api"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/reference/api.md block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/reference/api.md block {i + 1} failed:\n{block}") from exc


@pytest.mark.parametrize(("name", "first"), [("build", "recipe"), ("inspect", "path"),
                                             ("resolve", "source"), ("load", "resolved")])
def test_callable_modules_show_their_function_signature(name: str, first: str) -> None:
    """``inspect.signature`` (and editors, type checkers through the TYPE_CHECKING imports)
    see the function's parameters, not ``(*args, **kwargs)``."""
    import inspect

    assert next(iter(inspect.signature(getattr(weightstore, name)).parameters)) == first


def test_public_methods_of_exported_classes_have_docstrings() -> None:
    """Every method a user may call on an exported class is documented (inherited ones
    from pydantic and the standard library aside)."""
    import inspect

    missing = []
    for name in weightstore.__all__:
        obj = getattr(weightstore, name)
        if not inspect.isclass(obj):
            continue
        for attr, member in vars(obj).items():
            if (not attr.startswith("_") and inspect.isfunction(member)
                    and not member.__doc__):
                missing.append(f"{name}.{attr}")
    assert missing == []
