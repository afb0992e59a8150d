"""Measurements of scan and snap (DESIGN section 2), shared by the lab and real models.

Every function takes a `Trajectory` (zbar and chat over checkpoints, per layer and head) and
`TokenGroups` (distinct tokens of each class with P(l|m, n), common tokens of each query) and
returns a small result with ``to_dataframe()``.  dz = zbar(t) - zbar(t_first): softmax is
shift-invariant, so only changes of the logits are compared, never raw levels.

- `discriminative_bias`: mean dz of distinct minus common tokens of a query; AUROC of dz.
- `frequency_bias`: Spearman(dz, P(l|m, n)) over the distinct tokens of a class.
- `sparsity`: entropy of chat restricted to distinct tokens (Fig. 6), recall vs threshold.
- `growth`: relative gain and growth factor of Theorem 3, and the deviation from it.
- `growth_bounds`, `theory_fit` (module `fit`): the growth factor against Theorem 3's bounds,
  and every head against attention predicted from the corpus statistics alone.
- `snapping`: the snapping time `snap_step` (the rate of attention movement fallen to half its
  peak: horizon-independent), and the secondary path-fraction and rate-threshold steps.
- `effective_rate`, `known_rates`, `predicted_snap`: the theory's t0 at the rates the training
  used (SGD: lr / (1 - momentum); none for Adam).
- `summarize`: one row per layer and head.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import Tensor

from .groups import TokenGroups
from .trajectory import Trajectory

__all__ = [
    "discriminative_bias",
    "frequency_bias",
    "growth",
    "growth_bounds",
    "known_rates",
    "predicted_snap",
    "restricted_entropy",
    "snap_steps",
    "snapping",
    "sparsity",
    "summarize",
    "theory_fit",
    "theory_of",
    "training_of",
]


def restricted_entropy(attention: Tensor, mask: Tensor) -> Tensor:
    """Shannon entropy (nats) of ``attention`` restricted to ``mask`` and renormalised.

    attention: [..., K, V] per-token attention of each class (rows sum to 1);
    mask: [K, V] bool, the tokens to keep for each class (its distinct tokens for the Fig. 6
    metric).  Returns [..., K]; a class with one kept token has entropy 0, and 0 log 0 = 0.

    >>> a = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    >>> restricted_entropy(a, torch.tensor([[False, True, True, True]]))
    tensor([0.6931])
    """
    if attention.shape[-2:] != mask.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match attention {tuple(attention.shape)}"
        )
    if not mask.any(-1).all():
        raise ValueError("every class needs at least one token in the mask")
    kept = attention * mask.to(attention.dtype)
    p = kept / kept.sum(-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(-1)


# ------------------------------------------------------------------ lookups
def _z(traj: Trajectory, query: int, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """zbar [S, L, H, n] of the pairs (query, l) the plan holds, and the mask of `tokens` held."""
    slot = traj.plan.pair_slot(query, tokens)
    held = slot >= 0
    return traj.zbar[..., slot[held]].double(), held


def _dz(traj: Trajectory, query: int, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """zbar(t) - zbar(t_first) of `_z`."""
    z, held = _z(traj, query, tokens)
    return z - z[:1], held


def _class_chat(traj: Trajectory, c: int) -> Tensor:
    """chat [S, L, H, n] over all tokens of class slot c."""
    plan = traj.plan
    return traj.chat[..., (plan.triple_class == c).nonzero().flatten()].double()


def _frame(traj: Trajectory, values: dict[str, Tensor]) -> pd.DataFrame:
    """Long table of [S, L, H] tensors."""
    idx = pd.MultiIndex.from_product(
        [traj.steps.tolist(), traj.layers, traj.heads], names=["step", "layer", "head"]
    ).to_frame(index=False)
    for name, v in values.items():
        idx[name] = v.reshape(-1).numpy()
    return idx


def _weighted_nanmean(values: Tensor, weights: Tensor) -> Tensor:
    """Mean over the last axis of `values`, weights [n], NaNs left out."""
    w = weights.double().expand_as(values).clone()
    ok = ~torch.isnan(values)
    w[~ok] = 0
    total = w.sum(-1)
    return torch.where(total > 0, (torch.nan_to_num(values) * w).sum(-1) / total, math.nan)


INDEX = ("step", "layer", "head")


@dataclass
class Measurement:
    """Per (step, layer, head) values in ``table``, per query or class detail in ``detail``.

    `tensor` gives a column as a tensor indexed like TransformerLens's head scores,
    ``[step, layer, head]`` (``[layer, head]`` for per-head results such as snap steps):

    >>> table = pd.DataFrame({"step": [0, 0, 9, 9], "layer": 0, "head": [0, 1, 0, 1],
    ...                       "bias": [0.0, 0.1, 2.0, 0.5]})
    >>> Measurement("bias", table).tensor("bias")[-1]  # the last step, [layer, head]
    tensor([[2.0000, 0.5000]], dtype=torch.float64)
    """

    name: str
    table: pd.DataFrame
    detail: pd.DataFrame | None = None
    values: Tensor | None = None  # [S, L, H] where the measurement has one value per head
    predictions: list | None = None  # `theory_fit`: the predicted trajectories it compared

    def to_dataframe(self) -> pd.DataFrame:
        return self.table

    def final(self) -> pd.DataFrame:
        """The rows of the last checkpoint."""
        return self.table[self.table["step"] == self.table["step"].max()].reset_index(drop=True)

    def tensor(self, column: str | None = None) -> Tensor:
        """`column` of the table (default: the measurement's first value column) as a float64
        tensor [S, L, H] over the table's steps, layers and heads in ascending order (or
        [L, H] where the table has no step); NaN where the table has no row."""
        index = [c for c in INDEX if c in self.table.columns]
        if column is None:
            numeric = self.table.select_dtypes("number").columns
            column = next(c for c in numeric if c not in index)
        if column not in self.table.columns:
            raise KeyError(f"{self.name} has no column {column!r}: {list(self.table.columns)}")
        grid = pd.MultiIndex.from_product([sorted(self.table[c].unique()) for c in index])
        values = self.table.set_index(index)[column].astype(float).reindex(grid)
        shape = [len(level) for level in grid.levels]
        return torch.tensor(values.to_numpy(), dtype=torch.float64).reshape(shape)

    def tensors(self) -> dict[str, Tensor]:
        """Every numeric value column as `tensor` gives it."""
        index = [c for c in INDEX if c in self.table.columns]
        numeric = self.table.select_dtypes("number").columns
        return {c: self.tensor(c) for c in numeric if c not in index}


# ------------------------------------------------------------------ scan
def discriminative_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Mean dz of a query's distinct tokens minus its common tokens, and the AUROC of dz
    separating them; averaged over queries with both kinds, weighted by their events.
    The table also keeps the two means, dz_distinct and dz_common (bias is their difference)."""
    groups.check_context(traj.plan)
    biases, aurocs, d_means, c_means, weights, rows = [], [], [], [], [], []
    for m in groups.query.unique().tolist():
        d_dz, _ = _dz(traj, m, groups.distinct_of_query(m))
        c_dz, _ = _dz(traj, m, groups.common.get(m, torch.empty(0, dtype=torch.long)))
        if d_dz.shape[-1] == 0 or c_dz.shape[-1] == 0:
            continue
        bias = d_dz.mean(-1) - c_dz.mean(-1)
        auroc = _auroc(d_dz, c_dz)
        biases.append(bias)
        aurocs.append(auroc)
        d_means.append(d_dz.mean(-1))
        c_means.append(c_dz.mean(-1))
        weights.append(float(groups.events[groups.query == m].sum()))
        rows.append((m, d_dz.shape[-1], c_dz.shape[-1], float(bias[-1].mean()), weights[-1]))
    if not biases:
        raise ValueError("no query has both distinct and common tokens in the trajectory")
    w = torch.tensor(weights, dtype=torch.float64)
    table = _frame(
        traj,
        {
            "bias": _weighted_nanmean(torch.stack(biases, -1), w),
            "auroc": _weighted_nanmean(torch.stack(aurocs, -1), w),
            "dz_distinct": _weighted_nanmean(torch.stack(d_means, -1), w),
            "dz_common": _weighted_nanmean(torch.stack(c_means, -1), w),
        },
    )
    table["bias_queries"] = len(biases)
    detail = pd.DataFrame(
        rows, columns=["query", "distinct", "common", "final_bias_mean_heads", "events"]
    )
    return Measurement("discriminative_bias", table, detail)


def _auroc(pos: Tensor, neg: Tensor) -> Tensor:
    """P(pos > neg) + P(pos = neg) / 2 along the last axis (Mann-Whitney, ties averaged)."""
    both = torch.cat([pos, neg], -1).numpy()
    ranks = torch.from_numpy(rankdata(both, axis=-1))
    n_pos, n_neg = pos.shape[-1], neg.shape[-1]
    u = ranks[..., :n_pos].sum(-1) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def frequency_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Spearman correlation of dz[m, l] with P(l|m, n) over the distinct tokens of each class,
    averaged over classes with weights N(m, n).  Classes with fewer than two distinct tokens,
    or with all P equal, have no correlation and are left out; so are steps where dz is flat."""
    groups.check_context(traj.plan)
    rhos, weights, rows = [], [], []
    for k in range(groups.num_classes):
        m = int(groups.query[k])
        dz, held = _dz(traj, m, groups.distinct[k])
        p = groups.distinct_p[k][held]
        if p.numel() < 2 or bool((p == p[0]).all()):
            continue
        rho = _spearman(dz, p)
        rhos.append(rho)
        weights.append(float(groups.events[k]))
        rows.append((m, int(groups.next_token[k]), p.numel(), float(np.nanmean(rho[-1]))))
    if not rhos:
        raise ValueError("no class has two distinct tokens with different P(l|m, n)")
    rho = _weighted_nanmean(torch.stack(rhos, -1), torch.tensor(weights, dtype=torch.float64))
    table = _frame(traj, {"spearman": rho})
    table["spearman_classes"] = len(rhos)
    detail = pd.DataFrame(rows, columns=["query", "next", "distinct", "final_spearman_mean"])
    return Measurement("frequency_bias", table, detail)


def _spearman(x: Tensor, p: Tensor) -> Tensor:
    """Spearman correlation of x [..., n] with p [n] along the last axis; NaN if x is flat."""
    rx = torch.from_numpy(rankdata(x.numpy(), axis=-1))
    rp = torch.from_numpy(rankdata(p.numpy())).double()
    rx = rx - rx.mean(-1, keepdim=True)
    rp = rp - rp.mean()
    den = torch.sqrt((rx**2).sum(-1) * (rp**2).sum())
    return torch.where(den > 0, (rx * rp).sum(-1) / den.clamp_min(1e-300), math.nan)


# ------------------------------------------------------------------ sparsity
def sparsity(
    traj: Trajectory, groups: TokenGroups, thresholds: Tensor | None = None
) -> Measurement:
    """Entropy of chat restricted to distinct tokens and renormalised (Fig. 6), averaged over
    classes; also the attention mass on distinct tokens, the top distinct token's share of it,
    and recall(threshold): the share of distinct tokens with chat >= threshold (Figs. 11, 12).

    Entropy and top share need two distinct tokens: a class with one would give 0 and 1 by
    construction, so it counts for the mass and recall only (``sparsity_classes`` counts the
    classes the entropy averages; NaN where there is none, `SINGLE_DISTINCT` says why)."""
    groups.check_context(traj.plan)
    ents, masses, tops, recalls = [], [], [], []
    judged = 0
    if thresholds is None:
        thresholds = torch.tensor([0.5, 1.0, 2.0]) / max(traj.plan.vocab_size, 1)
    for k in range(groups.num_classes):
        c = traj.class_slot(int(groups.query[k]), int(groups.next_token[k]))
        if c is None or groups.distinct[k].numel() == 0:
            continue
        chat = traj.class_attention(c, groups.distinct[k])  # [S, L, H, D]
        mass = chat.sum(-1)
        p = chat / mass.clamp_min(1e-300)[..., None]
        several = groups.distinct[k].numel() >= 2
        judged += several
        ok = (mass > 0) & several
        ents.append(torch.where(ok, -torch.special.xlogy(p, p).sum(-1), math.nan))
        masses.append(mass)
        tops.append(torch.where(ok, p.max(-1).values, math.nan))
        recalls.append(torch.stack([(chat >= t).double().mean(-1) for t in thresholds], -1))
    if not ents:
        raise ValueError("no tracked class has distinct tokens")
    values = {
        "entropy": torch.nanmean(torch.stack(ents, -1), -1),
        "distinct_mass": torch.stack(masses, -1).mean(-1),
        "top_share": torch.nanmean(torch.stack(tops, -1), -1),
    }
    recall = torch.stack(recalls, -2).mean(-2)  # [S, L, H, thresholds]
    for j, t in enumerate(thresholds.tolist()):
        values[f"recall@{t:.4g}"] = recall[..., j]
    table = _frame(traj, values)
    table["sparsity_classes"] = judged
    return Measurement("sparsity", table)


SINGLE_DISTINCT = (
    "every class has a single distinct token, so the entropy over distinct tokens and the top"
    " share are not defined (they would be 0 and 1 by construction): relax the classification"
    " (lower --purity or --min-support, or --no-guard), track more queries, or count the"
    " statistics over a larger corpus"
)


# ------------------------------------------------------------------ Theorem 3
def growth(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Theorem 3 per class: l0 = the distinct token with the highest P(l|m, n); for every other
    distinct l, r(t) = (ctilde_l0 / ctilde_l)^2 - 1 with ctilde = P exp(zbar), the growth factor
    chi_l0(t) = exp(2 (z_l0(t) - z_l0(0))), and the relative deviation |r - r(0) chi| / r(0) chi.
    The table keeps chi of l0 (mean over classes) and the worst deviation per step."""
    groups.check_context(traj.plan)
    chis, devs, rows = [], [], []
    for k in range(groups.num_classes):
        m = int(groups.query[k])
        z, held = _z(traj, m, groups.distinct[k])
        p = groups.distinct_p[k][held]
        if p.numel() < 2:
            continue
        tokens = groups.distinct[k][held]
        dz = z - z[:1]
        i0 = int(torch.argmax(p))
        ctilde = p * torch.exp(z - z[..., i0 : i0 + 1])  # shift-free ratios
        others = [j for j in range(p.numel()) if j != i0]
        r = (ctilde[..., i0 : i0 + 1] / ctilde[..., others]) ** 2 - 1
        chi = torch.exp(2 * dz[..., i0])
        pred = r[:1] * chi[..., None]
        dev = ((r - pred).abs() / pred.abs().clamp_min(1e-12)).amax(-1)
        chis.append(chi)
        devs.append(dev)
        rows.append((m, int(groups.next_token[k]), int(tokens[i0]), float(dev.max())))
    if not chis:
        raise ValueError("no class has two distinct tokens")
    table = _frame(
        traj,
        {
            "chi_l0": torch.stack(chis, -1).mean(-1),
            "max_deviation": torch.stack(devs, -1).amax(-1),
        },
    )
    detail = pd.DataFrame(rows, columns=["query", "next", "l0", "max_deviation"])
    return Measurement("growth", table, detail)


# ------------------------------------------------------------------ snap
NOT_YET_SNAPPED = "not yet snapped"
NO_SCAN = "no scan"


def snap_step(
    steps: Tensor, moves: Tensor, fraction: float = 0.5
) -> tuple[Tensor, Tensor, list[str]]:
    """The snapping time as a property of the dynamics: the step at which the attention's
    rate of movement per step, past its peak, has fallen to `fraction` of that peak.

    The theory (Sec. 6): the logits grow fastest near t0' and, after t0, only
    logarithmically, so their rate of change falls like 1/t.  The crossing is found with the
    rate of each interval placed at its midpoint and interpolated linearly, and it depends on
    nothing after it: training longer does not move it.

    steps: [S] ascending; moves: [..., S - 1] movement between consecutive checkpoints.
    Returns (snap [...], peak [...], reasons): the snap step and the step of peak rate (NaN
    where undefined), and per entry (flattened) "" or why the snap is NaN: "no scan" (the map
    never moves), "not yet snapped" (the run ends before the rate has fallen that far).

    >>> steps = torch.tensor([0, 10, 20, 30, 40, 50])
    >>> snap, peak, why = snap_step(steps, torch.tensor([1.0, 4.0, 3.0, 1.0, 0.5]))
    >>> round(snap.item(), 1), round(peak.item(), 1), why
    (29.3, 14.5, [''])
    >>> snap_step(steps, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))[2]
    ['not yet snapped']
    """
    t = steps.double()
    rate = moves.double() / torch.diff(t).clamp_min(1e-300)
    # Each interval's mean rate is placed at the logarithmic mean of its ends (in 1 + t): for a
    # rate falling like 1/t, the interval's mean rate is the rate there exactly, so wide
    # log-spaced intervals place it right; narrow intervals give the plain midpoint.
    lo, hi = torch.log1p(t[:-1] - t[0]), torch.log1p(t[1:] - t[0])
    width = hi - lo
    mid = torch.where(
        width > 1e-9, torch.expm1(hi) - torch.expm1(lo), (t[1:] - t[:-1])
    ) / torch.where(width > 1e-9, width, 1.0)
    mid = torch.where(width > 1e-9, mid - 1, (t[1:] + t[:-1]) / 2 - t[0]) + t[0]
    x = torch.log1p(mid - t[0])  # crossings are interpolated on a log axis
    flat = rate.reshape(-1, rate.shape[-1])
    snaps, peaks, reasons = [], [], []
    for r in flat:
        p = int(torch.argmax(r))
        if not bool(r[p] > 0):
            snaps.append(math.nan), peaks.append(math.nan), reasons.append(NO_SCAN)
            continue
        peaks.append(float(mid[p]))
        level = float(r[p]) * fraction
        below = torch.nonzero(r[p + 1 :] <= level)
        if below.numel() == 0:
            snaps.append(math.nan), reasons.append(NOT_YET_SNAPPED)
            continue
        i = p + 1 + int(below[0])
        share = (float(r[i - 1]) - level) / (float(r[i - 1]) - float(r[i]))
        snaps.append(float(torch.expm1(x[i - 1] + share * (x[i] - x[i - 1]))) + float(t[0]))
        reasons.append("")
    shape = rate.shape[:-1]
    return (
        torch.tensor(snaps, dtype=torch.float64).reshape(shape),
        torch.tensor(peaks, dtype=torch.float64).reshape(shape),
        reasons,
    )


def snap_steps(
    steps: Tensor, moves: Tensor, fraction: float = 0.9, rate_fraction: float = 0.1
) -> tuple[Tensor, Tensor]:
    """Secondary snap steps from the per-interval movement of an attention map.

    Both depend on the horizon: `path` is a share of the whole run's movement, so it grows
    with the run (training 10x longer moves it about 10x); `rate` compares movement per
    log-step with its peak and, since the movement per log-step of a snapped map stays about
    constant, it often never fires.  `snap_step` is the primary estimate.

    steps: [S] ascending; moves: [..., S - 1] movement between consecutive checkpoints.
    Returns (path, rate), each [...] in the unit of `steps`, NaN where undefined:
    - path: the first checkpoint by which a share `fraction` of the total path is covered
      (NaN for a frozen map: no movement at all);
    - rate: the checkpoint after which the rate of movement per unit of log(1 + step) stays
      below `rate_fraction` of its peak (NaN when it never settles: the last interval is still
      above that).

    >>> steps = torch.tensor([0, 1, 3, 7, 15])
    >>> path, rate = snap_steps(steps, torch.tensor([0.5, 0.3, 0.15, 0.01]))
    >>> path.item(), rate.item()
    (7.0, 7.0)
    """
    steps = steps.double()
    moves = moves.double()
    total = moves.sum(-1, keepdim=True)
    cum = torch.cumsum(moves, -1) / total.clamp_min(1e-300)
    reached = cum >= fraction - 1e-12
    first = reached.double().argmax(-1)
    path = torch.where(total[..., 0] > 0, steps[1:][first], math.nan)
    dlog = torch.diff(torch.log1p(steps - steps[0]))
    rate = moves / dlog.clamp_min(1e-300)
    peak = rate.amax(-1, keepdim=True)
    above = rate >= rate_fraction * peak
    # index of the last interval still above the threshold; the snap is its right end
    n = above.shape[-1]
    last_above = n - 1 - above.flip(-1).double().argmax(-1)
    settled = (last_above < n - 1) & (peak[..., 0] > 0)
    rate_step = torch.where(settled, steps[1:][last_above.clamp_max(n - 1)], math.nan)
    return path, rate_step


def snapping(
    traj: Trajectory,
    groups: TokenGroups | None = None,
    fraction: float = 0.9,
    rate_fraction: float = 0.1,
    snap_fraction: float = 0.5,
    classes=None,
) -> Measurement:
    """Snap steps per head (table) and per class (detail).

    Columns: ``snap_step`` (primary, `snap_step`: the rate of movement per step has fallen to
    `snap_fraction` of its peak; horizon-independent), ``rate_peak_step`` (where that rate
    peaks), ``snap_reason`` (why ``snap_step`` is NaN), and the secondary, horizon-dependent
    ``snap_path`` and ``snap_rate`` (`snap_steps`).  The movement of a class between
    checkpoints is the total variation of its chat; a head's movement is the events-weighted
    mean over classes (the classes of `groups` if given, or `classes`, pairs (m, n), else every
    tracked class).
    """
    if traj.num_steps < 2:
        raise ValueError("snapping needs at least two checkpoints")
    plan = traj.plan
    if groups is not None:
        classes = zip(groups.query.tolist(), groups.next_token.tolist())
    if classes is None:
        slots = list(range(plan.num_classes))
    else:
        found = [traj.class_slot(int(m), int(n)) for m, n in classes]
        slots = [c for c in found if c is not None]
    if not slots:
        raise ValueError("no tracked class to measure")
    moves, weights, rows = [], [], []
    for c in slots:
        chat = _class_chat(traj, c)  # [S, L, H, n]
        move = 0.5 * torch.diff(chat, dim=0).abs().sum(-1)  # [S-1, L, H]
        move = move.permute(1, 2, 0)  # [L, H, S-1]
        moves.append(move)
        weights.append(float(plan.class_events[c]))
        path, rate = snap_steps(traj.steps, move, fraction, rate_fraction)
        snap, _, _ = snap_step(traj.steps, move, snap_fraction)
        m, n = int(plan.class_query[c]), int(plan.class_next[c])
        for i, layer in enumerate(traj.layers):
            for j, head in enumerate(traj.heads):
                rows.append(
                    (layer, head, m, n, float(snap[i, j]), float(path[i, j]), float(rate[i, j]))
                )
    w = torch.tensor(weights, dtype=torch.float64)
    head_move = (torch.stack(moves, -1) * w).sum(-1) / w.sum()  # [L, H, S-1]
    path, rate = snap_steps(traj.steps, head_move, fraction, rate_fraction)
    snap, peak, reasons = snap_step(traj.steps, head_move, snap_fraction)
    table = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"]).to_frame(
        index=False
    )
    table["snap_step"] = snap.reshape(-1).numpy()
    table["rate_peak_step"] = peak.reshape(-1).numpy()
    table["snap_reason"] = reasons
    table["snap_path"] = path.reshape(-1).numpy()
    table["snap_rate"] = rate.reshape(-1).numpy()
    table["step_unit"] = traj.step_unit
    detail = pd.DataFrame(
        rows, columns=["layer", "head", "query", "next", "snap_step", "snap_path", "snap_rate"]
    )
    return Measurement("snapping", table, detail)


# ------------------------------------------------------------------ summary
def effective_rate(lr: float, optimizer: str = "sgd", momentum: float = 0.0) -> float | None:
    """The plain-SGD rate that an optimizer's steps amount to, or None where there is none.

    SGD with momentum beta moves, once its velocity has built up (after about 1 / (1 - beta)
    steps), by lr / (1 - beta) times the gradient per step.  Adam's step is normalised by
    the gradient's running scale, so no plain-SGD rate corresponds to it and the theory
    (derived for gradient flow) gives no prediction.

    >>> effective_rate(0.5, "sgd", 0.75)
    2.0
    >>> effective_rate(0.1, "adam") is None
    True
    """
    if optimizer == "adam":
        return None
    if optimizer != "sgd":
        raise ValueError(f"unknown optimizer {optimizer!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    return float(lr) / (1.0 - float(momentum))


def training_of(traj: Trajectory, training: dict | None = None) -> list[dict] | None:
    """How each head was trained, as the training wrote it: per head a dict with the nominal
    ``lr_y``, ``lr_z``, ``optimizer`` and ``momentum``; None where the trajectory does not say.
    `training` (``lr_y`` and ``lr_z``, optionally ``optimizer``, ``momentum``) overrides it.

    The trajectory's meta holds what the training wrote (`train`, `Recorder.on_checkpoint(...,
    training=)`, ``training.json`` beside checkpoints); the Y/Z lab holds ``lr_z`` and
    ``ratio`` per run (one head per run); trajectories written before ``lr_y`` / ``lr_z`` hold
    ``lr`` and ``lr_attention``.
    """
    if training is not None:
        missing = {"lr_y", "lr_z"} - set(training)
        if missing:
            raise ValueError(f"training needs {sorted(missing)}")
        given = {"optimizer": "sgd", "momentum": 0.0, **training}
        return [{k: given[k] for k in ("lr_y", "lr_z", "optimizer", "momentum")}] * len(traj.heads)
    meta = traj.meta
    optimizer = meta.get("optimizer", "sgd")
    momentum = float(meta.get("momentum", 0.0))
    if "lr_z" in meta and "ratio" in meta and isinstance(meta["lr_z"], list):  # the lab
        pairs = [(z * r, z) for z, r in zip(meta["lr_z"], meta["ratio"])]
        pairs = [pairs[h] for h in traj.heads]
    elif "lr_y" in meta and "lr_z" in meta:
        pairs = [(float(meta["lr_y"]), float(meta["lr_z"]))] * len(traj.heads)
    elif "lr" in meta and "lr_attention" in meta:
        pairs = [(float(meta["lr"]), float(meta["lr_attention"]))] * len(traj.heads)
    else:
        typed = sorted(k for k in meta if re.match(r"(lr|eta|learning_rate)", k, re.IGNORECASE))
        if typed:  # rates under other names would silently give no prediction
            warnings.warn(
                f"the trajectory's meta holds {typed} but not lr_y and lr_z (the paper's eta_Y,"
                " eta_Z), so the theory gives no prediction: record with those keys, or pass"
                " training={'lr_y': ..., 'lr_z': ...}",
                stacklevel=3,
            )
        return None
    return [{"lr_y": y, "lr_z": z, "optimizer": optimizer, "momentum": momentum} for y, z in pairs]


def known_rates(
    traj: Trajectory, training: dict | None = None
) -> list[tuple[float, float] | None] | None:
    """Effective (eta_Y, eta_Z) per head (`effective_rate` of `training_of`), None for a head
    trained with Adam, or None where the trajectory does not say how it was trained."""
    settings = training_of(traj, training)
    if settings is None:
        return None
    out = []
    for t in settings:
        y = effective_rate(t["lr_y"], t["optimizer"], t["momentum"])
        z = effective_rate(t["lr_z"], t["optimizer"], t["momentum"])
        out.append(None if y is None or z is None else (y, z))
    return out


def theory_of(traj: Trajectory, training: dict | None = None) -> list | None:
    """A `theory.PhaseTransition` per head (None for a head with no effective rate) where the
    training is known (`known_rates`); K is the number of next tokens and M the vocabulary."""
    from .theory import PhaseTransition

    rates = known_rates(traj, training)
    if rates is None:
        return None
    K = int(traj.plan.class_next.unique().numel())
    M = traj.plan.vocab_size
    return [None if r is None else PhaseTransition(K=K, M=M, lr_y=r[0], lr_z=r[1]) for r in rates]


def predicted_snap(traj: Trajectory, training: dict | None = None) -> list[float] | None:
    """The theory's transition t0 = 2 (1 + delta') K ln M / eta_Y (Sec. 6) per head at the
    effective rates (`known_rates`); NaN for a head trained with Adam."""
    theories = theory_of(traj, training)
    return None if theories is None else [math.nan if t is None else t.t0 for t in theories]


MEASURES = (
    "snapping",
    "discriminative_bias",
    "frequency_bias",
    "sparsity",
    "attention_entropy",
    "growth",
)
SUMMARY_MEASURES = MEASURES[:-1]  # the ones whose last checkpoint `summarize` tabulates


def measure_all(
    traj: Trajectory, groups: TokenGroups, names=MEASURES
) -> tuple[dict[str, Measurement], dict[str, str]]:
    """Each measurement of `names` once: ({name: result}, {name: why it is not measurable}).

    `snapping` needs two checkpoints and raises otherwise; the others are left out with the
    reason where the trajectory or the groups lack what they need.  `summarize` and
    `report.write_report` share these results rather than measuring twice.
    """
    from .heads import attention_entropy  # one quantity per module; it builds on this one

    functions = {
        "snapping": lambda: snapping(traj),
        "discriminative_bias": lambda: discriminative_bias(traj, groups),
        "frequency_bias": lambda: frequency_bias(traj, groups),
        "sparsity": lambda: sparsity(traj, groups),
        "attention_entropy": lambda: attention_entropy(traj),
        "growth": lambda: growth(traj, groups),
    }
    results, why = {}, {}
    for name in names:
        if name == "snapping":
            results[name] = functions[name]()
            continue
        try:
            results[name] = functions[name]()
        except ValueError as err:
            why[name] = str(err)
    return results, why


def summarize(
    traj: Trajectory,
    groups: TokenGroups,
    prediction=None,
    checks: dict | None = None,
    training: dict | None = None,
    results: dict[str, Measurement] | None = None,
) -> pd.DataFrame:
    """One row per layer and head: scan scores and sparsity at the last checkpoint, snap steps,
    and the theory's transition t0 (`prediction`: one value, one per head, or by default
    `predicted_snap(traj)`; NaN where unknown).  `checks`: measurements of
    `fit.theory_checks`, whose last-checkpoint columns join the row (``bound_ratio``,
    ``inside`` of `growth_bounds`; ``population_snap``, ``snap_ratio``, ``rank_agreement``,
    ``dz_corr`` of `theory_fit`).  `training`: the rates if the trajectory does not hold them
    (see `training_of`).  `results`: the measurements of `measure_all`, if already made."""
    from .fit import SUMMARY_COLUMNS

    if results is None:
        results, _ = measure_all(traj, groups, SUMMARY_MEASURES)
    parts = [results["snapping"].table]  # attention movement of every tracked class
    for name in SUMMARY_MEASURES[1:]:
        if name in results:
            parts.append(results[name].final().drop(columns=["step"]))
    for name, result in (checks or {}).items():
        final = result.final()
        parts.append(final[["layer", "head", *SUMMARY_COLUMNS[name]]])
    out = parts[0]
    for part in parts[1:]:
        out = out.merge(part, on=["layer", "head"], how="left")
    out["final_step"] = int(traj.steps[-1])
    if prediction is None:
        prediction = predicted_snap(traj, training)
    if prediction is None:
        out["predicted_snap"] = math.nan
    elif isinstance(prediction, int | float):
        out["predicted_snap"] = float(prediction)
    else:
        by_head = dict(zip(traj.heads, prediction))
        out["predicted_snap"] = out["head"].map(by_head).astype(float)
    return out


# The theory's checks build on the measurements above; re-exported so that every quantity is
# reachable as measure.<name>.
from .fit import growth_bounds, theory_fit  # noqa: E402
