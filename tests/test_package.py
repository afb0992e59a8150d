"""The package surface: every public module reachable as ``ss.<module>`` in a fresh
interpreter, whatever was imported before; the lazy names resolve; typed (py.typed)."""

from __future__ import annotations

import importlib.resources
import subprocess
import sys
from pathlib import Path

import scansnap_lens as ss

PACKAGE = Path(ss.__file__).parent


def test_every_public_module_is_reachable_in_a_fresh_interpreter():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))
    modules = [m for m in modules if m != "cli"] + ["viz"]
    assert set(modules) <= set(ss.__all__)
    code = "import scansnap_lens as ss, sys; [getattr(ss, m) for m in sys.argv[1:]]"
    subprocess.run([sys.executable, "-c", code, *modules], check=True)
    for name in ss.__all__:
        assert getattr(ss, name) is not None, name
    assert ss.TokenKind.DISTINCT.label == "distinct"


def test_the_package_is_typed():
    assert importlib.resources.files("scansnap_lens").joinpath("py.typed").is_file()
