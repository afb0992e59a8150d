"""Snapping (Sec. 6): when attention stops moving.

`snap_step` is the primary estimate: the step at which the rate of attention movement has
fallen to half its peak, which nothing after it can move (horizon-independent);
`secondary_snap_steps` gives the secondary, horizon-dependent path-fraction and
rate-threshold steps; `snapping` measures every head and class of a trajectory.
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
    bootstrap_percentile,
    kish,
    with_grid,
)
from scansnap_lens.recording.plan import find_sorted
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "NOISY_BELOW",
    "NOT_YET_SNAPPED",
    "NO_SCAN",
    "class_movement",
    "comparable_intervals",
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
    logarithmically, so their rate of change falls like 1/t.  The crossing is found with the
    rate of each interval placed at its midpoint and interpolated linearly, and it depends on
    nothing after it: training longer does not move it.

    steps: [S] ascending; moves: [..., S - 1] movement between consecutive checkpoints.
    Returns (snap [...], peak [...], reasons): the snap step and the step of peak rate (NaN
    where undefined), and per entry (flattened) "" or why the snap is NaN: "no scan" (the map
    never moves), "not yet snapped" (the run ends before the rate has fallen that far).  With
    `grid`, also (lo [...], hi [...]): what the checkpoints allow for a rate that rises to one
    peak and falls: up to the end of the first interval below the level, from the start of
    the last interval above the highest level the true peak allows (an interval's mean rate
    underestimates its peak; see the code), else from the start of the peak's interval; and
    (peak_lo [...], peak_hi [...]): where such a rate can peak, from the start of the interval
    before the highest to the end of the one after it (a peak further off would make a
    neighbour's mean rate the highest).

    An interval far shorter than both its neighbours on the log-step axis (under a quarter of
    the shorter, `comparable_intervals`) is merged with the shorter neighbour first: in a
    stochastic run the movement over a few steps is mostly step-to-step noise, which per step
    is the larger the shorter the interval (Pythia's schedule pairs 250 with 256 and 500 with
    512: there the rate of every head of a small run was 7 times its neighbours' and took the
    peak; see docs/glossary.md).

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
    # what the checkpoints allow.  The rate falls past the level before the end of the first
    # interval below it.  The level is half the true peak, which an interval's mean rate
    # underestimates (most where the peak's interval is wide): at most the peak interval's
    # mean plus its step down to the lower neighbour (a missing one counts 0).  The crossing
    # comes after the start of the last interval above half of that, else of the peak's.
    n = r.shape[-1]
    left = torch.where(p > 0, r.gather(-1, (p - 1).clamp_min(0)[:, None])[:, 0], 0.0)
    right = torch.where(p < n - 1, r.gather(-1, (p + 1).clamp_max(n - 1)[:, None])[:, 0], 0.0)
    highest = fraction * (2 * top - torch.minimum(left, right))
    index = torch.arange(n)[None, :]
    surely = after & (index < i[:, None]) & (r > highest[:, None])
    last_above = torch.where(surely.any(-1), (index * surely).amax(-1), p)
    grid_lo = torch.where(snapped, t[last_above], math.nan).reshape(shape)
    grid_hi = torch.where(snapped, t[(i + 1).clamp_max(t.numel() - 1)], math.nan).reshape(shape)
    peak_lo = torch.where(scanned, t[(p - 1).clamp_min(0)], math.nan).reshape(shape)
    peak_hi = torch.where(scanned, t[(p + 2).clamp_max(t.numel() - 1)], math.nan).reshape(shape)
    if grid:
        return snap.reshape(shape), peak.reshape(shape), reasons, grid_lo, grid_hi, peak_lo, peak_hi
    return snap.reshape(shape), peak.reshape(shape), reasons


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


def _movements(traj: Trajectory, w: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """`class_movement`, and with class weights `w` [K] also [L, H] the weighted total
    variation between every checkpoint and the one after next, summed (`straightness`), in
    the same pass."""
    plan = traj.plan
    S = traj.num_steps
    out = torch.zeros(max(S - 1, 0), len(traj.layers), len(traj.heads), plan.num_classes,
                      dtype=torch.float64)  # fmt: skip
    straight = None if w is None else torch.zeros(*out.shape[1:3], dtype=torch.float64)
    c = [traj.c_hat[0].double()] if S else []
    for s in range(1, S):
        c.append(traj.c_hat[s].double())
        out[s - 1] = _moved(plan, c[-2], c[-1])
        if w is not None and len(c) == 3:
            straight += _moved(plan, c[0], c[2]) @ w
        if len(c) == 3:
            c.pop(0)
    return out, straight


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
    """[L, H] how straight the attention moves between checkpoints: over every two
    consecutive intervals (a, b), (b, c), the movement from a to c over the movement a to b
    plus b to c, each the events-weighted total variation of the classes' c_hat (the
    classes `slots`, default all), summed over the pairs.  1 where every class drifts one
    way; about 0.71 (1 / sqrt 2) where it moves by step-to-step noise between equally spaced
    checkpoints (a random walk).  Under `NOISY_BELOW` the rate of movement between
    checkpoints is mostly noise, which per step grows as intervals shrink: the snap step
    then depends on the checkpoints' spacing.  NaN below three checkpoints.  `moves`: the
    pair `_movements` returns for these weights, where already computed."""
    L, H, S = len(traj.layers), len(traj.heads), traj.num_steps
    if S < 3:
        return torch.full((L, H), math.nan, dtype=torch.float64)
    w = _weights(traj, slots)
    move, straight = moves if moves is not None else _movements(traj, w)
    path = ((move[:-1] + move[1:]) @ w).sum(0)  # [L, H]
    return torch.where(path > 0, straight / path.clamp_min(1e-300), math.nan)


def _weights(traj: Trajectory, slots: Tensor | None) -> Tensor:
    """[K] the classes' event counts, zero outside `slots`."""
    w = traj.plan.class_events.double()
    if slots is None:
        return w
    return torch.zeros_like(w).index_fill_(0, slots, 1.0) * w


def snap_step_interval(
    traj: Trajectory, num: int = 200, level: float = LEVEL, generator=None
) -> dict[str, Tensor]:
    """[L, H] the interval of `snapping`'s snap_step: the percentile interval with the tracked
    classes as the units (resampled with replacement, each weighted by its events as
    `snapping` weighs them) over the resamples that snapped, widened to the checkpoints that
    bracket the crossing (`resampling.with_grid`; ``snap_step_grid_lo``/``_hi``):
    ``snap_step_lo``, ``snap_step_hi``, ``snap_share`` (the share of resamples that snapped)
    and ``snap_step_n_eff`` (Kish's n_eff of the class events); no interval below
    `resampling.MIN_UNITS` effective classes or three checkpoints."""
    L, H = len(traj.layers), len(traj.heads)
    nan = torch.full((L, H), math.nan, dtype=torch.float64)
    w = traj.plan.class_events.double()
    n_eff = kish(w).expand(L, H).clone()
    out = {"snap_step_lo": nan, "snap_step_hi": nan.clone(), "snap_share": nan.clone(),
           "snap_step_n_eff": n_eff, "snap_step_grid_lo": nan.clone(),
           "snap_step_grid_hi": nan.clone()}  # fmt: skip
    if traj.num_steps < 3 or float(n_eff[0, 0]) < MIN_UNITS:
        return out
    move = class_movement(traj)  # [S-1, L, H, K]

    def statistic(counts: Tensor) -> Tensor:
        c = counts * w
        head_move = torch.einsum("slhk,bk->blhs", move, c) / c.sum(-1)[:, None, None, None]
        return snap_step(traj.steps, head_move)[0]  # [B, L, H]

    lo, hi, share = bootstrap_percentile(statistic, move.shape[-1], num, level, generator)
    head_move = torch.einsum("slhk,k->lhs", move, w) / w.sum()
    grid_lo, grid_hi = snap_step(traj.steps, head_move, grid=True)[3:5]
    lo, hi = with_grid(lo, hi, grid_lo, grid_hi)
    out.update(snap_step_lo=lo, snap_step_hi=hi, snap_share=share, snap_step_grid_lo=grid_lo,
               snap_step_grid_hi=grid_hi)  # fmt: skip
    return out


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
    `snap_fraction` of its peak; horizon-independent), ``snap_step_grid_lo``/``_hi`` (the
    checkpoints that bracket it: the grid knows it no better), ``rate_peak_step`` (where that
    rate peaks) with ``rate_peak_step_grid_lo``/``_hi`` (where the checkpoints allow the peak),
    ``snap_reason`` (why ``snap_step`` is NaN), ``straightness`` (`straightness`: under
    `NOISY_BELOW` the movement is mostly noise and the snap step depends on the checkpoints'
    spacing), and the secondary, horizon-dependent
    ``snap_path`` and ``snap_rate`` (`secondary_snap_steps`).  The movement of a class between
    checkpoints is the total variation of its c_hat; a head's movement is the events-weighted
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
        classes = list(classes)
        if classes:
            m, n = torch.as_tensor(classes, dtype=torch.long).reshape(-1, 2).unbind(-1)
            found = find_sorted(plan.class_keys, m * plan.vocab_size + n)
            slots = found[found >= 0].tolist()
        else:
            slots = []
    if not slots:
        raise ValueError("no tracked class to measure")
    slots = torch.as_tensor(slots, dtype=torch.long)
    both = _movements(traj, _weights(traj, slots))
    move = both[0][..., slots].permute(3, 1, 2, 0)  # [K', L, H, S-1]
    path_k, rate_k = secondary_snap_steps(traj.steps, move, fraction, rate_fraction)
    snap_k, _, _ = snap_step(traj.steps, move, snap_fraction)
    w = plan.class_events[slots].double()
    head_move = torch.einsum("klhs,k->lhs", move, w) / w.sum()  # [L, H, S-1]
    path, rate = secondary_snap_steps(traj.steps, head_move, fraction, rate_fraction)
    snap, peak, reasons, grid_lo, grid_hi, peak_lo, peak_hi = snap_step(
        traj.steps, head_move, snap_fraction, grid=True
    )
    K, L, H = snap_k.shape
    detail = pd.DataFrame(
        {
            "layer": np.tile(np.repeat(traj.layers, H), K),
            "head": np.tile(traj.heads, K * L),
            "query": np.repeat(plan.class_query[slots].numpy(), L * H),
            "next": np.repeat(plan.class_next[slots].numpy(), L * H),
            "snap_step": snap_k.reshape(-1).numpy(),
            "snap_path": path_k.reshape(-1).numpy(),
            "snap_rate": rate_k.reshape(-1).numpy(),
        }
    )
    table = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"]).to_frame(
        index=False
    )
    table["snap_step"] = snap.reshape(-1).numpy()
    table["snap_step_grid_lo"] = grid_lo.reshape(-1).numpy()
    table["snap_step_grid_hi"] = grid_hi.reshape(-1).numpy()
    table["rate_peak_step"] = peak.reshape(-1).numpy()
    table["rate_peak_step_grid_lo"] = peak_lo.reshape(-1).numpy()
    table["rate_peak_step_grid_hi"] = peak_hi.reshape(-1).numpy()
    table["snap_reason"] = reasons
    table["straightness"] = straightness(traj, slots, both).reshape(-1).numpy()
    table["snap_path"] = path.reshape(-1).numpy()
    table["snap_rate"] = rate.reshape(-1).numpy()
    table["step_unit"] = traj.step_unit
    return Measurement("snapping", table, detail)
