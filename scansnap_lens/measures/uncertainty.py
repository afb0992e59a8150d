"""How sure a per-head figure is: bootstrap intervals, permutation nulls, an untrained baseline
and a `scans` verdict, at the last checkpoint.

- **Bootstrap** (`bootstrap_interval`): the units a figure averages are resampled with
  replacement, queries for `bias` and `auroc` (and the attention entropy), classes for
  `spearman`, the entropy over distinct tokens and `snap_step`; the interval is the
  percentile interval of the resampled weighted means (`level`, default 95 %), NaN where a
  figure averages fewer than two units.
- **Permutation null** (`permutation_p`): `bias` and `auroc` with the token kinds shuffled
  within each query (which tokens are distinct and which common), `spearman` with P(l|m, n)
  shuffled within each class; the p-value is (1 + #{null >= observed}) / (1 + resamples).
- **Baseline**: `bias` and `auroc` of the logit levels z at the first checkpoint (what the
  untrained head shows), against their change dz since then.
- **Verdict**: a head ``scans`` when its bias is above 0 and its AUROC above the null at
  p < alpha / heads (Bonferroni over the heads of the trajectory).

Every resample is one row of a tensor: no Python loop runs per resample or per token.  Shape
letters (docs/shapes.md): L layers, H heads, U units (queries or classes), B resamples, N
tokens of one unit.

>>> g = torch.Generator().manual_seed(0)
>>> values = torch.tensor([1.0, 2.0, 3.0, 4.0])  # four units with one value each
>>> lo, hi = bootstrap_interval(values, torch.ones(4), num=2000, generator=g)
>>> 1.0 <= lo.item() < 2.5 < hi.item() <= 4.0
True
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.measures.measurement import (
    Measurement,
    QueryTokens,
    _tracked,
)
from scansnap_lens.measures.snap import class_movement, snap_step
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "ALPHA",
    "LEVEL",
    "UNCERTAINTY_COLUMNS",
    "bootstrap_interval",
    "permutation_p",
    "scan_uncertainty",
]

LEVEL = 0.95  # the bootstrap intervals' coverage
ALPHA = 0.05  # the verdict's family-wise level over the heads
# the columns `scan_uncertainty` adds to the one-row-per-head summary
UNCERTAINTY_COLUMNS = ("bias_lo", "bias_hi", "bias_p", "bias_baseline", "auroc_lo", "auroc_hi",
                       "auroc_p", "auroc_baseline", "spearman_lo", "spearman_hi", "spearman_p",
                       "entropy_lo", "entropy_hi", "attention_entropy_lo",
                       "attention_entropy_hi", "snap_step_lo", "snap_step_hi", "snap_share",
                       "scans")  # fmt: skip
MAX_ELEMENTS = 1 << 24  # resamples are drawn in chunks of at most this many values


def _counts(num_units: int, num: int, generator) -> Tensor:
    """[B, U] how often each unit is drawn in each of `num` resamples with replacement."""
    drawn = torch.randint(num_units, (num, num_units), generator=generator)
    counts = torch.zeros(num, num_units, dtype=torch.float64)
    return counts.scatter_add_(1, drawn, torch.ones_like(drawn, dtype=torch.float64))


def _resampled_means(values: Tensor, weights: Tensor, counts: Tensor) -> Tensor:
    """[B, ...] the weighted mean over units of `values` [U, ...] for each row of `counts`
    [B, U]; a NaN value has no weight (NaN where a resample holds no value)."""
    ok = ~torch.isnan(values)
    w = weights.double().reshape(-1, *([1] * (values.dim() - 1))) * ok
    flat_v = (torch.nan_to_num(values.double()) * w).reshape(values.shape[0], -1)
    flat_w = w.expand_as(values).reshape(values.shape[0], -1)
    total = counts @ flat_w
    mean = torch.where(total > 0, (counts @ flat_v) / total.clamp_min(1e-300), math.nan)
    return mean.reshape(counts.shape[0], *values.shape[1:])


def bootstrap_interval(
    values: Tensor, weights: Tensor, num: int = 1000, level: float = LEVEL, generator=None
) -> tuple[Tensor, Tensor]:
    """The percentile bootstrap interval of the weighted mean over units of `values` [U, ...]
    (`weights` [U]): units resampled with replacement `num` times.  ([...], [...]); NaN with
    fewer than two units (one unit has no spread to resample)."""
    if values.shape[0] < 2:
        nan = torch.full(values.shape[1:], math.nan, dtype=torch.float64)
        return nan, nan.clone()
    means = _resampled_means(values, weights, _counts(values.shape[0], num, generator))
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.nanquantile(means, q, dim=0)
    return lo, hi


def permutation_p(observed: Tensor, null: Tensor) -> Tensor:
    """One-sided p-value of `observed` [...] against `null` [B, ...]: (1 + #{null >=
    observed}) / (1 + B); NaN where the observation is NaN.  A null value equal to the
    observation up to rounding (relative 1e-9) counts as equal: the observed arrangement is one
    of the null's, computed along another path.

    >>> null = torch.tensor([0.3, 0.0, 1.0], dtype=torch.float64)
    >>> permutation_p(torch.tensor(0.1 + 0.2, dtype=torch.float64), null)  # 0.3 ties it
    tensor(0.7500, dtype=torch.float64)
    """
    tie = 1e-9 * observed.abs().clamp_min(1.0)
    above = (null >= observed - tie).sum(0).double()
    p = (1 + above) / (1 + null.shape[0])
    return torch.where(torch.isnan(observed), math.nan, p)


def _shuffled_first(n: int, k: int, num: int, generator) -> Tensor:
    """[B, k] the positions that the first k of a random permutation of n take, per resample:
    a uniform k-subset of range(n) in random order.

    With k * k <= n a drawn row rarely repeats a position, so rows are drawn with replacement
    and those that repeat one are drawn again (B x k numbers, not the B x n of a permutation:
    a query with 3 distinct among 3000 tokens costs 1000 times less).

    >>> rows = _shuffled_first(10, 3, 500, torch.Generator().manual_seed(0))
    >>> rows.shape, bool((rows.sort(-1).values.diff(dim=-1) > 0).all())  # no repeats
    (torch.Size([500, 3]), True)
    """
    if k * k > n:
        return torch.rand(num, n, generator=generator).argsort(-1)[:, :k]
    rows = torch.randint(n, (num, k), generator=generator)
    while True:
        ordered = rows.sort(-1).values
        repeats = (ordered[:, 1:] == ordered[:, :-1]).any(-1)
        if not bool(repeats.any()):
            return rows
        rows[repeats] = torch.randint(n, (int(repeats.sum()), k), generator=generator)


def _kind_null(dz: Tensor, ranks: Tensor, num_distinct: int, num: int, generator):
    """Bias and AUROC [B, L, H] of one query with its token kinds shuffled: `dz` and `ranks`
    [L, H, N] over its distinct and common tokens, the first `num_distinct` distinct."""
    n = dz.shape[-1]
    d = num_distinct
    total = dz.sum(-1)  # [L, H]
    biases, aurocs = [], []
    step = max(1, MAX_ELEMENTS // max(1, dz[..., 0].numel() * d))
    for start in range(0, num, step):  # chunks of resamples, not one resample at a time
        pick = _shuffled_first(n, d, min(step, num - start), generator)  # [b, d]
        d_sum = dz[..., pick].sum(-1)  # [L, H, b]
        r_sum = ranks[..., pick].sum(-1)
        biases.append(d_sum / d - (total[..., None] - d_sum) / (n - d))
        aurocs.append((r_sum - d * (d + 1) / 2) / (d * (n - d)))
    return torch.cat(biases, -1).permute(2, 0, 1), torch.cat(aurocs, -1).permute(2, 0, 1)


def _ranks(x: Tensor) -> Tensor:
    """Ranks along the last axis, ties averaged (as scipy's rankdata)."""
    from scipy.stats import rankdata

    return torch.from_numpy(rankdata(x.numpy(), axis=-1))


def scan_uncertainty(
    traj: Trajectory,
    groups: TokenGroups,
    num_resamples: int = 1000,
    level: float = LEVEL,
    alpha: float = ALPHA,
    seed: int = 0,
) -> Measurement:
    """Intervals, p-values, baselines and the `scans` verdict of every head (see the module).

    Table, one row per layer and head: ``bias``, ``bias_lo``, ``bias_hi``, ``bias_p``,
    ``bias_baseline``; the same for ``auroc``; ``spearman_lo``, ``spearman_hi``,
    ``spearman_p``; ``entropy_lo``, ``entropy_hi`` (over distinct tokens);
    ``attention_entropy_lo``, ``attention_entropy_hi``; ``snap_step_lo``, ``snap_step_hi``
    (over the resamples that snapped) and ``snap_share`` (the share that did); ``scans``.
    Seeded (`seed`): the same call gives the same numbers.
    """
    groups.check_context(traj.plan)
    g = torch.Generator().manual_seed(seed)
    L, H = len(traj.layers), len(traj.heads)
    first, last = traj.zbar[0].double(), traj.zbar[-1].double()  # [L, H, Pz]
    out: dict[str, Tensor] = {}

    # ---- bias and AUROC: units are queries
    units = QueryTokens.of(traj, groups)
    if not units.query.numel():
        raise ValueError("no query has both distinct and common tokens in the trajectory")
    w = units.events
    z0 = first[..., units.slot]  # [L, H, N]
    dz = last[..., units.slot] - z0
    ranks = units.ranks(dz)  # shared by the AUROC and its null
    for name, x, r in (("", dz, ranks), ("_baseline", z0, None)):
        d_mean, c_mean = units.kind_means(x)
        values = {"bias": d_mean - c_mean, "auroc": units.auroc(x, r)}  # [L, H, U]
        for figure, v in values.items():
            v = v.permute(2, 0, 1)  # [U, L, H]
            out[figure + name] = _resampled_means(v, w, torch.ones(1, v.shape[0]).double())[0]
            if not name:
                out[f"{figure}_lo"], out[f"{figure}_hi"] = bootstrap_interval(
                    v, w, num_resamples, level, g
                )
    nulls = {"bias": 0.0, "auroc": 0.0}  # sum over queries of weight x null, [B, L, H]
    nd = units.num_distinct.tolist()
    for u, weight in enumerate(w):  # per query, vectorised over resamples and heads
        part = slice(int(units.start[u]), int(units.start[u + 1]))
        b_null, a_null = _kind_null(dz[..., part], ranks[..., part], nd[u], num_resamples, g)
        nulls["bias"] = nulls["bias"] + b_null * weight
        nulls["auroc"] = nulls["auroc"] + a_null * weight
    for name in ("bias", "auroc"):
        out[f"{name}_p"] = permutation_p(out[name], nulls[name] / w.sum())

    # ---- spearman and the entropy over distinct tokens: units are classes
    out.update(_class_figures(traj, groups, first, last, num_resamples, level, g))
    # ---- attention entropy: units are the tracked queries
    ent = traj.query_entropy[-1].double().permute(2, 0, 1)  # [Q, L, H]
    out["attention_entropy_lo"], out["attention_entropy_hi"] = bootstrap_interval(
        ent, traj.plan.query_events.double(), num_resamples, level, g
    )
    # ---- snap_step: units are the tracked classes
    out.update(_snap_interval(traj, min(num_resamples, 200), level, g))

    heads = L * H
    scans = (out["bias"] > 0) & (out["auroc_p"] < alpha / heads)
    table = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"])
    table = table.to_frame(index=False)
    for name, value in out.items():
        table[name] = value.reshape(-1).numpy()
    table["scans"] = scans.reshape(-1).numpy()
    table.attrs.update(level=level, alpha=alpha, heads=heads, resamples=num_resamples)
    return Measurement("uncertainty", table)


def _class_figures(traj, groups, first, last, num, level, g) -> dict[str, Tensor]:
    """Spearman (interval and p-value) and the entropy over distinct tokens (interval), with
    classes as units; tokens padded to the longest class so that every class is one row."""
    plan = traj.plan
    L, H = first.shape[:2]
    sizes = torch.tensor([t.numel() for t in groups.distinct])
    keep = sizes >= 2
    tracked = torch.zeros_like(keep)
    tracked[_tracked(traj, groups)] = True  # the classes `frequency_bias` averages
    keep &= tracked
    out = {}
    if not bool(keep.any()):
        nan = torch.full((L, H), math.nan, dtype=torch.float64)
        return {k: nan.clone() for k in ("spearman_lo", "spearman_hi", "spearman_p",
                                         "entropy_lo", "entropy_hi")}  # fmt: skip
    ks = keep.nonzero().flatten()
    n_max = int(sizes[ks].max())
    K = ks.numel()
    tokens = torch.zeros(K, n_max, dtype=torch.long)
    p = torch.full((K, n_max), math.nan, dtype=torch.float64)
    for row, k in enumerate(ks.tolist()):  # index arrays only; the values are gathered at once
        n = int(sizes[k])
        tokens[row, :n], p[row, :n] = groups.distinct[k], groups.distinct_p[k].double()
    valid = ~torch.isnan(p)
    queries = groups.query[ks][:, None].expand(K, n_max)
    slots = plan.pair_slot(queries.reshape(-1), tokens.reshape(-1)).reshape(K, n_max)
    valid &= slots >= 0
    # the tokens the recording holds first in each row: the null below shuffles the first
    # n_valid positions, which must be the valid ones (a held token may follow unheld ones)
    held_first = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
    valid, slots, p = (x.gather(-1, held_first) for x in (valid, slots, p))
    safe = slots.clamp_min(0)
    dz = (last[..., safe] - first[..., safe]).permute(2, 0, 1, 3)  # [K, L, H, N]
    weights = groups.events[ks].double()

    # Spearman per class: ranks within each class over its valid tokens
    big = torch.where(valid[:, None, None, :], dz, math.inf)
    rx = _masked_ranks(big, valid[:, None, None, :])
    rp = _masked_ranks(torch.where(valid, p, math.inf), valid)  # [K, N]
    n_valid = valid.sum(-1).double()  # [K]
    mean_rank = (n_valid + 1) / 2
    rx_c = torch.where(valid[:, None, None, :], rx - mean_rank[:, None, None, None], 0.0)
    rp_c = torch.where(valid, rp - mean_rank[:, None], 0.0)
    den = torch.sqrt((rx_c**2).sum(-1) * (rp_c**2).sum(-1)[:, None, None])  # [K, L, H]
    usable = (den > 0) & (n_valid >= 2)[:, None, None]
    rho = torch.where(usable, (rx_c * rp_c[:, None, None, :]).sum(-1) / den.clamp_min(1e-300),
                      math.nan)  # fmt: skip
    observed = _resampled_means(rho, weights, torch.ones(1, K, dtype=torch.float64))[0]
    out["spearman_lo"], out["spearman_hi"] = bootstrap_interval(rho, weights, num, level, g)
    # null: P shuffled within each class among its valid tokens, the weighted mean correlation
    # of each shuffle; only classes with a correlation take part, bucketed by their number of
    # valid tokens (powers of two) so that a row is at most half padding
    total = torch.zeros(num, L, H, dtype=torch.float64)
    total_w = torch.zeros(num, L, H, dtype=torch.float64)
    takes_part = usable.flatten(1).any(-1)
    bucket = torch.ceil(torch.log2(n_valid.clamp_min(1)))
    for b_id in torch.unique(bucket[takes_part]).tolist():
        rows = (takes_part & (bucket == b_id)).nonzero().flatten()
        width = int(n_valid[rows].max())  # the valid tokens come first in each row
        rx_b, rp_b = rx_c[rows][..., :width], rp_c[rows][:, :width]
        valid_b, usable_b, den_b = valid[rows][:, :width], usable[rows], den[rows]
        w_b = weights[rows][None, :, None, None]
        Kb = rows.numel()
        step = max(1, MAX_ELEMENTS // max(1, Kb * L * H * width))
        for start in range(0, num, step):
            b = min(step, num - start)
            keys = torch.where(valid_b[None], torch.rand(b, Kb, width, generator=g), math.inf)
            shuffled = torch.gather(rp_b.expand(b, Kb, width), 2, keys.argsort(-1))
            shuffled = torch.where(valid_b[None], shuffled, 0.0)
            num_ = torch.einsum("klhn,bkn->bklh", rx_b, shuffled)
            rho_b = torch.where(usable_b[None], num_ / den_b.clamp_min(1e-300)[None], math.nan)
            w_ok = torch.where(torch.isnan(rho_b), 0.0, w_b)
            total[start : start + b] += (torch.nan_to_num(rho_b) * w_ok).sum(1)
            total_w[start : start + b] += w_ok.sum(1)
    null = torch.where(total_w > 0, total / total_w.clamp_min(1e-300), math.nan)
    out["spearman_p"] = permutation_p(observed, null)

    out["entropy_lo"], out["entropy_hi"] = _entropy_interval(traj, groups, ks, num, level, g)
    return out


def _masked_ranks(x: Tensor, valid: Tensor) -> Tensor:
    """Ranks along the last axis among the valid entries (invalid ones hold +inf and rank last),
    ties averaged."""
    return _ranks(torch.where(valid, x, math.inf).expand(x.shape))


def _entropy_interval(traj, groups, ks, num, level, g) -> tuple[Tensor, Tensor]:
    """Interval of the entropy over distinct tokens (renormalised c_hat at the last step)."""
    plan = traj.plan
    last = traj.c_hat[-1].double()  # [L, H, Pc]
    ents, weights = [], []
    for k in ks.tolist():  # slot lookups per class; the values come from one loaded step
        c = plan.class_slot(int(groups.query[k]), int(groups.next_token[k]))
        if c is None:
            continue
        slot = plan.triple_slot(c, groups.distinct[k])
        vals = torch.where(slot >= 0, last[..., slot.clamp_min(0)], 0.0)  # [L, H, D]
        mass = vals.sum(-1, keepdim=True)
        q = vals / mass.clamp_min(1e-300)
        ent = -torch.special.xlogy(q, q).sum(-1)
        ents.append(torch.where(mass[..., 0] > 0, ent, math.nan))
        weights.append(1.0)  # `sparsity` averages classes with equal weight
    if not ents:
        nan = torch.full(last.shape[:2], math.nan, dtype=torch.float64)
        return nan, nan.clone()
    return bootstrap_interval(torch.stack(ents), torch.tensor(weights), num, level, g)


def _snap_interval(traj: Trajectory, num: int, level: float, g) -> dict[str, Tensor]:
    """snap_step of resampled classes (events-weighted movement, as `snapping`)."""
    L, H = len(traj.layers), len(traj.heads)
    nan = torch.full((L, H), math.nan, dtype=torch.float64)
    if traj.num_steps < 3:
        return {"snap_step_lo": nan, "snap_step_hi": nan.clone(), "snap_share": nan.clone()}
    move = class_movement(traj)  # [S-1, L, H, K]
    if move.shape[-1] < 2:
        return {"snap_step_lo": nan, "snap_step_hi": nan.clone(), "snap_share": nan.clone()}
    w = traj.plan.class_events.double()
    counts = _counts(move.shape[-1], num, g) * w  # [B, K]
    head_move = torch.einsum("slhk,bk->blhs", move, counts) / counts.sum(-1)[:, None, None, None]
    snaps, _, _ = snap_step(traj.steps, head_move)  # [B, L, H]
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    snapped = ~torch.isnan(snaps)
    lo, hi = torch.nanquantile(snaps, q, dim=0)
    share = snapped.double().mean(0)
    return {"snap_step_lo": lo, "snap_step_hi": hi, "snap_share": share}
