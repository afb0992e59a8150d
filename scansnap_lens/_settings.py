"""Settings values whose fields carry their command-line option: `setting` declares a field
with its group and help, `options` lists a value's options, and the command line builds one
generator over all of them (`RecordingSettings`, `Classification`, `AnalysisSettings`,
`Rates`), so a field, its default, its help and how its option's text is read (`reads`:
`count`, `real`, `ints`, ...) are written once; `Settings` is the base
every one of them shares: `replace`, `to_dict`, `from_dict` and one rule for a name it does
not know (refused, naming it and the known ones).

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Knobs(Settings):
...     rate: float = 0.1
...     steps: tuple = (1, 2)
>>> Knobs().replace(rate=0.2).to_dict()
{'rate': 0.2, 'steps': [1, 2]}
>>> Knobs.from_dict({"rate": 0.3, "step": 4})
Traceback (most recent call last):
ValueError: unknown Knobs field 'step': known are rate, steps
>>> @dataclass(frozen=True)
... class Bounded(Settings):
...     most: int = 4
...     def __post_init__(self):
...         assert self.most >= 1
>>> Bounded.from_dict({"most": "many"})  # as a crafted file gives it
Traceback (most recent call last):
ValueError: Bounded holds a value of the wrong kind: '>=' not supported between ...
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import MISSING, field

__all__ = [
    "Settings",
    "count",
    "count_or_all",
    "fraction",
    "ints",
    "nonnegative",
    "options",
    "positive",
    "real",
    "setting",
    "share",
]


def setting(
    default=MISSING,
    group: str = "",
    help: str = "",
    flag: str | None = None,
    scale: float = 1,
    choices: tuple | None = None,
    reads=str,
    **kwargs,
):
    """A dataclass field with its option: group and help as ``--help`` shows them; flag
    (None: the field's name with dashes, ``--no-NAME`` for a field that defaults to True;
    "": no option); scale: the option's unit in the field's (bytes as MB: 1e6); reads: the
    option's text to its value (`count`, `real`, ...), raising `argparse.ArgumentTypeError`."""
    meta = {
        "group": group,
        "help": help,
        "given_flag": flag,
        "scale": scale,
        "choices": choices,
        "reads": reads,
    }
    return field(default=default, metadata=meta, **kwargs)


# How an option's text is read: each a function of the text, whose error names the rule.
def ints(text: str) -> list[int]:
    """Comma-separated integers."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def count(low: int, high: int = 2**31 - 1):
    """An integer in [low, high].

    >>> count(1, 8)("3")
    3
    >>> count(1, 8)("9")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must lie in [1, 8], got 9
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must lie in [{low}, {high}], got {value}")
        return value

    return parse


def count_or_all(low: int, all=0):
    """An integer >= low, or "all" (read as `all`)."""
    read = count(low)
    return lambda text: all if text.strip().lower() == "all" else read(text)


def real(test, rule: str):
    """A finite number that passes `test`, else "must RULE"."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or not test(value):
            raise argparse.ArgumentTypeError(f"must {rule}, got {text}")
        return value

    return parse


positive = real(lambda v: v > 0, "be a positive finite number")
fraction = real(lambda v: 0 <= v < 1, "lie in [0, 1)")
nonnegative = real(lambda v: v >= 0, "be a finite number >= 0")
share = real(lambda v: 0 < v <= 1, "lie in (0, 1]")


def options(cls) -> list[dict]:
    """Each field of the dataclass `cls` the command line sets: name, flag, group, default,
    help, choices (or None), scale, reads."""
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "given_flag" not in meta:
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        default = None if default is MISSING else default
        flag = meta["given_flag"]
        if flag is None:
            flag = ("--no-" if default is True else "--") + f.name.replace("_", "-")
        if flag:
            out.append(
                {
                    "name": f.name,
                    "flag": flag,
                    "default": default,
                    "group": meta["group"],
                    "help": meta["help"],
                    "choices": meta["choices"],
                    "scale": meta["scale"],
                    "reads": meta["reads"],
                }
            )
    return out


class Settings:
    """The base of a frozen dataclass of settings: `replace`, `to_dict` (tuples as lists,
    settings inside as dicts: what JSON keeps) and `from_dict` (its inverse), each refusing a
    name the value does not know, naming it and the known ones."""

    def replace(self, **changes):
        """These settings with some fields changed."""
        _known(type(self), changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict):
        """The settings `to_dict` gave (a settings value inside from its dict)."""
        if not isinstance(values, dict):
            raise ValueError(f"{cls.__name__} settings must be a dict, got {values!r}")
        _known(cls, values)
        values = dict(values)
        for f in dataclasses.fields(cls):
            inner = _settings_type(f.type, cls)
            if inner is not None and isinstance(values.get(f.name), dict):
                values[f.name] = inner.from_dict(values[f.name])
            elif isinstance(values.get(f.name), list):
                values[f.name] = tuple(values[f.name])
        try:
            return cls(**values)
        except TypeError as err:  # a value of another kind (read from a file): said as one
            raise ValueError(f"{cls.__name__} holds a value of the wrong kind: {err}") from None


def _known(cls, names) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(names) - set(known))
    if unknown:
        what = "field" if len(unknown) == 1 else "fields"
        raise ValueError(
            f"unknown {cls.__name__} {what} {', '.join(map(repr, unknown))}:"
            f" known are {', '.join(known)}"
        )


def _plain(value):
    if isinstance(value, Settings):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _settings_type(annotation, owner):
    """The `Settings` class a field holds (its annotation names one), or None."""
    import sys

    names = vars(sys.modules[owner.__module__])
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    for part in str(text).replace(" ", "").split("|"):
        found = names.get(part)
        if isinstance(found, type) and issubclass(found, Settings):
            return found
    return None
