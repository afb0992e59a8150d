"""Packages whose public names live in their modules and are imported on first use.

A stage names its public modules once; each name they export is the one their own
``__all__`` lists (read from their source, so importing the stage costs nothing and no
import order decides whether a name exists).  A module's ``__all__`` is its one list.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable
from pathlib import Path

_ALL = re.compile(r"^__all__ = (\[.*?\])", re.S | re.M)


def exports(
    package: str, modules: str, chosen: dict[str, str] | None = None
) -> tuple[list[str], Callable, Callable]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for `package`: its public `modules`
    (space-separated, relative to it) and every name in their ``__all__``, or, where given,
    the names `chosen` ({module: space-separated names})."""
    public = set(modules.split())
    if chosen is None:
        names = _exported(package, public)
    else:
        names = {name: module for module, some in chosen.items() for name in some.split()}

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        if name in public:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(names) | public)

    return __dir__(), __getattr__, __dir__


def _exported(package: str, modules: set[str]) -> dict[str, str]:
    """{name: module} of every name the `modules`' ``__all__`` lists; ImportError where two
    list one name."""
    folder = Path(importlib.import_module(package).__file__).parent
    out: dict[str, str] = {}
    for module in sorted(modules):
        found = _ALL.search((folder / f"{module}.py").read_text(encoding="utf-8"))
        for name in ast.literal_eval(found.group(1)) if found else ():
            if name in out:
                raise ImportError(f"{package}: {name} is exported by {out[name]} and {module}")
            out[name] = module
    return out
