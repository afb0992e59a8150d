"""Settings values whose fields carry their command-line option: `setting` declares a field
with its group and help, `options` lists a value's options, and the command line builds one
generator over all of them (`RecordingSettings`, `Classification`, `AnalysisSettings`,
`Rates`), so a field, its default and its help are written once."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field

__all__ = ["options", "setting"]


def setting(default=MISSING, group: str = "", help: str = "", flag: str | None = None,
            scale: float = 1, choices: tuple | None = None, **kwargs):  # fmt: skip
    """A dataclass field with its option: group and help as ``--help`` shows them; flag
    (None: the field's name with dashes, ``--no-NAME`` for a field that defaults to True;
    "": no option); scale: the option's unit in the field's (bytes as MB: 1e6)."""
    meta = {"group": group, "help": help, "given_flag": flag, "scale": scale, "choices": choices}
    return field(default=default, metadata=meta, **kwargs)


def options(cls) -> list[dict]:
    """Each field of the dataclass `cls` the command line sets: name, flag, group, default,
    help, choices (or None), scale."""
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
            out.append({"name": f.name, "flag": flag, "default": default, "group": meta["group"],
                        "help": meta["help"], "choices": meta["choices"],
                        "scale": meta["scale"]})  # fmt: skip
    return out
