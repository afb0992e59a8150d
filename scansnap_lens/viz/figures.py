"""Static figures (matplotlib, saved as PNG) of trajectories, measurements, the lab and theory.

Each function takes library results and returns a matplotlib ``Figure``; pass ``path`` to
save it as a file as well.  In a notebook the returned figure renders inline.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from scansnap_lens._io import make_folder, write_bytes
from scansnap_lens.measures import Measurement
from scansnap_lens.measures.catalog import columns
from scansnap_lens.measures.rates import theory_of
from scansnap_lens.reading.runs import median_bounds
from scansnap_lens.recording.hooks import LOSS_TOKENS
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.theory.transition import PhaseTransition
from scansnap_lens.viz import _palette as palette
from scansnap_lens.viz.views import prompt_pattern, spread_steps

if TYPE_CHECKING:  # the lab draws its runs with these figures, so viz comes before it
    from scansnap_lens.lab.yz import YZRun
    from scansnap_lens.reading.analysis import Analysis

__all__ = [
    "plot_attention_heatmap",
    "plot_attention_maps",
    "plot_class_attention",
    "plot_entropy_sweep",
    "plot_growth_bounds",
    "plot_growth_factor",
    "plot_head_grid",
    "plot_logit_change",
    "plot_loss",
    "plot_loss_with_steps",
    "plot_over_steps",
    "plot_prompt_maps",
    "plot_run_loss",
    "plot_run_theory",
    "plot_runs",
    "plot_runs_maps",
    "plot_theory_fit",
    "run_figures",
    "shown_classes",
]


def _save(fig: Figure, path: str | Path, **kwargs) -> None:
    """PNG through the atomic writer: a full disk never leaves half a figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png", **kwargs)
    make_folder(Path(path).parent)
    write_bytes(path, buffer.getvalue())


# inches around a figure of one axes: a tick label of 7 characters, the axis label and the
# title; every such figure shares them, so none pays a layout pass (a draw) of its own
MARGINS = {"left": 0.9, "right": 0.2, "bottom": 0.55, "top": 0.4, "top_untitled": 0.15}


def _one_axes(size: tuple[float, float]):
    """A figure of `size` inches with one axes at the shared `MARGINS`: (fig, ax)."""
    (w, h), m = size, MARGINS
    fig = Figure(figsize=size)
    fig.subplots_adjust(
        left=m["left"] / w, right=1 - m["right"] / w, bottom=m["bottom"] / h, top=1 - m["top"] / h
    )
    return fig, fig.subplots()


def _finish(fig: Figure, path: str | Path | None, laid_out: bool = False) -> Figure:
    if not laid_out:
        fig.tight_layout()
    elif not any(ax.get_title() for ax in fig.axes):  # no room kept for a title
        fig.subplots_adjust(top=1 - MARGINS["top_untitled"] / fig.get_figheight())
    if path is not None:
        _save(fig, path)
    return fig


LABELLED = 40  # most tokens of a class whose names `plot_class_attention` writes


def plot_class_attention(
    traj: Trajectory,
    groups: TokenGroups,
    layer: int | None = None,
    head: int | None = None,
    classes: Sequence[int] | None = None,
    title: str = "",
    path: str | Path | None = None,
) -> Figure:
    """Fig. 4 layout: c_hat over checkpoints for each class (a panel per class), its query's
    common tokens on top, then its distinct tokens by increasing P(l|m, n).

    classes: indices into `groups` (default: the first four); layer, head: default the first
    ones recorded.
    """
    layer = traj.layers[0] if layer is None else layer
    head = traj.heads[0] if head is None else head
    li, hi = traj.layers.index(layer), traj.heads.index(head)
    classes = list(range(min(groups.num_classes, 4))) if classes is None else list(classes)
    if not classes:
        raise ValueError("no class to show: the token groups are empty")
    panels = []  # (m, n, class slot, common rows, all rows) of each class
    for k in classes:
        m, n = int(groups.query[k]), int(groups.next_token[k])
        c = traj.class_slot(m, n)
        if c is None:
            raise ValueError(f"class (query {m}, next {n}) is not tracked by this trajectory")
        tokens_of_class = traj.plan.triple_token[traj.plan.triple_class == c]
        common = groups.common.get(m, torch.empty(0, dtype=torch.long))
        common = common[torch.isin(common, tokens_of_class)]
        order = torch.argsort(groups.distinct_p[k], stable=True)
        panels.append((m, n, c, common.numel(), torch.cat([common, groups.distinct[k][order]])))
    # a readable 9-point label per token where a panel shows at most LABELLED tokens
    heights = [max(1.4, 0.15 * len(p[4]) + 0.5) if len(p[4]) <= LABELLED else 2.0 for p in panels]
    fig = Figure(figsize=(8, 1.0 + sum(heights)))
    axes = np.atleast_1d(fig.subplots(len(panels), 1, gridspec_kw={"height_ratios": heights}))
    steps = traj.steps.numpy()
    for (m, n, c, num_common, rows), ax in zip(panels, axes):
        data = traj.class_attention(c, rows)[:, li, hi].T.numpy()  # [rows, S]
        im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.axhline(num_common - 0.5, color="white", lw=1)
        if rows.numel() <= LABELLED:
            ax.set_yticks(range(rows.numel()), [traj.plan.decode(t) for t in rows], fontsize=9)
            for i, label in enumerate(ax.get_yticklabels()):
                label.set_color(palette.COMMON if i < num_common else palette.DISTINCT)
        ticks = np.linspace(0, len(steps) - 1, min(len(steps), 6)).round().astype(int)
        ax.set_xticks(ticks, steps[ticks])
        ax.set_ylabel(f"{traj.plan.decode(m)} -> {traj.plan.decode(n)}\ncommon | distinct")
        fig.colorbar(im, ax=ax, fraction=0.03)
    axes[-1].set_xlabel(traj.step_unit)
    axes[0].set_title(title or f"per-token attention over training (layer {layer}, head {head})")
    return _finish(fig, path)


def plot_attention_heatmap(
    run: YZRun, run_index: int = 0, title: str = "", path: str | Path | None = None
) -> Figure:
    """Fig. 4 for a Y/Z run: `plot_class_attention` of every class of its trajectory."""
    groups = TokenGroups.from_synthetic(run.classes)
    traj = run.to_trajectory()
    return plot_class_attention(
        traj,
        groups,
        head=run_index,
        classes=range(groups.num_classes),
        title=title or "per-token attention $c_n$ over training",
        path=path,
    )


def plot_logit_change(bias: Measurement, title: str = "", path: str | Path | None = None) -> Figure:
    """The scan: mean logit change dz of distinct (solid, blue) and common (dashed, red) tokens
    over steps (a `discriminative_bias` result); with several heads one small panel per head,
    layers down and heads across, on one y scale, so that every head can be told apart."""
    table = bias.table
    layers, heads = sorted(table["layer"].unique()), sorted(table["head"].unique())
    single = len(layers) * len(heads) == 1
    size = (6, 3.6) if single else (min(1.7 * len(heads) + 0.8, 22), min(1.3 * len(layers) + 1, 22))
    fig = Figure(figsize=size)
    axes = np.atleast_2d(
        fig.subplots(len(layers), len(heads), sharex=True, sharey=True, squeeze=False)
    )
    for (layer, head), part in table.groupby(["layer", "head"]):
        ax = axes[layers.index(layer), heads.index(head)]
        width = 1.5 if single else 0.9
        ax.plot(
            part["step"] + 1,
            part["dz_distinct"],
            color=palette.DISTINCT,
            lw=width,
            label="distinct",
        )
        ax.plot(
            part["step"] + 1,
            part["dz_common"],
            color=palette.COMMON,
            ls="--",
            lw=width,
            label="common",
        )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xscale("log")
        if not single:
            ax.set_title(f"L{layer} H{head}", fontsize=7, pad=2)
            ax.tick_params(labelsize=6)
    if single:
        axes[0, 0].set_xlabel("step + 1")
        axes[0, 0].set_ylabel(r"$\Delta \bar z$ since the first checkpoint")
        axes[0, 0].legend(fontsize=7)
    else:
        fig.supxlabel("step + 1", fontsize=8)
        fig.supylabel(r"$\Delta \bar z$ since the first checkpoint", fontsize=8)
        axes[0, 0].legend(fontsize=6)
    fig.suptitle(title or "logit change: distinct (solid) vs common (dashed)", fontsize=9)
    return _finish(fig, path)


def plot_loss(runs: dict[str, YZRun], path: str | Path | None = None) -> Figure:
    """Training loss of run 0 of each labelled run, log scale."""
    fig, ax = _one_axes((5, 3.2))
    for label, run in runs.items():
        ax.plot(np.arange(run.loss.shape[0]), run.loss[:, 0].numpy(), label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend(fontsize=8)
    return _finish(fig, path, laid_out=True)


def plot_loss_with_steps(
    curves: dict[str, tuple[Sequence[float], Sequence[float]]],
    marks: dict[str, float | tuple[float, float, float]],
    step_unit: str = "steps",
    path: str | Path | None = None,
) -> Figure:
    """Loss over training, `curves` {label: (steps, losses)} (the recorded evaluation loss
    with its checkpoints as points, a training log's loss as a line), with the steps of
    `marks` {label: step, or (step, lo, hi): its interval shaded} (snap and formation steps)
    as vertical lines: does attention snap where the loss drops (the induction bump)?"""
    if not any(np.isfinite(np.asarray(y, dtype=float)).any() for _, y in curves.values()):
        raise ValueError("no loss was recorded or logged (folders recorded before it was)")
    fig, ax = _one_axes((7, 3.4))
    for i, (label, (x, y)) in enumerate(curves.items()):
        y = np.asarray(y, dtype=float)
        dots = "o-" if len(y) <= 200 else "-"
        ax.plot(
            np.asarray(x, dtype=float),
            y,
            dots,
            label=label,
            color=f"C{i % 10}",
            markersize=3,
            linewidth=1.2,
        )
    for j, (label, mark) in enumerate(marks.items()):
        step, *interval = np.atleast_1d(np.asarray(mark, dtype=float))
        color = f"C{(j + len(curves)) % 10}"
        ax.axvline(
            step,
            color=color,
            linestyle="--" if "snap" in label else ":",
            linewidth=1.2,
            label=label,
        )
        if interval and np.isfinite(interval).all():  # where the checkpoints place it
            ax.axvspan(*interval, color=color, alpha=0.08, linewidth=0)
    ax.set_xlabel(step_unit)
    ax.set_ylabel("loss (nats per token)")
    if all(min(np.asarray(x, dtype=float)) > 0 for x, _ in curves.values()):
        ax.set_xscale("log")
    ax.legend(fontsize=7, loc="upper right")
    return _finish(fig, path, laid_out=True)


def plot_growth_factor(
    theories: Sequence[PhaseTransition],
    t: np.ndarray,
    path: str | Path | None = None,
    measured: Sequence[float | None] = (),
) -> Figure:
    """Fig. 3: the growth factor bound exp(2 eta_Z int_0^t xi) with the snap time t0 dotted;
    ``measured`` (one per theory) adds a measured snap step, dashed."""
    fig, ax = _one_axes((5.5, 3.6))
    measured = list(measured) + [None] * (len(theories) - len(measured))
    for theory, snap in zip(theories, measured):
        (line,) = ax.plot(t, theory.chi_bounds(t)[1], label=rf"$\eta_Y$={theory.lr_y:g}")
        ax.axvline(theory.t0, color=line.get_color(), ls=":", lw=1)
        if snap is not None and np.isfinite(snap):
            ax.axvline(snap, color=line.get_color(), ls="--", lw=1, label="measured snap")
    ax.set_xscale("log")
    ax.set_xlabel("t (steps)")
    ax.set_ylabel(r"growth factor bound $e^{2 \eta_Z \int_0^t \xi_n}$")
    first = theories[0]
    ax.set_title(rf"K={first.K}, M={first.M}, $\eta_Z$={first.lr_z:g}; dotted: $t_0$", fontsize=9)
    ax.legend(fontsize=8)
    return _finish(fig, path, laid_out=True)


def plot_growth_bounds(
    table: pd.DataFrame, most: int = 6, path: str | Path | None = None
) -> Figure:
    """Theorem 3: the measured growth factor chi (solid) of each head inside the band of its
    bounds [exp(2 f0^2 B), exp(2 B)] (shaded), over steps; a `fit.growth_bounds` table."""
    fig, ax = _one_axes((6, 3.6))
    for i, (key, part) in enumerate(table.groupby(["layer", "head"])):
        if i >= most:
            break
        x = part["step"] + 1
        (line,) = ax.plot(x, part["chi"], marker=".", label=f"layer {key[0]}, head {key[1]}")
        ax.fill_between(
            x, part["chi_lower"], part["chi_upper"], color=line.get_color(), alpha=0.15, lw=0
        )
        ax.plot(x, part["chi_upper"], color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step + 1")
    ax.set_ylabel(r"$\chi_{l_0}$ (geometric mean over classes)")
    ax.set_title("growth factor: measured (solid) and Theorem 3 bounds (band)", fontsize=9)
    ax.legend(fontsize=6)
    return _finish(fig, path, laid_out=True)


def plot_theory_fit(table: pd.DataFrame, path: str | Path | None = None) -> Figure:
    """Each head against the population dynamics on its corpus's statistics, over steps: rank
    agreement of predicted and measured attention, and the logit-change correlation (a
    `fit.theory_fit` table)."""
    fig = Figure(figsize=(9, 3.4))
    axes = fig.subplots(1, 2)
    for ax, column in zip(axes, ["rank_agreement", "dz_corr"]):
        for key, part in table.groupby(["layer", "head"]):
            ax.plot(part["step"] + 1, part[column], marker=".", label=f"L{key[0]} H{key[1]}")
        ax.set_xscale("log")
        ax.set_ylim(-1.05, 1.05)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("step + 1")
        ax.set_title(column)
    if table.groupby(["layer", "head"]).ngroups <= 12:
        axes[1].legend(fontsize=6)
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
    limits: tuple[float, float] | None = None,
) -> Figure:
    """A measurement table (step, layer, head, column) as one line per layer and head, steps on
    a log axis; with ``snaps`` (a `snapping` table) a marker at each head's snap step; `limits`
    the value axis's (a share of attention: (0, 1), so that a change of 0.0004 is not drawn
    as a cliff).  ValueError where the column holds no number (nothing was measured)."""
    if column not in table or not table[column].notna().any():
        raise ValueError(f"{column} is not measured at any checkpoint: nothing to draw")
    fig, ax = _one_axes((6, 3.6))
    for key, part in table.groupby(list(by)):
        label = ", ".join(f"{b} {k}" for b, k in zip(by, np.atleast_1d(key)))
        line = ax.plot(part["step"] + 1, part[column], marker=".", label=label)[0]
        if snaps is not None:
            match = snaps
            for b, k in zip(by, np.atleast_1d(key)):
                match = match[match[b] == k]
            for s in match["snap_step"].dropna():
                ax.axvline(s + 1, color=line.get_color(), ls=":", lw=1)
            if "snap_step_grid_lo" in match:  # the checkpoints that bracket it
                for a, b in match[["snap_step_grid_lo", "snap_step_grid_hi"]].dropna().values:
                    ax.axvspan(a + 1, b + 1, color=line.get_color(), alpha=0.06, lw=0)
    ax.set_xscale("log")
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("step + 1")
    ax.set_ylabel(column)
    ax.set_title(title or column)
    if table.groupby(list(by)).ngroups <= 12:
        ax.legend(fontsize=6)
    return _finish(fig, path, laid_out=True)


def plot_attention_maps(
    patterns: Sequence[np.ndarray],
    steps: Sequence[int],
    tokens: Sequence[str] | None = None,
    title: str = "",
    path: str | Path | None = None,
) -> Figure:
    """Attention patterns [T, T] of one sequence at several checkpoints, side by side (Fig. 7):
    query position down, key position across, one colour scale for all (the bar)."""
    n = len(patterns)
    fig = Figure(figsize=(2.6 * n + 0.8, 3.2))
    axes = np.atleast_1d(fig.subplots(1, n))
    top = max(max(float(np.max(p)) for p in patterns), 1e-9)
    for i, (ax, pattern, step) in enumerate(zip(axes, patterns, steps)):
        image = ax.imshow(pattern, cmap="viridis", vmin=0, vmax=top, interpolation="nearest")
        ax.set_title(f"step {step}", fontsize=10)
        if tokens is not None and len(tokens) <= 24:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=8)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
        else:
            ax.tick_params(labelsize=9)
            ax.set_xlabel("key position", fontsize=10)
            if i == 0:
                ax.set_ylabel("query position", fontsize=10)
    fig.colorbar(image, ax=list(axes), fraction=0.02, pad=0.02, label="attention")
    if title:
        fig.suptitle(title, fontsize=11)
    if path is not None:  # tight_layout does not place a colour bar shared by several axes
        _save(fig, path, bbox_inches="tight")
    return fig


def plot_head_grid(
    summary: pd.DataFrame,
    layers: Sequence[int],
    heads: Sequence[int],
    columns: Sequence[str] = ("bias", "auroc", "snap_step", "attention_entropy"),
    path: str | Path | None = None,
    per_row: int = 4,
) -> Figure:
    """[layer, head] heat maps of summary columns, `per_row` maps a row: where in the model the
    scan and snap are.  A head the summary says ``scans`` (`measures.uncertainty`) is ringed in
    white; a cell without a value (a head not yet snapped) is grey with a dash."""
    from scansnap_lens.reading.heads import head_grid

    columns = [c for c in columns if c in summary]
    if not columns:
        raise ValueError("the summary has none of the columns to map")
    across = min(per_row, len(columns))
    down = -(-len(columns) // across)
    fig = Figure(figsize=(3.2 * across, (0.5 * len(layers) + 2.2) * down))
    axes = np.atleast_1d(fig.subplots(down, across)).ravel()
    for ax in axes[len(columns) :]:
        ax.set_axis_off()
    for ax, column in zip(axes, columns):
        grid = head_grid(summary, column, layers, heads).numpy()
        image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis")
        ax.set_facecolor("#d0d0d0")
        for li, hi in zip(*np.nonzero(np.isnan(grid))):
            ax.text(hi, li, "–", ha="center", va="center", color="#555555")
        if "scans" in summary:
            scans = head_grid(summary, "scans", layers, heads).numpy() == 1
            ys, xs = np.nonzero(scans)
            ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="white", linewidths=1.5)
        fig.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title(column)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads])
        ax.set_yticks(range(len(layers)), [str(v) for v in layers])
    return _finish(fig, path)


def plot_runs(comparison, column: str = "auroc", path: str | Path | None = None) -> Figure:
    """One summary column of every head in every run side by side (`reading.RunComparison`):
    each run's value with its within-run interval (a colour per run), and in black the mean
    over runs with its interval over runs.  Where the black bar is longer than the coloured
    ones, the runs differ beyond what each one knows of itself."""
    per_run, table = comparison.per_run, comparison.table
    if column not in per_run:
        raise ValueError(f"the runs have no {column!r} to draw")
    heads = table[["layer", "head"]].itertuples(index=False)
    labels = [f"{layer}.{head}" for layer, head in heads]
    x = np.arange(len(labels))
    runs = comparison.runs
    width = 0.7 / max(len(runs), 1)
    fig = Figure(figsize=(max(6.0, 0.45 * len(labels) + 2), 3.6))
    ax = fig.subplots()
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for i, run in enumerate(runs):
        rows = per_run[per_run["run"] == run].set_index(["layer", "head"])
        rows = rows.reindex(list(zip(table["layer"], table["head"])))
        values = rows[column].astype(float).to_numpy()
        offset = x - 0.35 + width * (i + 0.5)
        if f"{column}_lo" in rows and f"{column}_hi" in rows:
            lo = rows[f"{column}_lo"].astype(float).to_numpy()
            hi = rows[f"{column}_hi"].astype(float).to_numpy()
            ax.vlines(offset, lo, hi, color=colours[i], alpha=0.6, linewidth=1.5)
        ax.plot(offset, values, "o", color=colours[i], markersize=4, label=run)
    if f"{column}_mean" in table:
        ax.hlines(
            table[f"{column}_mean"],
            x - 0.4,
            x + 0.4,
            color="black",
            linewidth=1.5,
            label="mean over runs",
        )
        ax.vlines(
            x + 0.42,
            table[f"{column}_lo"],
            table[f"{column}_hi"],
            color="black",
            linewidth=2.5,
            label="interval over runs",
        )
    if column in ("auroc", "matched_auroc"):
        ax.axhline(0.5, color="#888888", linewidth=0.8, linestyle="--")
    elif column == "bias":
        ax.axhline(0.0, color="#888888", linewidth=0.8, linestyle="--")
    if column == "snap_step":
        ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=90 if len(labels) > 16 else 0)
    ax.set_xlabel("layer.head")
    ax.set_ylabel(column)
    ax.set_title(f"{column} in {len(runs)} runs: within-run intervals (colours), over runs (black)")
    ax.legend(fontsize=7, ncol=min(len(runs) + 2, 5), loc="best")
    return _finish(fig, path)


def plot_runs_maps(comparison, column: str = "bias", path: str | Path | None = None) -> Figure:
    """[layer, head] maps of one column, one panel per run on one colour scale, heads that
    scan in that run ringed in white: the runs side by side."""
    from scansnap_lens.reading.heads import head_grid

    per_run = comparison.per_run
    if column not in per_run:
        raise ValueError(f"the runs have no {column!r} to map")
    layers = sorted(int(v) for v in per_run["layer"].unique())
    heads = sorted(int(v) for v in per_run["head"].unique())
    grids = [
        head_grid(per_run[per_run["run"] == run], column, layers, heads).numpy()
        for run in comparison.runs
    ]
    finite = np.concatenate([g[np.isfinite(g)] for g in grids] + [np.zeros(0)])
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    fig = Figure(figsize=(2.8 * len(grids) + 1.2, 0.5 * len(layers) + 2.2))
    axes = np.atleast_1d(fig.subplots(1, len(grids)))
    image = None
    for ax, run, grid in zip(axes, comparison.runs, grids):
        image = ax.imshow(
            np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax
        )
        ax.set_facecolor("#d0d0d0")
        rows = per_run[per_run["run"] == run]
        if "scans" in rows:
            scans = (
                head_grid(
                    rows.assign(scans=rows["scans"].astype(float)), "scans", layers, heads
                ).numpy()
                == 1
            )
            ys, xs = np.nonzero(scans)
            ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="white", linewidths=1.5)
        ax.set_title(f"{run}: {column}")
        ax.set_xlabel("head")
        if ax is axes[0]:
            ax.set_ylabel("layer")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads])
        ax.set_yticks(range(len(layers)), [str(v) for v in layers])
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    if path is not None:
        _save(fig, path, bbox_inches="tight")
    return fig


# The painters of the catalog's plots (`measures.catalog.Plot.painter` names one): each draws
# a measurement as its plot says, called through `paint`.
def paint(result: Measurement, plot, snaps: pd.DataFrame | None, path) -> Figure:
    """Draw the catalog `Plot` `plot` of the measurement `result` with the painter it names
    (`snaps`: the snapping table, for plots that mark each head's snap step)."""
    painter = globals().get(plot.painter) if plot.painter.startswith("paint_") else None
    if painter is None:
        raise ValueError(f"no painter {plot.painter!r} in viz.figures (plot {plot.name!r})")
    return painter(result, plot, snaps, path)


def paint_over_steps(result, plot, snaps, path) -> Figure:
    return plot_over_steps(
        result.table,
        plot.column,
        snaps=snaps if plot.snaps else None,
        title=plot.title,
        path=path,
        limits=plot.limits,
    )


def paint_logit_change(result, plot, snaps, path) -> Figure:
    return plot_logit_change(result, path=path)


def paint_growth_bounds(result, plot, snaps, path) -> Figure:
    return plot_growth_bounds(result.table, path=path)


def paint_theory_fit(result, plot, snaps, path) -> Figure:
    return plot_theory_fit(result.table, path=path)


# ------------------------------------------------------------------ a run's figures
# the positions a recorded loss averages over (`Trajectory.loss_on`), as a caption says them
LOSS_POSITIONS = {
    "all": "every position of the first rows",
    "last": "each row's last position, as the training's loss",
    "mixed": "positions that differ between checkpoints",
}


def run_figures(analysis: Analysis, layer: int, head: int) -> list[tuple[str, str, Callable]]:
    """Every figure of a run's `analysis`, as its report draws them: (name, caption,
    ``draw(path)``); the catalog's plots of each measurement made, then the figures of the
    whole model, `layer` and `head` the head shown where a figure shows one."""
    traj, groups, summary = analysis.traj, analysis.groups, analysis.summary
    results, entries = analysis.results, analysis.entries
    snaps = results["snapping"].table if "snapping" in results else None
    made = [
        (plot.name, plot.caption, partial(paint, results[entry.name], plot, snaps))
        for entry in entries
        if entry.name in results
        for plot in entry.plots
    ]

    def add(name: str, caption: str, draw: Callable) -> None:
        made.append((name, caption, draw))

    if len(summary) > 1:
        grid = columns("grid", entries)
        add(
            "heads",
            "Head atlas: every head by layer, its scan (bias, AUROC), snap (snap_step; a dash:"
            " not snapped), head types at the last checkpoint (induction, previous-token and"
            " first-token scores), attention entropy and theory fit (dz_corr: logit changes"
            " against the population dynamics); ringed in white: the heads that scan (see the"
            " legend of the summary)",
            partial(plot_head_grid, summary, traj.layers, traj.heads, columns=grid),
        )
    add(
        "loss",
        f"Loss over training (the evaluation loss on {LOSS_POSITIONS.get(traj.loss_on, 'mixed')}"
        " at each checkpoint, and a training log's) with each layer's snap step (dashed: the"
        " median over its heads; shaded: where the checkpoints place it) and head types'"
        " formation steps (dotted)",
        partial(plot_run_loss, traj, summary, columns("formed", entries)),
    )
    order = shown_classes(traj, groups)
    if groups is not None:
        add(
            "class_attention",
            f"Per-token attention over training, layer {layer} head {head}"
            " (Fig. 4 layout: common tokens above the line, distinct below by increasing P)",
            partial(plot_class_attention, traj, groups, layer, head, order),
        )
    if traj.prompt_pattern is not None:
        add(
            "attention_maps",
            f"Attention of the example prompt at several checkpoints (layer {layer}, head {head})",
            partial(plot_prompt_maps, traj, layer, head),
        )
    if np.isfinite(summary["predicted_snap"].to_numpy(dtype=float)).any():
        add(
            "theory",
            "Theory: growth factor bound and t0 (dotted) against the measured snap (dashed)",
            partial(plot_run_theory, traj, summary, analysis.settings.training),
        )
    if "theory_fit" in results and groups is not None:
        predicted = results["theory_fit"].predictions[0]
        add(
            "predicted_attention",
            "Per-token attention predicted from the corpus statistics alone (population"
            " dynamics at the training's rates; same layout as the measured one above)",
            partial(plot_class_attention, predicted, groups, 0, 0, order, title="predicted"),
        )
    return made


def shown_classes(traj: Trajectory, groups: TokenGroups | None, most: int | None = 4) -> list:
    """The most frequent classes that the recording tracks (the statistics hold more): at most
    `most` of them (None: all)."""
    if groups is None:
        return []
    keys = groups.query * traj.plan.vocab_size + groups.next_token
    tracked = torch.isin(keys, traj.plan.class_keys).numpy()
    order = [int(k) for k in np.argsort(-groups.events.numpy(), kind="stable") if tracked[k]]
    return order if most is None else order[:most]


def plot_run_loss(
    traj: Trajectory, summary: pd.DataFrame, formed: list[str], path: str | Path | None = None
) -> Figure:
    """The recorded evaluation loss, and the training log's losses a Trainer run's meta holds
    (``train_loss``, ``eval_loss``: [[step, loss], ...]), with each layer's snap step (the
    median over its heads, within their bounds) and the first formation step of each head
    type's column in `formed`."""
    curves = {}
    if torch.isfinite(traj.loss).any():
        where = LOSS_POSITIONS.get(traj.loss_on, LOSS_POSITIONS["mixed"])
        if traj.loss_on == "all":
            where += f", about {LOSS_TOKENS:,} tokens"
        curves[f"evaluation loss ({where})"] = (traj.steps.tolist(), traj.loss.tolist())
    for key, label in (("train_loss", "training loss (log)"), ("eval_loss", "eval loss (log)")):
        logged = traj.meta.get(key)
        if isinstance(logged, list) and logged:
            curves[label] = ([float(a) for a, _ in logged], [float(b) for _, b in logged])
    marks = {}
    if "snap_step" in summary:
        for layer, rows in summary.groupby("layer"):
            if rows["snap_step"].notna().any():
                marks[f"layer {layer} snap"] = (
                    float(rows["snap_step"].median()),
                    *median_bounds(rows, "snap_step"),
                )
    for step in formed:
        if step in summary and summary[step].notna().any():
            first = summary.loc[summary[step].idxmin()]
            kind = step.removesuffix("_step").replace("_", "-")
            marks[f"{int(first['layer'])}.{int(first['head'])} {kind}"] = float(first[step])
    return plot_loss_with_steps(curves, marks, traj.step_unit, path=path)


def plot_prompt_maps(
    traj: Trajectory, layer: int, head: int, path: str | Path | None = None
) -> Figure:
    """The example prompt's attention at up to six checkpoints spread over the run."""
    chosen = spread_steps(traj, None, most=6)
    patterns = [prompt_pattern(traj, s, layer, head).numpy() for s in chosen]
    return plot_attention_maps(patterns, chosen, title=f"layer {layer}, head {head}", path=path)


def plot_run_theory(
    traj: Trajectory, summary: pd.DataFrame, training=None, path: str | Path | None = None
) -> Figure:
    """The growth factor bound and t0 of each distinct pair of the run's rates (`theory_of`)
    against the measured snap of the first head, where one pair of rates is known."""
    theories = {(t.lr_y, t.lr_z): t for t in theory_of(traj, training) if t is not None}
    theories = list(theories.values())
    snap = float(summary["snap_step"].iloc[0]) if "snap_step" in summary else math.nan
    measured = [snap] if len(theories) == 1 and math.isfinite(snap) else []
    last = max(float(traj.steps[-1]), max(t.t0 for t in theories)) * 2
    t = np.logspace(0, math.log10(max(last, 10.0)), 200)
    return plot_growth_factor(theories, t, path=path, measured=measured)
