"""Which tests depend on the TransformerLens major: those that build or run one of its models.

A pytest plugin (the root conftest.py loads it).  Every TransformerLens model, a
HookedTransformer or a bridge, is made of `HookPoint`s (its one tiny abstraction): this counts
each HookPoint constructed or run in the test process.  A test whose setup or call moved the
count, or that uses a fixture whose setup did, depends on the major and fails unless marked
``@pytest.mark.tl``: the second major's CI pass runs ``pytest -m tl`` (docs/contributing.md).
A model built in a subprocess is not seen here: mark those tests by hand.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import pytest

MODULE = "transformer_lens.hook_points"
touched = 0  # HookPoints constructed or run in this process so far


def _count(hook_point: type) -> None:
    init, forward = hook_point.__init__, hook_point.forward

    def counted_init(self, *args, **kwargs):
        global touched
        touched += 1
        init(self, *args, **kwargs)

    def counted_forward(self, *args, **kwargs):
        global touched
        touched += 1
        return forward(self, *args, **kwargs)

    hook_point.__init__, hook_point.forward = counted_init, counted_forward


class _OnImport(importlib.abc.MetaPathFinder):
    """Counts HookPoints from the moment their module is imported (the import itself may
    happen inside a test, which then builds a model at once)."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _count(module.HookPoint)

        spec.loader.exec_module = exec_module
        return spec


def pytest_configure(config):
    """Count from before anything imports TransformerLens (or at once if something has)."""
    if MODULE in sys.modules:
        _count(sys.modules[MODULE].HookPoint)
    else:
        sys.meta_path.insert(0, _OnImport())


def pytest_collection_modifyitems(items):
    """The library's doctests run under both majors: a few build a model, and none of them
    can carry a mark of its own (they cost little)."""
    for item in items:
        if isinstance(item, pytest.DoctestItem):
            item.add_marker(pytest.mark.tl)


_model_fixtures: set[str] = set()  # fixtures whose setup built or ran a model
_before = pytest.StashKey[int]()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = touched
    try:
        return (yield)
    finally:
        if touched > before:
            _model_fixtures.add(fixturedef.argname)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_before] = touched


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    fixtures = sorted(_model_fixtures.intersection(getattr(item, "fixturenames", ())))
    moved = touched > item.stash.get(_before, touched)
    if (moved or fixtures) and item.get_closest_marker("tl") is None:
        via = f" (through the fixture {', '.join(fixtures)})" if fixtures else ""
        pytest.fail(
            f"{item.nodeid} builds or runs a TransformerLens model{via} but is not marked "
            "@pytest.mark.tl: the second major's pass (pytest -m tl) would miss it",
            pytrace=False,
        )
    return result
