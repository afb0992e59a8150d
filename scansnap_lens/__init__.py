"""scansnap_lens: Scan and Snap instruments for TransformerLens models.

The main path: statistics of the training corpus, a recording of the checkpoints, the
analysis measured once, the report::

    import scansnap_lens as ss

    stats = ss.CooccurrenceStats.load("stats.safetensors")  # `scansnap stats CORPUS`
    source = ss.pretrained("EleutherAI/pythia-70m", steps="log:20")  # or ss.folder(...)
    traj = ss.record_trajectory(source, tokens, "run", stats=stats)  # tokens: [N, T] rows
    analysis = ss.Analysis.of(traj, source=stats)  # every measurement, once
    ss.write_report(analysis, "run/report")  # the page, summary.json and CSVs
    analysis.summary  # one row per layer and head

While a model trains, ``ss.Live`` puts the same figures into the trainer's own loggers.
The names a notebook needs are here, imported on first use::

    result = ss.run_demo("demo_out")  # train, record, measure, report
    ss.viz.attention_over_checkpoints(result.trajectory)  # circuitsvis, inline

The folders follow the pipeline, each stage importing only the ones before it:

    inputs/       text, token files and tokenizers, Pythia's indexed datasets
    models/       TransformerLens backends, checkpoint formats and sources, training
    statistics/   corpus co-occurrence, the context convention, token kinds and groups
    recording/    hooks, the recording plan, the recorder, trajectories
    theory/       the paper's predictions: the phase transition, population dynamics
    measures/     one module per quantity: scan, frequency bias, sparsity, growth, snap
    planning/     where and how much to record: checkpoint placement, planned power
    reading/      what the measurements say: the analysis value, findings, heads, runs
    viz/          figures (PNG) and circuitsvis views
    lab/          the paper's synthetic experiments (sequence classes, the Y/Z model)
    report, cli, demo, distributed (Ray): built on all of these
"""

from __future__ import annotations

from scansnap_lens._lazy import exports

__version__ = "0.1.0"

_CHOSEN = {  # what a notebook needs at the top, by the module that defines it
    "inputs.corpus": "Corpus",
    "inputs.tokens": "load_tokenizer read_tokens save_tokens",
    "models.checkpoints": "folder pretrained",
    "models.training": "attention_only_model train",
    "models.tutorial": "tutorial_model",
    "statistics.context": "Context",
    "statistics.corpus": "CooccurrenceStats cooccurrence count_corpus",
    "statistics.groups": "Classification TokenGroups",
    "statistics.kinds": "TokenKind token_kinds",
    "recording.hooks": "record_checkpoint",
    "recording.plan": "plan_recording",
    "recording.recorder": "Recorder record_trajectory",
    "recording.settings": "RecordingSettings",
    "recording.trajectory": "Trajectory",
    "theory.transition": "PhaseTransition",
    "reading.analysis": "Analysis",
    "measures.settings": "AnalysisSettings",
    "reading.live": "Live LiveSettings",
    "measures.entropy": "position_entropy",
    "reading.runs": "measure_runs",
    "measures.summary": "summarize",
    "measures.uncertainty": "scan_uncertainty",
    "lab.synthetic": "sequence_classes sequence_sampler syn_medium syn_small",
    "lab.yz": "train_yz",
    "report": "write_report write_runs_report",
    "demo": "run_demo",
}
# ``ss.<module>`` for each stage and tool, never dependent on import order
_MODULES = (
    "inputs models statistics recording theory measures planning reading viz lab"
    " report demo distributed"
)
__all__, __getattr__, __dir__ = exports(__name__, _MODULES, _CHOSEN)
