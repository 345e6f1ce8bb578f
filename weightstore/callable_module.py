"""Submodules that can be called, so a public function may share a submodule's name.

``weightstore.build`` is both a submodule and the build function. The import system sets
a package attribute to the submodule whenever that is first imported, so a function
exported under the same name would be replaced or not depending on import order. Making
the submodule itself callable keeps ``weightstore.build(...)`` the function, whatever was
imported first (``weightstore.resolve`` and ``weightstore.load`` work the same way).
"""

from __future__ import annotations

import sys
import types
from typing import Any


def make_callable(module_name: str, function_name: str) -> None:
    """Calling the module ``module_name`` calls its ``function_name``."""
    module = sys.modules[module_name]

    class CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, function_name)(*args, **kwargs)

    CallableModule.__call__.__doc__ = getattr(module, function_name).__doc__
    module.__class__ = CallableModule
