"""Snapping (Sec. 6): when attention stops moving.

`snap_step` is the primary estimate: the step at which the rate of attention movement has
fallen to half its peak, which nothing after it can move (horizon-independent); `snap_steps`
gives the secondary, horizon-dependent path-fraction and rate-threshold steps; `snapping`
measures every head and class of a trajectory.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.measures.measurement import Measurement, _class_c_hat
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["NOT_YET_SNAPPED", "NO_SCAN", "snap_step", "snap_steps", "snapping"]


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
        found = [traj.class_slot(int(m), int(n)) for m, n in classes]
        slots = [c for c in found if c is not None]
    if not slots:
        raise ValueError("no tracked class to measure")
    moves, weights, rows = [], [], []
    for c in slots:
        c_hat = _class_c_hat(traj, c)  # [S, L, H, n]
        move = 0.5 * torch.diff(c_hat, dim=0).abs().sum(-1)  # [S-1, L, H]
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
