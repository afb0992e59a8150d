"""Packages whose public names live in their modules and are imported on first use.

A package's ``__init__`` lists its names once (name -> module); importing the package then
costs nothing, and no import order decides whether a name exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, names: dict[str, str], modules: set[str]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for `package`: `names` maps each public name to the
    module (relative to the package) that defines it; `modules` are its public modules."""

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(names) | modules)

    return __getattr__, __dir__
