"""scansnap_lens: Scan and Snap instruments for TransformerLens models.

The names a notebook needs are here, imported on first use::

    import scansnap_lens as ss

    result = ss.run_demo("demo_out")  # train, record, measure, report
    result.summary  # one row per layer and head
    ss.viz.attention_over_checkpoints(result.trajectory)  # circuitsvis, inline

Functions named like their module (``classify``, ``train``) are imported from it:
``from scansnap_lens.classify import classify``.

Modules, one per concept: synthetic, yz, theory (the paper's lab and theory); corpus,
kinds, classify, groups (co-occurrence and token kinds); plan, record, recorder, trajectory,
checkpoints, train, tutorial (recording attention over checkpoints); measure, viz, report
(results).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_NAMES = {
    "run_demo": "demo",
    "sequences": "demo",
    "syn_small": "synthetic",
    "syn_medium": "synthetic",
    "sequence_classes": "synthetic",
    "train_yz": "yz",
    "PhaseTransition": "theory",
    "cooccurrence": "corpus",
    "from_dataset": "corpus",
    "CooccurrenceStats": "corpus",
    "TokenGroups": "groups",
    "TokenKind": "kinds",
    "plan_recording": "plan",
    "record_checkpoint": "record",
    "Recorder": "recorder",
    "record_trajectory": "recorder",
    "Trajectory": "trajectory",
    "attention_only_model": "train",
    "tutorial_model": "tutorial",
    "position_entropy": "record",
    "write_report": "report",
    "read_tokens": "tokens",
    "save_tokens": "tokens",
}
_MODULES = {  # every public module, so that ``ss.<module>`` never depends on import order
    "backend",
    "checkpoints",
    "classify",
    "context",
    "corpus",
    "demo",
    "distributed",
    "fit",
    "formats",
    "groups",
    "heads",
    "indexed",
    "kinds",
    "lab",
    "labels",
    "measure",
    "plan",
    "population",
    "record",
    "recorder",
    "report",
    "synthetic",
    "testing",
    "text",
    "theory",
    "tokens",
    "train",
    "trajectory",
    "tutorial",
    "viz",
    "yz",
}

__all__ = sorted(set(_NAMES) | _MODULES)


def __getattr__(name: str):
    if name in _NAMES:
        module = importlib.import_module(f".{_NAMES[name]}", __name__)
        return getattr(module, name)
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'scansnap_lens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
