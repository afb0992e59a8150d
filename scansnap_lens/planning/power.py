"""Power planned before recording: which AUROC the scan verdict will be able to detect on a
recording of a plan (`planned_mde`), and the evaluation rows that reach a target
(`rows_for_power`).

The verdict's minimal detectable effect (`uncertainty.scan_uncertainty`'s ``auroc_mde``) is
read from a recording's spread; before one exists, the same estimates are made on the
plan's units (`discriminative.QueryTokens.of_plan`: its queries, their distinct and common
tokens, their pairs with frequency held) with logit changes drawn as the calibration lab draws a
head without an effect (`lab.calibration`: a query effect, a token effect shared by the
queries that hold the token, of `TOKEN_SHARE` of the variance, and noise), and the
minimal detectable AUROC of each draw is taken at the first step of Holm's correction over
`heads`.  The median over draws is the plan's.  It assumes a trained head's spread is like
this one's: the recording's own ``auroc_mde`` is the figure to trust afterwards.

>>> import torch
>>> from scansnap_lens.lab.calibration import CorpusScenario, corpus_run
>>> traj, groups, _ = corpus_run(CorpusScenario(tied=True), heads=2)
>>> 0.5 < planned_mde(traj.plan, groups, heads=8) < 1
True
"""

from __future__ import annotations

import math

import torch

from scansnap_lens.measures.discriminative import QueryTokens
from scansnap_lens.measures.resampling import ALPHA, joint_mde
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["TOKEN_SHARE", "planned_mde", "rows_for_power"]

TOKEN_SHARE = 0.2  # the token effect's share of a head's spread (the lab's default)


def planned_mde(
    plan, groups: TokenGroups, heads: int = 1, draws: int = 32, alpha: float = ALPHA, seed: int = 0
) -> float:
    """The AUROC the verdict would detect with 80 % power on a recording of `plan` (a
    `RecordPlan`) watching `heads` heads (see the module); NaN where no query holds both
    kinds or the counts leave frequency untold (too few units with it held)."""
    return _planned(plan, groups, heads, draws, alpha, seed)[0]


def _planned(plan, groups, heads, draws=32, alpha=ALPHA, seed=0) -> tuple[float, float]:
    """(`planned_mde`, the degrees of freedom of its weakest test's t reference)."""
    try:
        units = QueryTokens.of_plan(plan, groups)
    except ValueError:
        return math.nan, math.nan
    g = torch.Generator().manual_seed(seed)
    tokens = units.token_index
    n_tokens = int(tokens.max()) + 1
    a = torch.randn(draws, units.query.numel(), generator=g, dtype=torch.float64)
    b = torch.randn(draws, n_tokens, generator=g, dtype=torch.float64) * math.sqrt(TOKEN_SHARE)
    noise = torch.randn(draws, units.unit.numel(), generator=g, dtype=torch.float64)
    dz = a[:, units.unit] + b[:, tokens] + noise * math.sqrt(1 - TOKEN_SHARE)
    estimates = [units.auroc_estimate(dz), units.held_auroc_estimate(dz)]
    mde = 0.5 + joint_mde(estimates, alpha / max(heads, 1), null=0.5)
    df = float(torch.stack([e.df for e in estimates]).amin(0).median())
    return (float(mde.nanmedian()) if (~torch.isnan(mde)).any() else math.nan), df


def rows_for_power(
    tokens,
    vocab_size: int,
    groups: TokenGroups,
    target: float,
    heads: int = 1,
    start: int = 64,
    **plan_options,
) -> tuple[int, float, list[tuple[int, float, float]]]:
    """(rows, mde, tried): the fewest of the first rows of `tokens` [R, T] (doubling from
    `start`, then all of them) whose plan (`plan_recording` with `plan_options`) reaches a
    planned minimal detectable AUROC of at most `target` for `heads` heads, with its
    `planned_mde`, and every (rows, mde, degrees of freedom) tried.  Where none does, the
    rows of the least one: more rows can lower it less than they concentrate the figure on a
    few distinct tokens shared by many queries (a word distinct for a fifth of the queries),
    whose spread one draw of text cannot tell (the degrees of freedom fall towards 1)."""
    if not 0.5 < target <= 1:
        raise ValueError(f"the target AUROC must lie in (0.5, 1], got {target}")
    total = len(tokens)
    sizes, rows = [], min(start, total)
    while rows < total:
        sizes.append(rows)
        rows *= 2
    sizes.append(total)
    tried = []
    for rows in sizes:
        plan = plan_recording(tokens[:rows], vocab_size, groups=groups, **plan_options)
        mde, df = _planned(plan, groups, heads)
        tried.append((rows, mde, df))
        if mde <= target:
            return rows, mde, tried
    finite = [t for t in tried if t[1] == t[1]]
    best = min(finite, key=lambda t: t[1]) if finite else tried[-1]
    return best[0], best[1], tried
