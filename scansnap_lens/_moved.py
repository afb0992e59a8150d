"""Old import paths: the flat modules of scansnap_lens 0.1, and where each moved.

``import scansnap_lens.recording.hooks`` still works: it warns (FutureWarning, shown in notebooks)
and gives a module that reads through to ``scansnap_lens.recording.hooks``.  Names renamed
on the way (`RENAMED`) are found under their old names too, with a warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {  # old module -> new module, both under scansnap_lens
    "text": "inputs.text",
    "tokens": "inputs.tokens",
    "indexed": "inputs.indexed",
    "backend": "models.backend",
    "formats": "models.formats",
    "labels": "models.hub",
    "checkpoints": "models.checkpoints",
    "train": "models.training",
    "tutorial": "models.tutorial",
    "context": "statistics.context",
    "corpus": "statistics.corpus",
    "kinds": "statistics.kinds",
    "classify": "statistics.classification",
    "groups": "statistics.groups",
    "plan": "recording.plan",
    "record": "recording.hooks",
    "recorder": "recording.recorder",
    "trajectory": "recording.trajectory",
    "measure": "measures",
    "heads": "measures.heads",
    "fit": "measures.fit",
    "population": "theory.population",
    "synthetic": "lab.synthetic",
    "yz": "lab.yz",
}
RENAMED = {  # old module -> {old name: new name}
    "measure": {"growth": "growth_factor"},
}
CALLABLE = {"classify", "train"}  # old modules named like their function: calling one calls it


class MovedModule(types.ModuleType):
    """The module an old path gives: attributes are read from the module that moved."""

    def __init__(self, old: str):
        super().__init__(f"scansnap_lens.{old}")
        self._old = old
        self._target = importlib.import_module(f"scansnap_lens.{MOVED[old]}")
        self.__doc__ = self._target.__doc__

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_old", "_target"):
            raise AttributeError(name)
        renamed = RENAMED.get(self._old, {})
        if name in renamed:
            warnings.warn(
                f"scansnap_lens.{self._old}.{name} is now "
                f"scansnap_lens.{MOVED[self._old]}.{renamed[name]}",
                FutureWarning,
                stacklevel=2,
            )
            name = renamed[name]
        return getattr(self._target, name)

    def __dir__(self) -> list[str]:
        return dir(self._target)

    def __call__(self, *args, **kwargs):
        if self._old not in CALLABLE:
            raise TypeError(f"module scansnap_lens.{self._old} is not callable")
        return getattr(self._target, self._old)(*args, **kwargs)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package == "scansnap_lens" and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        warnings.warn(
            f"{spec.name} moved to scansnap_lens.{MOVED[old]}; the old path will be removed",
            FutureWarning,
            stacklevel=2,
        )
        return MovedModule(old)

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Let the old paths be imported (once per interpreter)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())


def old_names(module: str, renames: dict[str, str]):
    """A module ``__getattr__`` that finds renamed names under their old names, with a warning.

    >>> import scansnap_lens.statistics.corpus as corpus
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     corpus.from_dataset is corpus.cooccurrence_from_dataset
    True
    >>> str(caught[0].message)
    'scansnap_lens.statistics.corpus.from_dataset is now cooccurrence_from_dataset'
    """

    def __getattr__(name: str):
        if name in renames:
            warnings.warn(f"{module}.{name} is now {renames[name]}", FutureWarning, stacklevel=2)
            return getattr(sys.modules[module], renames[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
