"""Snapping (Sec. 6): when attention stops moving.

`snap_step` is the primary estimate: the step at which the rate of attention movement has
fallen to half its peak, which nothing after it can move (horizon-independent);
`secondary_snap_steps` gives the secondary, horizon-dependent path-fraction and
rate-threshold steps; `snapping` measures every head and class of a trajectory.

In a stochastic run every step quantity here is read between the checkpoints where the
attention drifts (`drift_knots`; why, in docs/glossary.md under ``drift_checkpoints`` and
``straightness``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.resampling import (
    LEVEL,
    MIN_UNITS,
    kish,
    resample_counts,
    with_grid,
)
from scansnap_lens.recording.plan import find_sorted
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "CLEAN_ABOVE",
    "DRIFT_ABOVE",
    "NOISY_BELOW",
    "NOT_YET_SNAPPED",
    "NO_SCAN",
    "class_movement",
    "comparable_intervals",
    "drift_knots",
    "half_steps",
    "head_movement",
    "secondary_snap_steps",
    "snap_step",
    "snap_step_interval",
    "snapping",
    "straightness",
]


NOT_YET_SNAPPED = "not yet snapped"
NO_SCAN = "no scan"


def snap_step(steps: Tensor, moves: Tensor, fraction: float = 0.5, grid: bool = False) -> tuple:
    """The snapping time as a property of the dynamics: the step at which the attention's
    rate of movement per step, past its peak, has fallen to `fraction` of that peak.

    The theory (Sec. 6): the logits grow fastest near t0' and, after t0, only
    logarithmically, so their rate of change falls like 1/t.  Each interval's rate is placed
    at its (logarithmic) midpoint and interpolated linearly; the crossing depends on nothing
    after it.  Intervals far shorter than both neighbours are merged first
    (`comparable_intervals`).

    steps: [S] ascending; moves: [..., S - 1] movement between consecutive checkpoints.
    Returns (snap [...], peak [...], reasons): the snap step and the step of peak rate (NaN
    where undefined), and per entry (flattened) "" or why the snap is NaN: "no scan" (the map
    never moves), "not yet snapped" (the run ends before the rate has fallen that far).  With
    `grid`, also (lo [...], hi [...]) and (peak_lo [...], peak_hi [...]): the checkpoints that
    bracket the snap and the peak for a rate that rises to one peak and falls (docs/glossary.md,
    ``snap_step_grid_lo`` and ``rate_peak_step_grid_lo``).

    >>> steps = torch.tensor([0, 10, 20, 30, 40, 50])
    >>> snap, peak, why = snap_step(steps, torch.tensor([1.0, 4.0, 3.0, 1.0, 0.5]))
    >>> round(snap.item(), 1), round(peak.item(), 1), why
    (29.3, 14.5, [''])
    >>> snap_step(steps, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))[2]
    ['not yet snapped']
    >>> [t.item() for t in snap_step(steps, torch.tensor([1.0, 4.0, 3.0, 1.0, 0.5]), grid=True)[3:]]
    [10.0, 40.0, 0.0, 30.0]
    """
    steps, moves = torch.as_tensor(steps), torch.as_tensor(moves)
    if steps.ndim != 1 or steps.numel() < 2:
        raise ValueError(
            f"steps must be [S] with S >= 2 checkpoints, got shape {tuple(steps.shape)}"
        )
    if moves.ndim < 1 or moves.shape[-1] != steps.numel() - 1:
        raise ValueError(
            f"moves must be [..., S - 1] = [..., {steps.numel() - 1}] (one per interval between"
            f" the {steps.numel()} steps), got shape {tuple(moves.shape)}"
        )
    keep = comparable_intervals(steps)
    if not bool(keep.all()):  # movement over the merged intervals: the sum of their parts
        cum = torch.cat([torch.zeros_like(moves[..., :1]), moves.cumsum(-1)], -1)
        moves, steps = torch.diff(cum[..., keep], dim=-1), steps[keep]
    t = steps.double()
    rate = moves.double() / torch.diff(t).clamp_min(1e-300)
    mid = _log_midpoints(t)
    x = torch.log1p(mid - t[0])  # crossings are interpolated on a log axis
    shape = rate.shape[:-1]
    r = rate.reshape(-1, rate.shape[-1])  # [N, S - 1]: every head or class at once
    p = torch.argmax(r, -1)
    top = r.gather(-1, p[:, None])[:, 0]
    scanned = top > 0
    level = top * fraction
    after = torch.arange(r.shape[-1])[None, :] > p[:, None]
    crossed = after & (r <= level[:, None])
    snapped = scanned & crossed.any(-1)
    i = crossed.double().argmax(-1)  # the first crossing past the peak (where snapped)
    h = (i - 1).clamp_min(0)
    r_before, r_at = r.gather(-1, h[:, None])[:, 0], r.gather(-1, i[:, None])[:, 0]
    share = (r_before - level) / (r_before - r_at).clamp_min(1e-300)
    snap = torch.expm1(x[h] + share * (x[i] - x[h])) + t[0]
    snap = torch.where(snapped, snap, math.nan)
    peak = torch.where(scanned, mid[p], math.nan)
    reasons = [
        "" if ok else (NO_SCAN if not moved else NOT_YET_SNAPPED)
        for ok, moved in zip(snapped.tolist(), scanned.tolist())
    ]
    if grid:
        brackets = _grid_brackets(t, r, p, i, fraction, snapped, scanned)
        return (
            snap.reshape(shape),
            peak.reshape(shape),
            reasons,
            *(b.reshape(shape) for b in brackets),
        )
    return snap.reshape(shape), peak.reshape(shape), reasons


def _log_midpoints(t: Tensor) -> Tensor:
    """[S - 1] where each interval of the steps t [S] places its mean rate: the logarithmic
    mean of its ends (in 1 + t).  For a rate falling like 1/t the interval's mean rate is the
    rate there exactly, so wide log-spaced intervals place it right; narrow intervals give
    the plain midpoint."""
    lo, hi = torch.log1p(t[:-1] - t[0]), torch.log1p(t[1:] - t[0])
    width = hi - lo
    mid = torch.where(
        width > 1e-9, torch.expm1(hi) - torch.expm1(lo), (t[1:] - t[:-1])
    ) / torch.where(width > 1e-9, width, 1.0)
    return torch.where(width > 1e-9, mid - 1, (t[1:] + t[:-1]) / 2 - t[0]) + t[0]


def _grid_brackets(
    t: Tensor, r: Tensor, p: Tensor, i: Tensor, fraction: float, snapped: Tensor, scanned: Tensor
) -> tuple[Tensor, ...]:
    """`snap_step`'s (lo, hi, peak_lo, peak_hi) [N]: the checkpoints that bracket the snap and
    the peak, from the rates r [N, S - 1], their peak interval p and first crossing i.

    The rate falls past the level before the end of the first interval below it.  The level
    is half the true peak, which an interval's mean rate underestimates (most where the peak's
    interval is wide): at most the peak interval's mean plus its step down to the lower
    neighbour (a missing one counts 0).  The crossing comes after the start of the last
    interval above half of that, else of the peak's."""
    n = r.shape[-1]
    top = r.gather(-1, p[:, None])[:, 0]
    left = torch.where(p > 0, r.gather(-1, (p - 1).clamp_min(0)[:, None])[:, 0], 0.0)
    right = torch.where(p < n - 1, r.gather(-1, (p + 1).clamp_max(n - 1)[:, None])[:, 0], 0.0)
    highest = fraction * (2 * top - torch.minimum(left, right))
    index = torch.arange(n)[None, :]
    surely = (index > p[:, None]) & (index < i[:, None]) & (r > highest[:, None])
    last_above = torch.where(surely.any(-1), (index * surely).amax(-1), p)
    return (
        torch.where(snapped, t[last_above], math.nan),
        torch.where(snapped, t[(i + 1).clamp_max(t.numel() - 1)], math.nan),
        torch.where(scanned, t[(p - 1).clamp_min(0)], math.nan),
        torch.where(scanned, t[(p + 2).clamp_max(t.numel() - 1)], math.nan),
    )


def comparable_intervals(steps: Tensor, ratio: float = 0.25) -> Tensor:
    """[S] bool: the checkpoints `snap_step` keeps, dropping the inner end of each interval
    whose width on the log(1 + step) axis is under `ratio` times both its neighbours' (merged
    with the shorter neighbour; the first and last checkpoints stay).

    >>> comparable_intervals(torch.tensor([0, 128, 250, 256, 500, 512, 750])).tolist()
    [True, True, False, True, True, False, True]
    """
    t = torch.as_tensor(steps).double()
    keep = torch.ones(t.numel(), dtype=torch.bool)
    if t.numel() < 4:
        return keep
    x = torch.log1p(t - t[0])
    width = torch.diff(x)
    left = torch.cat([width.new_full((1,), math.inf), width[:-1]])
    right = torch.cat([width[1:], width.new_full((1,), math.inf)])
    short = width < ratio * torch.minimum(left, right)
    for i in torch.nonzero(short).reshape(-1).tolist():  # one per short interval: few
        end = i if left[i] <= right[i] else i + 1  # the boundary shared with the shorter one
        if 0 < end < t.numel() - 1 and keep[end - 1 : end + 2].all():
            keep[end] = False
    return keep


def secondary_snap_steps(
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
    >>> path, rate = secondary_snap_steps(steps, torch.tensor([0.5, 0.3, 0.15, 0.01]))
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


def class_movement(traj: Trajectory) -> Tensor:
    """[S - 1, L, H, K] the total variation of each class's c_hat between consecutive
    checkpoints, 0.5 * sum_l |c_hat(s + 1) - c_hat(s)|: one pass over the steps, three
    checkpoints in memory at a time."""
    return _movements(traj)[0]


def _movements(traj: Trajectory, w: Tensor | None = None, keep: Tensor | None = None, weights=None):
    """One pass over the steps: (move [S - 1, L, H, K], straight, path, ends).

    move: each class's total variation between consecutive checkpoints or, with `keep`
    [L, H, S] (`drift_knots`), between a head's consecutive knots: the entry of interval
    s - 1 holds the movement from the head's knot before checkpoint s to s where s is a
    knot, 0 elsewhere.  With class weights `w` [K] also straight and path [L, H], the weighted
    total variation between every checkpoint and the one after next and over the two
    intervals between, summed (`straightness`), and ends [2, S, B, L, H] the weighted total
    variation from the first checkpoint and to the last (`half_steps`) for each row of
    `weights` [B, K] (default: `w` alone), summed as it goes rather than kept per class;
    else None for those."""
    plan = traj.plan
    S = traj.num_steps
    L, H = len(traj.layers), len(traj.heads)
    out = torch.zeros(max(S - 1, 0), L, H, plan.num_classes, dtype=torch.float64)
    if w is None or not S:
        straight = path = ends = None
    else:
        straight = torch.zeros(L, H, dtype=torch.float64)
        path = torch.zeros(L, H, dtype=torch.float64)
        weights = (w[None] if weights is None else weights).double()  # [B, K]
        ends = torch.zeros(2, S, weights.shape[0], L, H, dtype=torch.float64)
        total = weights.sum(-1).clamp_min(1e-300)[:, None, None]

        def weighted(x: Tensor) -> Tensor:  # [L, H, K] -> [B, L, H]
            return torch.einsum("lhk,bk->blh", x, weights) / total

    first = traj.c_hat[0].double() if S else None
    last = traj.c_hat[S - 1].double() if ends is not None else None
    c, knot = [first], first
    for s in range(1, S):
        c.append(traj.c_hat[s].double())
        step = _moved(plan, c[-2], c[-1])
        if keep is None:
            out[s - 1] = step
        else:
            k = keep[..., s, None]
            moved = step if bool(keep[..., s - 1].all()) else _moved(plan, knot, c[-1])
            out[s - 1] = moved * k
            knot = torch.where(k, c[-1], knot)
        if w is not None:
            path += (step @ w) * ((s > 1) + (s < S - 1))
            if len(c) == 3:
                straight += _moved(plan, c[0], c[2]) @ w
            ends[0, s] = weighted(_moved(plan, first, c[-1]))
            ends[1, s - 1] = weighted(_moved(plan, c[-2], last))
        if len(c) == 3:
            c.pop(0)
    return out, straight, path, ends


def _moved(plan, before: Tensor, now: Tensor) -> Tensor:
    """[..., K] each class's total variation between two checkpoints' c_hat [..., Pc]."""
    out = torch.zeros(*now.shape[:-1], plan.num_classes, dtype=torch.float64)
    out.index_add_(-1, plan.triple_class, (now.double() - before.double()).abs_())
    return out.mul_(0.5)


def head_movement(plan, before: Tensor, now: Tensor) -> Tensor:
    """[...] a head's movement between two checkpoints' c_hat [..., Pc]: the events-weighted
    mean of its classes' total variation (`snapping`'s movement over every tracked class)."""
    w = plan.class_events.double()
    return (_moved(plan, before, now) * w).sum(-1) / w.sum().clamp_min(1e-300)


NOISY_BELOW = 0.85  # straightness under which the movement is mostly step-to-step noise


def straightness(traj: Trajectory, slots: Tensor | None = None, moves=None) -> Tensor:
    """[L, H] how straight the attention moves between checkpoints (docs/glossary.md,
    ``straightness``): over every two consecutive intervals (a, b), (b, c), the movement a to
    c over a to b plus b to c, summed over the pairs; the movement is the events-weighted
    total variation of the classes' c_hat (the classes `slots`, default all).  NaN below
    three checkpoints.  `moves`: what `_movements` returns for these weights, where already
    computed."""
    L, H, S = len(traj.layers), len(traj.heads), traj.num_steps
    if S < 3:
        return torch.full((L, H), math.nan, dtype=torch.float64)
    _, straight, path, _ = moves if moves is not None else _movements(traj, _weights(traj, slots))
    return torch.where(path > 0, straight / path.clamp_min(1e-300), math.nan)


def _weights(traj: Trajectory, slots: Tensor | None) -> Tensor:
    """[K] the classes' event counts, zero outside `slots`."""
    w = traj.plan.class_events.double()
    if slots is None:
        return w
    return torch.zeros_like(w).index_fill_(0, slots, 1.0) * w


DRIFT_ABOVE = 0.85  # a split's pooled straightness at which its halves move as a drift
CLEAN_ABOVE = 0.97  # ... at which they move with little noise: finer splits must match it
POOL = 6  # splits of the same depth pooled on each side
_BALANCED = 0.5  # halves within 2x of each other's movement: their straightness shows noise


def split_tree(steps: Tensor) -> list[tuple[int, int, int, int]]:
    """The splits (a, b, c, depth) of checkpoint indices, parents first: [0, S - 1] at the
    checkpoint b nearest the middle of log(1 + step), then each half likewise down to
    adjacent checkpoints.

    >>> split_tree(torch.tensor([0, 1, 3, 7, 15]))
    [(0, 2, 4, 0), (2, 3, 4, 1), (0, 1, 2, 1)]
    """
    x = torch.log1p(torch.as_tensor(steps).double() - float(steps[0])).tolist()
    out, stack = [], [(0, len(x) - 1, 0)]
    while stack:
        a, c, depth = stack.pop()
        if c - a < 2:
            continue
        mid = (x[a] + x[c]) / 2
        b = min(range(a + 1, c), key=lambda i: abs(x[i] - mid))
        out.append((a, b, c, depth))
        stack += [(a, b, depth + 1), (b, c, depth + 1)]
    return out


def _pair_distances(traj: Trajectory, pairs, w: Tensor) -> dict:
    """{(i, j): [L, H]} the w-weighted mean total variation of the classes' c_hat between
    checkpoints i < j: one pass over the steps, holding each checkpoint until its last pair."""
    ends: dict[int, list[int]] = {}
    last_use: dict[int, int] = {}
    for i, j in pairs:
        ends.setdefault(j, []).append(i)
        last_use[i] = max(last_use.get(i, -1), j)
    total = w.sum().clamp_min(1e-300)
    held: dict[int, Tensor] = {}
    out = {}
    for j in sorted(set(ends) | set(last_use)):
        c = traj.c_hat[j].double()
        for i in ends.get(j, []):
            out[(i, j)] = (_moved(traj.plan, held[i], c) @ w) / total
        for i in [i for i in held if last_use[i] <= j]:
            del held[i]
        if last_use.get(j, -1) > j:
            held[j] = c
    return out


def drift_knots(traj: Trajectory, slots: Tensor | None = None) -> Tensor:
    """[L, H, S] bool: per head, the checkpoints between which the attention moves as a drift
    (docs/glossary.md, ``drift_checkpoints``): the halves of each split (`split_tree`) kept
    where their straightness, pooled over `POOL` splits of the same depth on each side, is at
    least `DRIFT_ABOVE` (at least `CLEAN_ABOVE` below a clean, even split).  Every checkpoint
    where the attention drifts.  Movement is that of `straightness` (classes `slots`)."""
    L, H, S = len(traj.layers), len(traj.heads), traj.num_steps
    keep = torch.ones(L, H, S, dtype=torch.bool)
    if S < 3:
        return keep
    nodes = split_tree(traj.steps)
    pairs = {p for a, b, c, _ in nodes for p in ((a, c), (a, b), (b, c))}
    d = _pair_distances(traj, pairs, _weights(traj, slots))
    pooled, balance = {}, {}
    for depth in sorted({n[3] for n in nodes}):
        level = sorted((a, b, c) for a, b, c, n in nodes if n == depth)
        num = torch.stack([d[(a, c)] for a, _, c in level])  # [n, L, H]
        den = torch.stack([d[(a, b)] + d[(b, c)] for a, b, c in level])
        s = torch.where(den > 0, num / den.clamp_min(1e-300), 1.0)  # each split alike
        cum = torch.cat([torch.zeros_like(s[:1]), s.cumsum(0)])
        for i, (a, b, c) in enumerate(level):
            lo, hi = max(0, i - POOL), min(len(level), i + POOL + 1)
            pooled[(a, c)] = (cum[hi] - cum[lo]) / (hi - lo)
            small = torch.minimum(d[(a, b)], d[(b, c)])
            large = torch.maximum(d[(a, b)], d[(b, c)])
            balance[(a, c)] = torch.where(large > 0, small / large.clamp_min(1e-300), 1.0)
    keep.zero_()
    keep[..., 0] = keep[..., -1] = True
    live = {(0, S - 1): torch.ones(L, H, dtype=torch.bool)}
    clean = {(0, S - 1): torch.zeros(L, H, dtype=torch.bool)}
    for a, b, c, _ in nodes:  # parents first
        s = pooled[(a, c)]
        split = live[(a, c)] & ((s >= CLEAN_ABOVE) | ((s >= DRIFT_ABOVE) & ~clean[(a, c)]))
        keep[..., b] |= split
        now = clean[(a, c)] | ((s >= CLEAN_ABOVE) & (balance[(a, c)] >= _BALANCED))
        live[(a, b)] = live[(b, c)] = split
        clean[(a, b)] = clean[(b, c)] = now
    return keep


def _knot_groups(keep: Tensor) -> list[tuple[Tensor, Tensor]]:
    """[(mask [S], heads [n])]: the heads (flat indices into L * H) sharing each set of knots."""
    flat = keep.reshape(-1, keep.shape[-1])
    masks, which = torch.unique(flat, dim=0, return_inverse=True)
    return [(masks[g], torch.nonzero(which == g).reshape(-1)) for g in range(masks.shape[0])]


def _noisy_bracket(steps: Tensor, lo: Tensor, hi: Tensor, everything: bool):
    """A bracket over knots that left checkpoints out, one knot wider on each side: the rate
    of each knot interval still carries noise up to about the drift's own (`DRIFT_ABOVE`), so
    the crossing is placed only within a knot either way."""
    if everything:
        return lo, hi
    t = steps.double()
    before = t[(torch.searchsorted(t, lo.contiguous()) - 1).clamp_min(0)]
    after = t[(torch.searchsorted(t, hi.contiguous(), right=True)).clamp_max(t.numel() - 1)]
    return torch.where(torch.isnan(lo), lo, before), torch.where(torch.isnan(hi), hi, after)


def half_steps(steps: Tensor, to_first: Tensor, to_last: Tensor) -> dict[str, Tensor]:
    """Two snap steps that are functions of the attention's state, not of its rate:
    ``half_displacement_step``, where the distance from the first checkpoint's attention
    (`to_first` [..., S]) first reaches half its final value, and ``half_distance_step``,
    where the distance to the last checkpoint's (`to_last` [..., S]) first falls to half its
    first value; each interpolated on the log(1 + step) axis between the checkpoints around
    the crossing, which ``..._grid_lo``/``_hi`` give.  Noise moves them far less than it
    moves a rate, but both depend on where the run ends (a longer run moves the last
    checkpoint's attention and the net displacement).

    >>> out = half_steps(torch.tensor([0, 10, 20, 40]), torch.tensor([0.0, 1.0, 3.0, 4.0]),
    ...                  torch.tensor([4.0, 3.0, 1.0, 0.0]))
    >>> round(out["half_displacement_step"].item(), 1), out["half_distance_step_grid_hi"].item()
    (14.2, 20.0)
    """
    t = torch.as_tensor(steps).double()
    x = torch.log1p(t - t[0])
    out = {}
    for name, value, sign in (
        ("half_displacement_step", to_first, 1.0),
        ("half_distance_step", to_last, -1.0),
    ):
        v = sign * value.double()
        level = sign * 0.5 * (value[..., -1:] if sign > 0 else value[..., :1]).double()
        reached = (v >= level) & (value.double().amax(-1, keepdim=True) > 0)
        some = reached[..., 1:].any(-1)
        i = (reached[..., 1:].double().argmax(-1) + 1).clamp_max(t.numel() - 1)
        before, at = v.gather(-1, (i - 1)[..., None])[..., 0], v.gather(-1, i[..., None])[..., 0]
        share = ((level[..., 0] - before) / (at - before).clamp_min(1e-300)).clamp(0, 1)
        step = torch.expm1(x[i - 1] + share * (x[i] - x[i - 1])) + t[0]
        out[name] = torch.where(some, step, math.nan)
        out[f"{name}_grid_lo"] = torch.where(some, t[i - 1], math.nan)
        out[f"{name}_grid_hi"] = torch.where(some, t[i], math.nan)
    return out


def snap_step_interval(
    traj: Trajectory, num: int = 200, level: float = LEVEL, generator=None
) -> dict[str, Tensor]:
    """[L, H] the intervals of `snapping`'s snap_step and its companions: the percentile
    interval with the tracked classes as the units (resampled with replacement, each weighted
    by its events as `snapping` weighs them) over the resamples that give a step, each over
    the head's `drift_knots`, widened to the knots that bracket the crossing
    (`resampling.with_grid`; ``snap_step_grid_lo``/``_hi``): ``snap_step_lo``,
    ``snap_step_hi``, ``snap_share`` (the share of resamples that snapped),
    ``snap_step_n_eff`` (Kish's n_eff of the class events), and ``half_distance_step_lo``/
    ``_hi``, ``half_displacement_step_lo``/``_hi`` (`half_steps`); no interval below
    `resampling.MIN_UNITS` effective classes or three checkpoints."""
    L, H = len(traj.layers), len(traj.heads)
    nan = torch.full((L, H), math.nan, dtype=torch.float64)
    w = traj.plan.class_events.double()
    n_eff = kish(w).expand(L, H).clone()
    out = {
        "snap_step_lo": nan,
        "snap_step_hi": nan.clone(),
        "snap_share": nan.clone(),
        "snap_step_n_eff": n_eff,
        "snap_step_grid_lo": nan.clone(),
        "snap_step_grid_hi": nan.clone(),
    }
    for name in HALF_STEPS:
        out[f"{name}_lo"], out[f"{name}_hi"] = nan.clone(), nan.clone()
    if traj.num_steps < 3 or float(n_eff[0, 0]) < MIN_UNITS:
        return out
    keep = drift_knots(traj)
    K = w.numel()
    counts = resample_counts(K, num, generator) * w  # [B, K]
    rows = torch.cat([w[None], counts])  # the point estimate, then each resample
    move, _, _, ends = _movements(traj, w, keep, rows)  # [S-1, L, H, K], [2, S, 1 + B, L, H]
    S = traj.num_steps
    flat = {key: value.reshape(L * H) for key, value in out.items()}
    for mask, heads in _knot_groups(keep):
        steps = traj.steps[mask]
        m = move.reshape(S - 1, L * H, K)[mask[1:]][:, heads]  # [S', n, K]
        e = ends.reshape(2, S, 1 + num, L * H)[:, mask][..., heads].transpose(1, 2)
        stat = snap_step(
            steps, (torch.einsum("snk,bk->bns", m, counts) / counts.sum(-1)[:, None, None])
        )[0]  # [B, n]
        halves = half_steps(steps, e[0, 1:].transpose(-1, -2), e[1, 1:].transpose(-1, -2))
        head_move = torch.einsum("snk,k->ns", m, w) / w.sum()
        _, _, _, grid_lo, grid_hi = snap_step(steps, head_move[None], grid=True)[:5]
        grid_lo, grid_hi = _noisy_bracket(steps, grid_lo, grid_hi, len(steps) == S)
        point = half_steps(steps, e[0, :1].transpose(-1, -2), e[1, :1].transpose(-1, -2))
        q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
        for name, values, glo, ghi in (
            ("snap_step", stat, grid_lo[0], grid_hi[0]),
            *(
                (n, halves[n], point[f"{n}_grid_lo"][0], point[f"{n}_grid_hi"][0])
                for n in HALF_STEPS
            ),
        ):
            lo, hi = torch.nanquantile(values.double(), q, dim=0)
            lo, hi = with_grid(lo, hi, glo, ghi)
            flat[f"{name}_lo"][heads], flat[f"{name}_hi"][heads] = lo, hi
        flat["snap_share"][heads] = (~torch.isnan(stat)).double().mean(0)
        flat["snap_step_grid_lo"][heads], flat["snap_step_grid_hi"][heads] = grid_lo[0], grid_hi[0]
    return {key: value.reshape(L, H) for key, value in flat.items()}


HALF_STEPS = ("half_distance_step", "half_displacement_step")
NO_DRIFT = "moved by noise at every spacing: the run cannot place it"


def snapping(
    traj: Trajectory,
    groups: TokenGroups | None = None,
    fraction: float = 0.9,
    rate_fraction: float = 0.1,
    snap_fraction: float = 0.5,
    classes=None,
) -> Measurement:
    """Snap steps per head (table) and per class (detail), each read over the head's
    `drift_knots` (every checkpoint where the attention drifts).

    Columns: ``snap_step`` (primary, `snap_step`: the rate of movement per step has fallen to
    `snap_fraction` of its peak; horizon-independent), ``snap_step_grid_lo``/``_hi`` (the
    knots that bracket it: the checkpoints, and the drift, know it no better),
    ``rate_peak_step`` (where that rate peaks) with ``rate_peak_step_grid_lo``/``_hi``,
    ``snap_reason`` (why ``snap_step`` is NaN), ``drift_checkpoints`` (how many of the
    ``checkpoints`` the drift resolves: fewer where step-to-step noise dominates the movement
    between them), ``straightness`` (`straightness`), the state functions
    ``half_distance_step`` and ``half_displacement_step`` with their ``_grid_lo``/``_hi``
    (`half_steps`: they depend on where the run ends), and the secondary, horizon-dependent
    ``snap_path`` and ``snap_rate`` (`secondary_snap_steps`).  The movement of a class between
    checkpoints is the total variation of its c_hat; a head's movement is the events-weighted
    mean over classes (the classes of `groups` if given, or `classes`, pairs (m, n), else every
    tracked class).
    """
    if traj.num_steps < 2:
        raise ValueError("snapping needs at least two checkpoints")
    plan = traj.plan
    slots = _class_slots(plan, groups, classes)
    weights = _weights(traj, slots)
    keep = drift_knots(traj, slots)
    both = _movements(traj, weights, keep)
    S, L, H = traj.num_steps, len(traj.layers), len(traj.heads)
    K = len(slots)
    move = both[0][..., slots].reshape(S - 1, L * H, K)  # between each head's knots
    ends = both[3][:, :, 0]  # [2, S, L, H]
    w = plan.class_events[slots].double()
    head = {name: torch.full((L * H,), math.nan, dtype=torch.float64) for name in _HEAD_COLUMNS}
    per_class = {
        name: torch.full((K, L * H), math.nan, dtype=torch.float64)
        for name in ("snap_step", "snap_path", "snap_rate")
    }
    reasons = [""] * (L * H)
    for mask, heads in _knot_groups(keep):
        steps = traj.steps[mask]
        m = move[mask[1:]][:, heads].permute(2, 1, 0)  # [K, n, S' - 1]
        head_move = torch.einsum("kns,k->ns", m, w) / w.sum()
        snap, peak, why, grid_lo, grid_hi, peak_lo, peak_hi = snap_step(
            steps, head_move, snap_fraction, grid=True
        )
        grid_lo, grid_hi = _noisy_bracket(steps, grid_lo, grid_hi, len(steps) == S)
        path, rate = secondary_snap_steps(steps, head_move, fraction, rate_fraction)
        e = ends[:, mask].reshape(2, int(mask.sum()), L * H)[:, :, heads]
        halves = half_steps(steps, e[0].T, e[1].T)
        found = dict(
            snap_step=snap,
            snap_step_grid_lo=grid_lo,
            snap_step_grid_hi=grid_hi,
            rate_peak_step=peak,
            rate_peak_step_grid_lo=peak_lo,
            rate_peak_step_grid_hi=peak_hi,
            snap_path=path,
            snap_rate=rate,
            **halves,
        )
        for name, value in found.items():
            head[name][heads] = value
        head["drift_checkpoints"][heads] = float(mask.sum())
        for i, h in enumerate(heads.tolist()):
            reasons[h] = NO_DRIFT if why[i] and int(mask.sum()) == 2 < S else why[i]
        per_class["snap_step"][:, heads] = snap_step(steps, m, snap_fraction)[0]
        path_k, rate_k = secondary_snap_steps(steps, m, fraction, rate_fraction)
        per_class["snap_path"][:, heads], per_class["snap_rate"][:, heads] = path_k, rate_k
    table = _snapping_table(traj, head, reasons)
    table["straightness"] = straightness(traj, slots, both).reshape(-1).numpy()
    for name in _HEAD_COLUMNS[6:]:
        if name != "drift_checkpoints":
            table[name] = head[name].numpy()
    table["step_unit"] = traj.step_unit
    detail = pd.DataFrame(
        {
            "layer": np.tile(np.repeat(traj.layers, H), K),
            "head": np.tile(traj.heads, K * L),
            "query": np.repeat(plan.class_query[slots].numpy(), L * H),
            "next": np.repeat(plan.class_next[slots].numpy(), L * H),
            **{name: value.reshape(-1).numpy() for name, value in per_class.items()},
        }
    )
    return Measurement("snapping", table, detail)


def _snapping_table(traj, head: dict[str, Tensor], reasons: list[str]) -> pd.DataFrame:
    """`snapping`'s table up to ``checkpoints``: each head's snap, its brackets, its rate's
    peak and why a snap is missing."""
    index = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"])
    table = index.to_frame(index=False)
    for name in _HEAD_COLUMNS[:6]:
        table[name] = head[name].numpy()
    table["snap_reason"] = reasons
    table["drift_checkpoints"] = head["drift_checkpoints"].numpy().astype(int)
    table["checkpoints"] = traj.num_steps
    return table


def _class_slots(plan, groups: TokenGroups | None, classes) -> Tensor:
    """[K] the plan's slots of the classes of `groups`, or of `classes` (pairs (m, n)), else
    of every tracked class; ValueError where none is tracked."""
    if groups is not None:
        classes = zip(groups.query.tolist(), groups.next_token.tolist())
    if classes is None:
        if not plan.num_classes:
            raise ValueError("no tracked class to measure")
        return torch.arange(plan.num_classes)
    pairs = torch.as_tensor(list(classes), dtype=torch.long).reshape(-1, 2)
    found = find_sorted(plan.class_keys, pairs[:, 0] * plan.vocab_size + pairs[:, 1])
    if not (found >= 0).any():
        raise ValueError("no tracked class to measure")
    return found[found >= 0]


_HEAD_COLUMNS = (
    "snap_step",
    "snap_step_grid_lo",
    "snap_step_grid_hi",
    "rate_peak_step",
    "rate_peak_step_grid_lo",
    "rate_peak_step_grid_hi",
    "drift_checkpoints",
    "half_distance_step",
    "half_distance_step_grid_lo",
    "half_distance_step_grid_hi",
    "half_displacement_step",
    "half_displacement_step_grid_lo",
    "half_displacement_step_grid_hi",
    "snap_path",
    "snap_rate",
)
