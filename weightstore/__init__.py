"""weightstore: a declarative build tool with a content-addressed weight store for ONNX models.

The public Python API is what ``__all__`` lists; ``docs/reference/api.md`` shows it at work. The
commands that build, inspect, convert, check and load have a function here:

* ``build(recipe, BuildOptions(...))``: a recipe file, a :class:`Recipe` or a mapping;
* ``inspect(model)``: every weight of a model, from metadata only;
* ``convert_to_external`` / ``convert_to_inline``: between inline, external-data and
  FileConstant forms;
* ``list_scenarios`` / ``show_scenario`` / ``add_scenario`` / ``remove_scenario`` /
  ``replay_scenario``: modification scenarios stored in a model file;
* ``check_package`` and ``bundle``: a built package, for a scenario or a device;
* ``WeightStore``: the store itself (stats, verify, repair);
* ``report(target, output)``: the HTML report of a package (its data returned);
* ``resolve(source, ...)`` and ``load(resolved)``: the deploy side, with ``prepare``
  (a device's prepared weights), ``PreparedOptions`` (how ``resolve`` uses them) and the
  ``ScenarioSelectionContext`` a ``selector`` is given.

Names load on first use (PEP 562): ``import weightstore`` stays cheap, so the command
line, which imports this package first, pays only for what its command needs.
``inspect``, ``resolve``, ``load`` and ``report`` are also modules (``inspect`` is
``catalogue.inspect``); each is callable as its function, whatever was imported first.
``build`` is the function alone: the build's package is ``weightstore.builder``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports
from .version import __version__

# name -> (submodule, attribute); attribute None: the submodule itself, which is callable
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "build": ("builder.run", "build"),
    "BuildOptions": ("builder.run", "BuildOptions"),
    "BuildResult": ("builder.run", "BuildResult"),
    "PackageResult": ("builder.run", "PackageResult"),
    "Recipe": ("recipe.schema", "Recipe"),
    "load_recipe": ("recipe.schema", "load_recipe"),
    "inspect": ("catalogue.inspect", None),
    "convert_to_external": ("convert", "convert_to_external"),
    "convert_to_inline": ("convert", "convert_to_inline"),
    "ConvertReport": ("convert", "ConvertReport"),
    "list_scenarios": ("scenarios.operations", "list_scenarios"),
    "show_scenario": ("scenarios.operations", "show_scenario"),
    "add_scenario": ("scenarios.operations", "add_scenario"),
    "remove_scenario": ("scenarios.operations", "remove_scenario"),
    "replay_scenario": ("resolve.runnable", "replay_scenario"),
    "check_package": ("packaging.check", "check_package"),
    "CheckReport": ("packaging.check", "CheckReport"),
    "bundle": ("packaging.bundles", "assemble"),
    "WeightStore": ("store", "WeightStore"),
    "resolve": ("resolve", None),
    "load": ("load", None),
    "ResolvedModel": ("resolve", "ResolvedModel"),
    "ScenarioSelectionContext": ("resolve", "ScenarioSelectionContext"),
    "PreparedOptions": ("resolve", "PreparedOptions"),
    "StoreReference": ("resolve", "StoreReference"),
    "prepare": ("load.prepare", "prepare"),
    "report": ("report", None),
    "WeightstoreError": ("errors", "WeightstoreError"),
}

__all__ = [
    "BuildOptions", "BuildResult", "CheckReport", "ConvertReport", "PackageResult",
    "PreparedOptions", "Recipe", "ResolvedModel", "ScenarioSelectionContext", "StoreReference",
    "WeightStore", "WeightstoreError", "__version__", "add_scenario", "build", "bundle",
    "check_package", "convert_to_external", "convert_to_inline", "inspect", "list_scenarios",
    "load", "load_recipe", "prepare", "remove_scenario", "replay_scenario", "report", "resolve",
    "show_scenario",
]

if TYPE_CHECKING:  # the callable modules are typed as the functions they call
    from .builder.run import BuildOptions, BuildResult, PackageResult, build
    from .catalogue.inspect import inspect_model as inspect
    from .convert import ConvertReport, convert_to_external, convert_to_inline
    from .errors import WeightstoreError
    from .load.prepare import prepare
    from .load.ready import load
    from .packaging.bundles import assemble as bundle
    from .packaging.check import CheckReport, check_package
    from .recipe.schema import Recipe, load_recipe
    from .report.api import report
    from .resolve import PreparedOptions, ResolvedModel, ScenarioSelectionContext, StoreReference
    from .resolve.api import resolve
    from .resolve.runnable import replay_scenario
    from .scenarios.operations import (
        add_scenario,
        list_scenarios,
        remove_scenario,
        show_scenario,
    )
    from .store import WeightStore


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
