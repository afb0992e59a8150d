"""The paper's synthetic experiments (Sec. 8, App. G) as library calls: Figs. 4-6, 11-12."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from scansnap_lens._io import make_folder, write_text
from scansnap_lens.lab.synthetic import SequenceClasses, syn_medium
from scansnap_lens.lab.yz import YZRun, train_yz
from scansnap_lens.measures import restricted_entropy

__all__ = [
    "FIG6_LR_Z",
    "FIG6_NUM_LAST",
    "FIG6_RATIO",
    "FIG11_THRESHOLD_FACTORS",
    "LabTraining",
    "distinct_entropy",
    "distinct_recall",
    "entropy_sweep",
    "recall_sweep",
    "summarize_sweep",
    "syn_small_experiment",
]

FIG6_NUM_LAST = (1, 3, 5, 10)
FIG6_LR_Z = (0.5, 1.0, 2.0, 3.0)
FIG6_RATIO = (1.0, 2.0, 5.0, 10.0)
# Figs. 11-12 read recall at thresholds around 1/M
FIG11_THRESHOLD_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)


def distinct_entropy(run: YZRun, snapshot: int = -1) -> torch.Tensor:
    """[R, K] Fig. 6 metric at one snapshot: entropy of c_n over the distinct tokens of n."""
    classes: SequenceClasses = run.classes
    owner = classes.distinct_for()
    mask = owner[None, :] == torch.arange(classes.num_classes)[:, None]
    return restricted_entropy(run.attention()[snapshot], mask)


def distinct_recall(run: YZRun, thresholds, snapshot: int = -1) -> torch.Tensor:
    """[R, X] Figs. 11-12: for each threshold, the share of each class's distinct tokens whose
    attention c_n[l] exceeds it ("retrieved"), averaged over the classes.

    thresholds: [X], in the paper around 1/M.  A sparser attention keeps fewer distinct
    tokens above a given threshold, so its recall falls more slowly as the threshold grows
    past 1/M (few tokens hold most of the weight) and starts lower below it.
    """
    classes: SequenceClasses = run.classes
    owner = classes.distinct_for()
    mask = owner[None, :] == torch.arange(classes.num_classes)[:, None]  # [K, V]
    x = torch.as_tensor(thresholds, dtype=torch.float64)
    attention = run.attention()[snapshot].double()  # [R, K, V]
    retrieved = (attention[..., None] > x) & mask[..., None]  # [R, K, V, X]
    return (retrieved.sum(-2).double() / mask.sum(-1)[:, None]).mean(-2)


@dataclass(frozen=True)
class LabTraining:
    """How each run of a sweep trains (App. G's setting by default); saved beside its CSVs
    with `save` as ``training.json``.

    >>> LabTraining(num_steps=50).num_steps, LabTraining().optimizer
    (50, 'sgd')
    """

    seeds: int = 10
    num_steps: int = 100
    batch_size: int = 128
    seq_len: int = 128
    optimizer: str = "sgd"
    momentum: float = 0.9
    init: str = "uniform"

    def __post_init__(self):
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")

    def save(self, path: str | Path) -> Path:
        return write_text(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> LabTraining:
        return cls(**json.loads(Path(path).read_text()))


def _sweep(
    num_last: Sequence[int],
    lr_z: Sequence[float],
    ratio: Sequence[float],
    training: LabTraining,
    progress: bool,
    desc: str,
) -> Iterator[tuple[int, list[tuple[float, float, int]], YZRun]]:
    """Train the grid of Fig. 6 (and Figs. 11-12): for each ``num_last``, every (lr_z,
    ratio, seed) cell in one batched computation; seed s is the same initialisation and data
    stream in every cell (common random numbers).  Yields (num_last, cells, run)."""
    settings = {k: v for k, v in asdict(training).items() if k != "seeds"}
    for q in tqdm(list(num_last), desc=desc, disable=not progress):
        cells = list(itertools.product(lr_z, ratio, range(training.seeds)))
        run = train_yz(
            syn_medium(q),
            lr_z=[c[0] for c in cells],
            ratio=[c[1] for c in cells],
            seeds=[c[2] for c in cells],
            snapshot_every=0,
            **settings,
        )
        yield q, cells, run


def entropy_sweep(
    num_last: Sequence[int] = FIG6_NUM_LAST,
    lr_z: Sequence[float] = FIG6_LR_Z,
    ratio: Sequence[float] = FIG6_RATIO,
    *,
    training: LabTraining | None = None,
    progress: bool = True,
    **settings,
) -> pd.DataFrame:
    """The Fig. 6 grid on Syn-Medium: one row per (num_last, lr_z, ratio, seed).

    `training` (or its fields as keywords, ``seeds=3, num_steps=50``) says how each run trains.
    Column ``entropy`` is the final-step distinct-token entropy averaged over the classes.
    """
    training = replace(training or LabTraining(), **settings)
    rows = []
    for q, cells, run in _sweep(num_last, lr_z, ratio, training, progress, "Fig. 6 sweep"):
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


def recall_sweep(
    lr_z: Sequence[float],
    ratio: Sequence[float],
    threshold_factors: Sequence[float] = FIG11_THRESHOLD_FACTORS,
    num_last: int = 1,
    *,
    training: LabTraining | None = None,
    progress: bool = True,
    **settings,
) -> pd.DataFrame:
    """Figs. 11-12 on Syn-Medium: `distinct_recall` after training, one row per (lr_z, ratio,
    seed, threshold), thresholds ``factor / M``.  Fig. 11 varies ``ratio`` (eta_Y / eta_Z) at
    one eta_Z, Fig. 12 varies ``lr_z`` at one ratio; the paper averages 10 seeds.  `training`
    as in `entropy_sweep`.
    """
    training = replace(training or LabTraining(), **settings)
    rows = []
    for q, cells, run in _sweep([num_last], lr_z, ratio, training, progress, "Figs. 11-12"):
        thresholds = torch.tensor(threshold_factors, dtype=torch.float64) / run.classes.vocab_size
        recall = distinct_recall(run, thresholds)
        for i, (lz, r, s) in enumerate(cells):
            for j, x in enumerate(thresholds.tolist()):
                rows.append(
                    {
                        "num_last": q,
                        "lr_z": lz,
                        "ratio": r,
                        "seed": s,
                        "threshold": x,
                        "recall": recall[i, j].item(),
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
    num_steps: int = 100,
    seed: int = 0,
    prefix: str = "fig4",
) -> dict[str, YZRun]:
    """Fig. 4 / Fig. 5: train Syn-Small from zero init for each ``label -> (lr_z, ratio)``.

    Writes ``{prefix}_attention_{label}.png`` (the c_n heat maps), ``{prefix}_loss.png``,
    ``{prefix}_attention.csv`` and ``{prefix}_loss.csv`` to ``out``; returns the runs.
    """
    from scansnap_lens.lab.synthetic import syn_small
    from scansnap_lens.viz import plot_attention_heatmap, plot_loss

    out = Path(out)
    make_folder(out)
    runs, tables, losses = {}, [], []
    for label, (lr_z, ratio) in settings.items():
        run = train_yz(
            syn_small(),
            lr_z,
            ratio,
            optimizer=optimizer,
            init="zero",
            num_steps=num_steps,
            seeds=[seed],
        )
        runs[label] = run
        title = f"{optimizer.upper()} {label}: eta_Z={lr_z:g}, eta_Y={lr_z * ratio:g}"
        plot_attention_heatmap(run, title=title, path=out / f"{prefix}_attention_{label}.png")
        tables.append(run.attention_dataframe().assign(setting=label, lr_z=lr_z, ratio=ratio))
        losses.append(run.to_dataframe().assign(setting=label))
    plot_loss(runs, path=out / f"{prefix}_loss.png")
    write_text(out / f"{prefix}_attention.csv", pd.concat(tables).to_csv(index=False))
    write_text(out / f"{prefix}_loss.csv", pd.concat(losses).to_csv(index=False))
    return runs
