"""The package surface: every stage and module reachable in a fresh interpreter, whatever
was imported before; the lazy names resolve; the import graph runs one way, down the
pipeline; typed (py.typed)."""

from __future__ import annotations

import ast
import importlib
import importlib.resources
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scansnap_lens as ss

PACKAGE = Path(ss.__file__).parent
# The pipeline, first stage first: a module may import its own stage and those before it.
STAGES = [
    "inputs", "models", "statistics", "recording", "theory", "measures", "planning", "reading",
    "viz", "lab",
]  # fmt: skip
TOOLS = ["report", "demo", "distributed", "cli"]  # built on every stage


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(ss.__path__, "scansnap_lens.")]


def test_every_module_and_name_is_reachable_in_a_fresh_interpreter():
    assert set(STAGES) | set(TOOLS) - {"cli"} <= set(ss.__all__)
    code = (
        "import importlib, sys, scansnap_lens as ss\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "for n in ss.__all__: getattr(ss, n)\n"
        "for s in ss.__all__:\n"
        "    p = getattr(ss, s)\n"
        "    for n in getattr(p, '__all__', []): getattr(p, n)\n"
    )
    subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code, *_modules()],
                   check=True)  # fmt: skip
    assert ss.TokenKind.DISTINCT.word == "distinct"


def test_functions_named_like_their_stage_are_functions():
    """``ss.token_kinds(stats)`` and ``ss.train(model, ...)`` call the functions."""
    assert ss.token_kinds is ss.statistics.kinds.token_kinds
    assert ss.train is ss.models.training.train


def _imports(path: Path) -> set[str]:
    """The scansnap_lens modules a file imports anywhere (functions included), except for
    type checking only."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and id(node) not in typing_only
        if node.module.startswith("scansnap_lens")
    }


def test_the_import_graph_runs_down_the_pipeline():
    rank = {stage: i for i, stage in enumerate(STAGES)}
    rank.update({tool: len(STAGES) for tool in TOOLS})
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own not in rank:
            continue  # _io, _lazy, __init__: the package's plumbing
        for module in _imports(path):
            parts = module.split(".")
            other = parts[1] if len(parts) > 1 else None
            if other in rank and rank[other] > rank[own]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not wrong, wrong


def test_the_package_is_typed():
    assert importlib.resources.files("scansnap_lens").joinpath("py.typed").is_file()


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_exports_every_public_name_of_its_modules(stage):
    """``ss.<stage>.<name>`` is the object of every name a module of the stage lists in its
    ``__all__`` (read from its source), and nothing else: each name has one home."""
    package = importlib.import_module(f"scansnap_lens.{stage}")
    exported, modules = {}, set()
    for path in (PACKAGE / stage).glob("*.py"):
        if not path.stem.startswith("_"):
            modules.add(path.stem)
            module = importlib.import_module(f"scansnap_lens.{stage}.{path.stem}")
            assert not set(module.__all__) & set(exported), f"{path.stem} exports a name twice"
            exported.update(dict.fromkeys(module.__all__, module))
    assert set(package.__all__) == set(exported) | modules
    assert dir(package) == sorted(package.__all__)
    for name, module in exported.items():
        assert getattr(package, name) is getattr(module, name)


def test_a_name_two_modules_of_a_stage_export_is_refused(tmp_path, monkeypatch):
    from scansnap_lens._lazy import exports

    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "__init__.py").write_text("")
    for module in ("a", "b"):
        (tmp_path / "stage" / f"{module}.py").write_text(f'__all__ = ["X"]\nX = "{module}"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="stage: X is exported by a and b"):
        exports("stage", "a b")
    names, getattr_, _ = exports("stage", "a")
    assert names == ["X", "a"] and getattr_("X") == "a"


def test_the_objects_a_notebook_holds_have_short_reprs():
    """A cell ending in a trajectory, plan, statistics, kinds or groups shows its sizes, not
    millions of characters of tensors (repr(TokenGroups) was 4.9 million on real text)."""
    import torch

    import scansnap_lens as ss
    from scansnap_lens.lab.calibration import Scenario, crossed_run

    traj, groups, _ = crossed_run(Scenario(queries=40, pool=400, commons=200), heads=8)
    stats = ss.cooccurrence(torch.randint(0, 500, (64, 64), generator=torch.Generator()), 500)
    for thing in (traj, traj.plan, groups, stats, ss.token_kinds(stats)):
        text = repr(thing)
        assert len(text) < 300 and type(thing).__name__ in text, text


def test_library_errors_name_fields_not_command_line_flags():
    """A library error names a field (``min_support=``); the command line adds its flag
    (`cli.flag_text`), so a notebook reads no flag and no message names one that does not
    exist (``--min-events`` was named; the command line has no such flag)."""
    flagged = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "cli.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = ast.get_source_segment(source, node.exc) or ""
                if re.search(r"(?<![\w-])--[a-z{]", text):
                    flagged.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not flagged, flagged


def test_every_name_the_docs_point_to_exists():
    """A doc's `module.name` (the glossary's homes, the module map) resolves in the package:
    a renamed or removed function leaves no pointer to nothing."""
    floors = {"measures", "recording", "reading", "statistics", "models", "planning", "viz",
              "theory", "lab", "inputs", "report", "cli", "distributed"}  # fmt: skip
    missing, seen = [], 0
    for doc in sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md")):
        for ref in re.findall(r"`([a-z_]+(?:\.[A-Za-z_]\w*)+)`", doc.read_text()):
            parts = ref.split(".")
            if parts[0] not in floors:
                continue
            seen += 1
            for cut in range(len(parts), 0, -1):  # the longest importable module
                try:
                    obj = importlib.import_module("scansnap_lens." + ".".join(parts[:cut]))
                    break
                except ImportError:
                    continue
            for name in parts[cut:]:
                if name in getattr(obj, "__dataclass_fields__", {}):  # a field, not an attribute
                    break
                if not hasattr(obj, name):
                    missing.append(f"{doc.name}: {ref}")
                    break
                obj = getattr(obj, name)
    assert seen > 50 and not missing, missing
