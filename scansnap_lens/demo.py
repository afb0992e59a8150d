"""The main job end to end on an embedded default: `run_demo` (the README's `scansnap demo`
says what it trains, records and measures, and what ``data="syn-small"`` shows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from scansnap_lens._io import write_text
from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium, syn_small
from scansnap_lens.models.training import Rates, TrainResult, attention_only_model, train
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.report import Report, write_report
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["DEMO_DATA", "DemoResult", "run_demo"]

DEMO_DATA = {"syn-medium": lambda: syn_medium(1), "syn-small": syn_small}


@dataclass
class DemoResult:
    """What the demo made: the training run, statistics, token groups, trajectory, its
    analysis and report."""

    training: TrainResult
    stats: CooccurrenceStats
    groups: TokenGroups
    trajectory: Trajectory
    analysis: Analysis
    report: Report

    @property
    def summary(self) -> pd.DataFrame:
        return self.report.summary


def run_demo(
    out: str | Path = "demo_out",
    data: str = "syn-medium",
    num_steps: int = 250,
    lr_y: float | None = None,
    lr_z: float | None = None,
    save_steps: str = "log:15",
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    optimizer: str = "sgd",
    momentum: float = 0.0,
) -> DemoResult:
    """Train, record, measure and report into `out` (``out/report/report.html``).

    `lr_y` is eta_Y (every parameter but W_Q, W_K; default 0.1), `lr_z` eta_Z (default 3);
    `optimizer` "sgd" (with `momentum`) or "adam".  A folder that holds a demo of other
    settings is refused unless `overwrite`."""
    if data not in DEMO_DATA:
        raise ValueError(f"data must be one of {sorted(DEMO_DATA)}, got {data!r}")
    rates = Rates.of(lr_y, lr_z, optimizer, momentum, default_y=0.1, default_z=3.0)
    lr_y, lr_z = rates.lr_y, rates.lr_z
    out = Path(out)
    classes = DEMO_DATA[data]()
    sample = sequence_sampler(classes)
    vocab = classes.vocab_size
    queries = classes.query.unique().tolist()

    corpus = sample(512, torch.Generator().manual_seed(seed + 1))  # the training distribution
    stats = cooccurrence(corpus, vocab, queries=queries)
    # distinct = seen with one next token only, across queries (Sec. 3.2: global scope)
    groups = TokenGroups.from_statistics(stats, min_distinct=1, scope="global")

    eval_tokens = sample(64, torch.Generator().manual_seed(seed + 2))
    plan = plan_recording(eval_tokens, vocab, queries=queries, exclude_bos=False)
    plan.token_strings = dict(enumerate(classes.token_labels()))
    model = attention_only_model(
        vocab, d_model=32, n_heads=1, n_ctx=64, seed=seed, normalization_type=None
    )
    recorder = Recorder(
        out / "trajectory",
        eval_tokens,
        RecordingSettings(progress=False, overwrite=overwrite),
        plan,
        meta={
            "data": data,
            "num_steps": num_steps,
            "seed": seed,
            "save_steps": save_steps,
            "model": "1-layer attn-only",
        },  # train adds the rates
    )
    training = train(
        model,
        sample,
        num_steps=num_steps,
        lr_y=lr_y,
        lr_z=lr_z,
        optimizer=optimizer,
        momentum=momentum,
        batch_size=64,
        save_steps=save_steps,
        loss_on="last",
        seed=seed,
        progress=progress,
        on_checkpoint=recorder.on_checkpoint,
    )
    recorder.close()  # recorded: the report reads a finished run, not one still recording
    trajectory = recorder.trajectory()
    # the training meta says the loss is on each row's last position
    analysis = Analysis.of(trajectory, groups, source=stats)
    report = write_report(
        analysis, out / "report", title=f"scansnap_lens demo: {data}, {num_steps} steps"
    )
    write_text(out / "report" / "loss.csv", training.to_dataframe().to_csv(index=False))
    return DemoResult(training, stats, groups, trajectory, analysis, report)
