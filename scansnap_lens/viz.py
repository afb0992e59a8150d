"""Static figures (matplotlib, saved as PNG) for the lab and its theory.

Each function takes library results and returns a matplotlib ``Figure``; pass ``path`` to
save it as a file as well.  In a notebook the returned figure renders inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .theory import PhaseTransition
from .yz import YZRun

__all__ = [
    "plot_attention_heatmap",
    "plot_attention_maps",
    "plot_entropy_sweep",
    "plot_growth_factor",
    "plot_loss",
    "plot_over_steps",
]


def _finish(fig: Figure, path: str | Path | None) -> Figure:
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def plot_attention_heatmap(
    run: YZRun, run_index: int = 0, title: str = "", path: str | Path | None = None
) -> Figure:
    """Fig. 4 layout: c_n over steps for every class, its common tokens then its distinct
    tokens (in index order, so P(l|n) grows to the right)."""
    classes = run.classes
    attention = run.attention()[:, run_index]  # [S, K, M]
    common = classes.common_mask()
    owner = classes.distinct_for()
    names = classes.token_labels()
    fig = Figure(figsize=(8, 1.6 + 1.4 * classes.num_classes))
    axes = fig.subplots(classes.num_classes, 1)
    axes = np.atleast_1d(axes)
    steps = run.steps.numpy()
    for k, ax in enumerate(axes):
        cols = np.concatenate([common.nonzero().flatten(), (owner == k).nonzero().flatten()])
        data = attention[:, k, cols].T.numpy()
        im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.axhline(int(common.sum()) - 0.5, color="white", lw=1)
        ax.set_yticks(range(len(cols)), [names[c] for c in cols], fontsize=6)
        ticks = np.linspace(0, len(steps) - 1, min(len(steps), 6)).round().astype(int)
        ax.set_xticks(ticks, steps[ticks])
        ax.set_ylabel(f"class {k}\ncommon | distinct")
        fig.colorbar(im, ax=ax, fraction=0.03)
    axes[-1].set_xlabel("step")
    axes[0].set_title(title or "per-token attention $c_n$ over training")
    return _finish(fig, path)


def plot_loss(runs: dict[str, YZRun], path: str | Path | None = None) -> Figure:
    """Training loss of run 0 of each labelled run, log scale."""
    fig = Figure(figsize=(5, 3.2))
    ax = fig.subplots()
    for label, run in runs.items():
        ax.plot(np.arange(run.loss.shape[0]), run.loss[:, 0].numpy(), label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend(fontsize=8)
    return _finish(fig, path)


def plot_growth_factor(
    theories: Sequence[PhaseTransition], t: np.ndarray, path: str | Path | None = None
) -> Figure:
    """Fig. 3: the growth factor bound exp(2 eta_Z int_0^t xi) with the snap time t0 dotted."""
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for theory in theories:
        (line,) = ax.plot(t, theory.chi_bounds(t)[1], label=rf"$\eta_Y$={theory.lr_y:g}")
        ax.axvline(theory.t0, color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("t (steps)")
    ax.set_ylabel(r"growth factor bound $e^{2 \eta_Z \int_0^t \xi_n}$")
    first = theories[0]
    ax.set_title(rf"K={first.K}, M={first.M}, $\eta_Z$={first.lr_z:g}; dotted: $t_0$")
    ax.legend(fontsize=8)
    return _finish(fig, path)


def plot_entropy_sweep(summary: pd.DataFrame, path: str | Path | None = None) -> Figure:
    """Fig. 6: distinct-token entropy against eta_Y / eta_Z, a panel per num_last."""
    panels = sorted(summary["num_last"].unique())
    fig = Figure(figsize=(3.2 * len(panels), 3))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, q in zip(axes[0], panels):
        part = summary[summary["num_last"] == q]
        for lr_z, cell in part.groupby("lr_z"):
            cell = cell.sort_values("ratio")
            ax.errorbar(
                cell["ratio"],
                cell["entropy_mean"],
                cell["entropy_std"].fillna(0),
                label=rf"$\eta_Z$={lr_z:g}",
                capsize=2,
            )
        ax.set_xscale("log")
        ax.set_title(f"#last/next tokens = {q}/{2 * q}")
        ax.set_xlabel(r"$\eta_Y / \eta_Z$")
    axes[0][0].set_ylabel(r"entropy of $c_n$ on distinct tokens")
    axes[0][0].legend(fontsize=7)
    return _finish(fig, path)


def plot_over_steps(
    table: pd.DataFrame,
    column: str,
    by: Sequence[str] = ("layer", "head"),
    snaps: pd.DataFrame | None = None,
    title: str = "",
    path: str | Path | None = None,
) -> Figure:
    """A measurement table (step, layer, head, column) as one line per layer and head, steps on
    a log axis; with ``snaps`` (a `snapping` table) a marker at each head's snap step."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for key, part in table.groupby(list(by)):
        label = ", ".join(f"{b} {k}" for b, k in zip(by, np.atleast_1d(key)))
        line = ax.plot(part["step"] + 1, part[column], marker=".", label=label)[0]
        if snaps is not None:
            match = snaps
            for b, k in zip(by, np.atleast_1d(key)):
                match = match[match[b] == k]
            for s in match["snap_path"].dropna():
                ax.axvline(s + 1, color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("step + 1")
    ax.set_ylabel(column)
    ax.set_title(title or column)
    if table.groupby(list(by)).ngroups <= 12:
        ax.legend(fontsize=6)
    return _finish(fig, path)


def plot_attention_maps(
    patterns: Sequence[np.ndarray],
    steps: Sequence[int],
    tokens: Sequence[str] | None = None,
    title: str = "",
    path: str | Path | None = None,
) -> Figure:
    """Attention patterns [T, T] of one sequence at several checkpoints, side by side (Fig. 7)."""
    n = len(patterns)
    fig = Figure(figsize=(2.6 * n, 3.0))
    axes = np.atleast_1d(fig.subplots(1, n))
    for ax, pattern, step in zip(axes, patterns, steps):
        ax.imshow(pattern, cmap="viridis", vmin=0, vmax=max(float(np.max(pattern)), 1e-9))
        ax.set_title(f"step {step}", fontsize=8)
        if tokens is not None and len(tokens) <= 24:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=5)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=5)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    return _finish(fig, path)
