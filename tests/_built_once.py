"""Fixtures built once per test run, however many xdist workers use them.

A session fixture is built once per worker, a module fixture once per worker that runs one
of its module's tests: under ``pytest -n auto`` the demo ran on each worker.  `built_once`
builds in the run's own temporary folder (the one every worker's ``basetemp`` lies in),
under a lock, in a folder named by the fixture and the code that makes it (the package's and
the tests' helpers' sources); the other workers wait for it and read what it wrote.  What
it builds must be files (a checkpoint folder, a recording) and a JSON value, read only by
the tests that use it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def code_key() -> str:
    """A hash of the package's sources and the tests' shared helpers."""
    digest = hashlib.sha256()
    files = sorted((REPO / "scansnap_lens").rglob("*.py")) + sorted(REPO.glob("tests/_*.py"))
    for path in [*files, REPO / "tests" / "conftest.py"]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], object]) -> tuple[Path, object]:  # fmt: skip
    """(folder, value): ``build(folder)`` run once in this test run for `name`, its value
    kept as JSON.  A build that touched a TransformerLens model counts as touching one in
    every worker that reads it (tests/_major.py)."""
    major = importlib.import_module("tests._major")  # the plugin, as the root conftest loaded it
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder: each worker's basetemp is one below it
    folder = root / f"built-{name}-{code_key()}"
    done = folder / "built.json"  # written last: its presence says the build finished
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            folder.mkdir()
            before = major.touched
            value = build(folder)
            done.write_text(json.dumps({"value": value, "model": major.touched > before}))
    kept = json.loads(done.read_text())
    if kept["model"]:
        major.touched += 1
    return folder, kept["value"]
