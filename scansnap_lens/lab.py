"""The paper's synthetic experiments (Sec. 8) as library calls: Fig. 4-6 and their numbers."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from .measure import restricted_entropy
from .synthetic import SequenceClasses, syn_medium
from .yz import YZRun, train_yz

__all__ = ["distinct_entropy", "entropy_sweep", "summarize_sweep", "syn_small_experiment"]

FIG6_NUM_LAST = (1, 3, 5, 10)
FIG6_LR_Z = (0.5, 1.0, 2.0, 3.0)
FIG6_RATIO = (1.0, 2.0, 5.0, 10.0)


def distinct_entropy(run: YZRun, snapshot: int = -1) -> torch.Tensor:
    """[R, K] Fig. 6 metric at one snapshot: entropy of c_n over the distinct tokens of n."""
    classes: SequenceClasses = run.classes
    owner = classes.distinct_for()
    mask = owner[None, :] == torch.arange(classes.num_classes)[:, None]
    return restricted_entropy(run.attention()[snapshot], mask)


def entropy_sweep(
    num_last: Sequence[int] = FIG6_NUM_LAST,
    lr_z: Sequence[float] = FIG6_LR_Z,
    ratio: Sequence[float] = FIG6_RATIO,
    seeds: int = 10,
    steps: int = 100,
    batch_size: int = 128,
    seq_len: int = 128,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    init: str = "uniform",
    progress: bool = True,
) -> pd.DataFrame:
    """The Fig. 6 grid on Syn-Medium: one row per (num_last, lr_z, ratio, seed).

    All cells and seeds of one ``num_last`` train together in one batched computation; seed
    s is the same initialisation and data stream in every cell (common random numbers).
    Column ``entropy`` is the final-step distinct-token entropy averaged over the classes.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    rows = []
    for q in tqdm(list(num_last), desc="Fig. 6 sweep (num_last)", disable=not progress):
        cells = list(itertools.product(lr_z, ratio, range(seeds)))
        run = train_yz(
            syn_medium(q),
            lr_z=[c[0] for c in cells],
            ratio=[c[1] for c in cells],
            seeds=[c[2] for c in cells],
            optimizer=optimizer,
            momentum=momentum,
            init=init,
            batch_size=batch_size,
            seq_len=seq_len,
            steps=steps,
            snapshot_every=0,
        )
        entropy = distinct_entropy(run).mean(-1)
        final_loss = run.loss[-1]
        for i, (lz, r, s) in enumerate(cells):
            rows.append(
                {
                    "num_last": q,
                    "lr_z": lz,
                    "ratio": r,
                    "seed": s,
                    "entropy": entropy[i].item(),
                    "final_loss": final_loss[i].item(),
                }
            )
    return pd.DataFrame(rows)


def summarize_sweep(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation over seeds for each (num_last, lr_z, ratio)."""
    grouped = per_seed.groupby(["num_last", "lr_z", "ratio"])["entropy"]
    out = grouped.agg(entropy_mean="mean", entropy_std="std", n_seeds="count").reset_index()
    return out[["num_last", "lr_z", "ratio", "entropy_mean", "entropy_std", "n_seeds"]]


def syn_small_experiment(
    settings: dict[str, tuple[float, float]],
    out: str | Path,
    optimizer: str = "sgd",
    steps: int = 100,
    seed: int = 0,
    prefix: str = "fig4",
) -> dict[str, YZRun]:
    """Fig. 4 / Fig. 5: train Syn-Small from zero init for each ``label -> (lr_z, ratio)``.

    Writes ``{prefix}_attention_{label}.png`` (the c_n heat maps), ``{prefix}_loss.png``,
    ``{prefix}_attention.csv`` and ``{prefix}_loss.csv`` to ``out``; returns the runs.
    """
    from .synthetic import syn_small
    from .viz import plot_attention_heatmap, plot_loss

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs, tables, losses = {}, [], []
    for label, (lr_z, ratio) in settings.items():
        run = train_yz(
            syn_small(), lr_z, ratio, optimizer=optimizer, init="zero", steps=steps, seeds=[seed]
        )
        runs[label] = run
        title = f"{optimizer.upper()} {label}: eta_Z={lr_z:g}, eta_Y={lr_z * ratio:g}"
        plot_attention_heatmap(run, title=title, path=out / f"{prefix}_attention_{label}.png")
        tables.append(run.attention_dataframe().assign(setting=label, lr_z=lr_z, ratio=ratio))
        losses.append(run.to_dataframe().assign(setting=label))
    plot_loss(runs, path=out / f"{prefix}_loss.png")
    pd.concat(tables).to_csv(out / f"{prefix}_attention.csv", index=False)
    pd.concat(losses).to_csv(out / f"{prefix}_loss.csv", index=False)
    return runs
