"""A suite of runs of one recipe in one folder: each hub repository (PolyPythias'
``EleutherAI/pythia-160m-seed{1..9}``, or a list) recorded into a folder of its own, named
as the repository (``pythia-160m-seed3``), one after the other, each a sweep with its own
bounded disk; the identical command resumes each where it stopped, and `scansnap report` on
the suite folder compares its runs (the runs page).

>>> expand(["EleutherAI/pythia-70m-seed{1..3}", "EleutherAI/pythia-70m"])[1:]
['EleutherAI/pythia-70m-seed2', 'EleutherAI/pythia-70m-seed3', 'EleutherAI/pythia-70m']
>>> expand(["org/m-{data,weight}-seed{1..2}"])
['org/m-data-seed1', 'org/m-data-seed2', 'org/m-weight-seed1', 'org/m-weight-seed2']
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from scansnap_lens._io import make_folder, read_json, write_text

__all__ = ["SUITE_FILE", "Suite", "expand"]

SUITE_FILE = "suite.json"
MAX_RUNS = 1000  # a pattern that expands further is a typo, not a suite
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")
_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def expand(patterns: Sequence[str]) -> list[str]:
    """The names a shell's brace expansion gives (``{1..9}``, ``{a,b}``, several in a name),
    in order; a name given twice is refused, as are more than `MAX_RUNS`."""
    out: list[str] = []
    todo = list(patterns)
    while todo:
        name = todo.pop(0)
        # the leftmost brace first, as a shell expands them
        found = min(
            (m for m in (_RANGE.search(name), _LIST.search(name)) if m),
            key=lambda m: m.start(),
            default=None,
        )
        if found is None:
            if name in out:
                raise ValueError(f"{name} is given twice: give each run once")
            out.append(name)
        else:
            if found.re is _RANGE:
                a, b = int(found.group(1)), int(found.group(2))
                step = 1 if b >= a else -1
                parts = [str(k) for k in range(a, b + step, step)]
            else:
                parts = found.group(1).split(",")
            todo[:0] = [name[: found.start()] + p + name[found.end() :] for p in parts]
        if len(out) + len(todo) > MAX_RUNS:
            raise ValueError(f"the names expand to more than {MAX_RUNS} runs: check the pattern")
    return out


class Suite:
    """A suite folder: ``suite.json`` (the runs' names, in order) and one recording
    folder per run, named as its repository without the owner."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @property
    def file(self) -> Path:
        return self.folder / SUITE_FILE

    @classmethod
    def holds(cls, folder: str | Path) -> bool:
        return (Path(folder) / SUITE_FILE).is_file()

    def runs(self) -> list[str]:
        """The runs' names as the file lists them (checked as a list of names)."""
        try:
            said = read_json(self.file, "suite's list of runs")
        except (OSError, ValueError) as err:
            raise ValueError(f"{self.file}: cannot read the suite ({err})") from None
        runs = said.get("runs") if isinstance(said, dict) else None
        if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
            raise ValueError(f"{self.file}: 'runs' must be a list of names")
        return runs

    def folder_of(self, name: str) -> Path:
        """The run's recording folder: its repository's name without the owner."""
        tail = name.rstrip("/").rsplit("/", 1)[-1]
        if not _FOLDER.match(tail) or tail in (SUITE_FILE,):
            raise ValueError(f"{name!r}: not a repository name a folder can be named after")
        return self.folder / tail

    def start(self, names: Sequence[str]) -> list[tuple[str, Path]]:
        """Open the folder for `names` (its file written first, runs it lists already kept:
        a suite grows, it never forgets a run) and return (name, folder) per run."""
        tails = [self.folder_of(n).name for n in names]
        clash = sorted({t for t in tails if tails.count(t) > 1})
        if clash:
            raise ValueError(
                f"runs {clash} would share a folder: name repositories whose last parts differ"
            )
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"{self.folder} is a file: a suite needs a folder")
        if not self.holds(self.folder) and self.folder.is_dir() and any(self.folder.iterdir()):
            if (self.folder / "manifest.json").is_file():
                raise ValueError(
                    f"{self.folder} holds one recording: give a new folder for the suite"
                )
        known = self.runs() if self.holds(self.folder) else []
        runs = known + [n for n in names if n not in known]
        make_folder(self.folder)
        write_text(self.file, json.dumps({"runs": runs}, indent=1))
        return [(n, self.folder_of(n)) for n in names]

    def recorded(self) -> dict[str, Path]:
        """{folder name: folder} of the listed runs that hold a recording, in order."""
        out = {}
        for name in self.runs():
            folder = self.folder_of(name)
            if (folder / "manifest.json").is_file():
                out[folder.name] = folder
        return out
