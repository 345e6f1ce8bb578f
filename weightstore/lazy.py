"""Names loaded on first use (PEP 562), and submodules that can be called.

Packages export their public names lazily so that ``import weightstore`` and the command
line's start-up pay only for what a command needs. :func:`lazy_exports` gives a package
its ``__getattr__`` and ``__dir__`` from one table.

``weightstore.resolve`` is both a subpackage and the resolve function. The import system
sets a package attribute to the submodule whenever that is first imported, so a function
exported under the same name would be replaced or not depending on import order. Making
the submodule itself callable (:func:`make_callable`) keeps ``weightstore.resolve(...)``
the function, whatever was imported first (``inspect``, ``load`` and ``report``
likewise).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, str | None]],
                 public: Iterable[str],
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``.

    ``exports`` maps a public name to ``(submodule, attribute)``, the submodule relative to
    the package; attribute ``None`` exports the submodule itself (a nested one too, such as
    ``catalogue.inspect`` exported as ``inspect``).
    """
    names = sorted(public)

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attribute = exports[name]
        module = importlib.import_module(f".{module_name}", package)
        value = module if attribute is None else getattr(module, attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__


def make_callable(module_name: str, function_name: str) -> None:
    """Calling the module ``module_name`` calls its ``function_name`` (looked up on each
    call, so a lazily exported function is imported only when first called)."""
    module = sys.modules[module_name]

    class CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, function_name)(*args, **kwargs)

        @property
        def __signature__(self) -> inspect.Signature:
            # inspect.signature(weightstore.resolve) gives the function's parameters
            return inspect.signature(getattr(self, function_name))

    module.__class__ = CallableModule
