"""scansnap_lens: Scan and Snap instruments for TransformerLens models.

The names a notebook needs are here, imported on first use::

    import scansnap_lens as ss

    result = ss.run_demo("demo_out")  # train, record, measure, report
    result.summary  # one row per layer and head
    ss.viz.attention_over_checkpoints(result.trajectory)  # circuitsvis, inline

The folders follow the pipeline, each stage importing only the ones before it:

    inputs/       text, token files and tokenizers, Pythia's indexed datasets
    models/       TransformerLens backends, checkpoint formats and sources, training
    statistics/   corpus co-occurrence, the context convention, token kinds and groups
    recording/    hooks, the recording plan, the recorder, trajectories
    theory/       the paper's predictions: the phase transition, population dynamics
    measures/     one module per quantity: scan, frequency bias, sparsity, growth, snap
    viz/          figures (PNG) and circuitsvis views
    lab/          the paper's synthetic experiments (sequence classes, the Y/Z model)
    report, cli, demo, distributed (Ray), testing: built on all of these
"""

from __future__ import annotations

from scansnap_lens._lazy import exports

__version__ = "0.1.0"

_NAMES = {
    "run_demo": "demo",
    "sequence_sampler": "lab.synthetic",
    "syn_small": "lab.synthetic",
    "syn_medium": "lab.synthetic",
    "sequence_classes": "lab.synthetic",
    "train_yz": "lab.yz",
    "PhaseTransition": "theory.transition",
    "cooccurrence": "statistics.corpus",
    "count_corpus": "statistics.corpus",
    "Corpus": "inputs.corpus",
    "CooccurrenceStats": "statistics.corpus",
    "Context": "statistics.context",
    "token_kinds": "statistics.kinds",
    "TokenGroups": "statistics.groups",
    "Classification": "statistics.groups",
    "scan_uncertainty": "measures.uncertainty",
    "TokenKind": "statistics.kinds",
    "plan_recording": "recording.plan",
    "record_checkpoint": "recording.hooks",
    "position_entropy": "measures.entropy",
    "Recorder": "recording.recorder",
    "RecordingSettings": "recording.settings",
    "record_trajectory": "recording.recorder",
    "Trajectory": "recording.trajectory",
    "attention_only_model": "models.training",
    "train": "models.training",
    "tutorial_model": "models.tutorial",
    "summarize": "measures.summary",
    "write_report": "report",
    "write_runs_report": "report",
    "measure_runs": "measures.runs",
    "folder": "models.checkpoints",
    "pretrained": "models.checkpoints",
    "load_tokenizer": "inputs.tokens",
    "read_tokens": "inputs.tokens",
    "save_tokens": "inputs.tokens",
}
# ``ss.<module>`` for each stage and tool, never dependent on import order
_MODULES = (
    "inputs models statistics recording theory measures lab viz report demo distributed testing"
)
__all__, __getattr__, __dir__ = exports(__name__, _MODULES, _NAMES)
