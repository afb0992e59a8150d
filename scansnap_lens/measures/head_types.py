"""The field's head types over training: previous-token, first-token (sink) and induction
scores of every head, each with its interval over the evaluation rows, its rise and when it
formed (the columns ``X``, ``X_lo``/``_hi``, ``X_rise`` (``_lo``, ``_hi``, ``_p``), ``X_step``
(``_lo``, ``_hi``) and ``X_reason``: docs/glossary.md).

A score is the mean over rows of each row's recorded mean (`recording.aggregates`), every row
counting once; its interval takes the rows as units (none below `MIN_ROWS`); the rise is
paired per row, Holm over heads; the formation step (`formation_step`) is where the score has
covered half its rise on the log-step axis, its interval a percentile one over rows, and NaN
where the rise is not significant or under `MIN_RISE`.  The intervals cover other rows of the
same text for this trained model, not another run.

Shape letters (docs/shapes.md): S checkpoints, L layers, H heads, N rows.

>>> import torch
>>> from scansnap_lens.lab.calibration import head_type_run
>>> traj = head_type_run(rows=32, heads=2, rise=(0.6, 0.0), seed=0)  # head 0 forms at 40
>>> m = head_type(traj, "induction")
>>> final = m.final()
>>> [round(v, 2) for v in final["induction"]], final["induction_reason"].tolist()
([0.72, 0.11], ['', 'no rise'])
>>> final[["induction_step", "induction_step_lo", "induction_step_hi"]].round(1).values[0].tolist()
[40.2, 39.5, 50.0]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from scansnap_lens.measures.measurement import Measurement, _frame
from scansnap_lens.measures.resampling import (
    ALPHA,
    LEVEL,
    MIN_UNITS,
    Estimate,
    adjust,
    bootstrap_percentile,
    kish,
    mean_over_units,
    widened,
    with_grid,
)
from scansnap_lens.recording.trajectory import Trajectory

__all__ = ["MIN_RISE", "MIN_ROWS", "formation_step", "head_type", "head_type_scores"]

NO_RISE = "no rise"
MIN_RISE = 0.1  # a head becomes one of a type when a tenth of its attention moves there
# rows a score's interval needs: below 16, rows skewed as a rare type's are (most near 0, a
# few near 1) gave 95 % intervals covering 0.87-0.89 (bench_calibration.py); from 16, >= 0.93
MIN_ROWS = 16


def _small_rise(value: float) -> str:
    return f"rise {value:.2g} below {MIN_RISE:g}"


def head_type_scores(traj: Trajectory, name: str) -> Tensor:
    """[S, L, H, N] the recorded per-row means of head type `name` (float64; NaN where a row
    has no position to read); `trajectory.NotRecorded` where the trajectory lacks it."""
    values = getattr(traj, name)
    if traj.aggregates[name].axis != "rows":
        raise ValueError(f"{name} is no per-row aggregate ({traj.aggregates[name].axis})")
    return torch.as_tensor(values[:]).double()


def formation_step(steps: Tensor, score: Tensor, fraction: float = 0.5, grid: bool = False):
    """[...] the step at which `score` [..., S] over `steps` [S] first covers `fraction` of
    its rise from the first checkpoint to the last: a fraction crossing interpolated on
    log(1 + step), as `snap.snap_step` finds its crossing; NaN where it does not rise.  For a
    phase change (a sigmoid rise) it is the change's midpoint.  (The last checkpoint, not the
    highest: a maximum over noisy checkpoints is biased upwards, and its step with it.)  With
    `grid`, (step, lo, hi): lo and hi the checkpoints that bracket the crossing.

    >>> steps = torch.tensor([0, 10, 20, 30, 40])
    >>> round(formation_step(steps, torch.tensor([0.0, 0.05, 0.5, 0.6, 0.6])).item(), 1)
    14.8
    >>> [t.item() for t in formation_step(steps, torch.tensor([0.0, 0.05, 0.5, 0.6, 0.6]),
    ...                                   grid=True)[1:]]
    [10.0, 20.0]
    """
    t = steps.double()
    s = score.double()
    x = torch.log1p(t - t[0])
    first, top = s[..., :1], s[..., -1:]
    level = first + fraction * (top - first)
    crossed = (s >= level) & (torch.arange(s.shape[-1]) > 0)
    i = crossed.double().argmax(-1, keepdim=True)
    h = (i - 1).clamp_min(0)
    s_h, s_i = s.gather(-1, h), s.gather(-1, i)
    share = ((level - s_h) / (s_i - s_h).clamp_min(1e-300)).clamp(0, 1)
    out = torch.expm1(x[h] + share * (x[i] - x[h])) + t[0]
    rose = top > first
    step = torch.where(rose, out, math.nan)[..., 0]
    if not grid:
        return step
    return (
        step,
        torch.where(rose, t[h], math.nan)[..., 0],
        torch.where(rose, t[i], math.nan)[..., 0],
    )


def _mean_rows(values: Tensor, counts: Tensor) -> Tensor:
    """[B, ..., S] the mean of `values` [S, L, H, N] over rows drawn `counts` [B, N] times
    (rows without a value left out)."""
    ok = ~torch.isnan(values)
    v = torch.nan_to_num(values)
    top = torch.einsum("slhr,br->blhs", v, counts)
    bottom = torch.einsum("slhr,br->blhs", ok.double(), counts)
    return torch.where(bottom > 0, top / bottom.clamp_min(1e-300), math.nan)


def _over_rows(values: Tensor) -> Estimate:
    """The mean over rows of `values` [N, ...] (`resampling.mean_over_units`, each row once)
    with its degrees of freedom the number of rows that carry its variance (Kish's n_eff of
    the squared deviations): a score near 1 whose few low rows make all its spread has few,
    and an interval as wide as that; none where under two rows carry it."""
    est = mean_over_units(values, torch.ones(values.shape[0]), bounds=(0.0, 1.0))
    deviation = torch.nan_to_num(values.double() - est.value)
    flat = (deviation**2).sum(0) == 0  # every row alike: `Estimate.logit_interval`'s rule
    est.dof = torch.where(flat, est.n_eff, kish(deviation**2, 0))
    est.se = torch.where((est.dof >= 2) & (est.n_eff >= MIN_ROWS), est.se, math.nan)
    return est


def head_type(
    traj: Trajectory, name: str, num: int = 200, level: float = LEVEL, generator=None
) -> Measurement:
    """The scores of head type `name` (``previous_token``, ``first_token``, ``induction`` or
    any rows aggregate) per checkpoint and head, with intervals over rows, the rise and the
    formation step (module docstring); `num` resamples for the step's interval."""
    values = head_type_scores(traj, name)  # [S, L, H, N]
    S, L, H, N = values.shape
    per_step = _over_rows(values.permute(3, 0, 1, 2))
    lo, hi = per_step.logit_interval(level)
    table = _frame(
        traj,
        {name: per_step.value, f"{name}_lo": lo, f"{name}_hi": hi, f"{name}_n_eff": per_step.n_eff},
    )
    nan = torch.full((L, H), math.nan, dtype=torch.float64)
    head = {
        f"{name}_rise": nan.clone(),
        f"{name}_rise_lo": nan.clone(),
        f"{name}_rise_hi": nan.clone(),
        f"{name}_rise_p": nan.clone(),
        f"{name}_step": nan.clone(),
        f"{name}_step_lo": nan.clone(),
        f"{name}_step_hi": nan.clone(),
    }
    reasons = [["one checkpoint"] * H for _ in range(L)]
    if S >= 2:
        rise = mean_over_units((values[-1] - values[0]).permute(2, 0, 1), torch.ones(N))
        p = adjust(rise.p_value())
        step, grid_lo, grid_hi = formation_step(
            traj.steps, per_step.value.permute(1, 2, 0), grid=True
        )
        generator = generator or torch.Generator().manual_seed(0)
        lo_s, hi_s, _ = bootstrap_percentile(
            lambda counts: formation_step(traj.steps, _mean_rows(values, counts)),
            N,
            num,
            level,
            generator,
        )
        lo_s, hi_s = with_grid(*widened(step, lo_s, hi_s, N, level), grid_lo, grid_hi)
        risen = (p < ALPHA) & (rise.value >= MIN_RISE)
        enough = rise.enough
        rise_lo, rise_hi = rise.interval(level)
        head.update(
            {
                f"{name}_rise": rise.value,
                f"{name}_rise_lo": rise_lo,
                f"{name}_rise_hi": rise_hi,
                f"{name}_rise_p": p,
                f"{name}_step": torch.where(risen, step, math.nan),
                f"{name}_step_lo": torch.where(risen, lo_s, math.nan),
                f"{name}_step_hi": torch.where(risen, hi_s, math.nan),
            }
        )
        n_eff = rise.n_eff
        reasons = [
            [
                ""
                if bool(risen[i, j])
                else (
                    f"too few units (n_eff = {float(n_eff[i, j]):.3g} < {MIN_UNITS:g})"
                    if not bool(enough[i, j])
                    else _small_rise(float(rise.value[i, j]))
                    if bool(p[i, j] < ALPHA) and float(rise.value[i, j]) > 0
                    else NO_RISE
                )
                for j in range(H)
            ]
            for i in range(L)
        ]
    per_head = {k: v[None].expand(S, L, H) for k, v in head.items()}
    for k, v in per_head.items():
        table[k] = v.reshape(-1).numpy()
    table[f"{name}_reason"] = [r for _ in range(S) for row in reasons for r in row]
    return Measurement(name, table, values=per_step.value)
