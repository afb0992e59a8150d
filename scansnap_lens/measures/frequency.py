"""Frequency bias (Sec. 5, Theorem 3): among a class's distinct tokens, the more frequent
co-occurrence gains more attention logit."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import Tensor

from scansnap_lens.measures.measurement import (
    Measurement,
    _dz,
    _frame,
    _tracked,
    _weighted_nanmean,
)
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["frequency_bias"]


def frequency_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Spearman correlation of dz[m, l] with P(l|m, n) over the distinct tokens of each class,
    averaged over the classes the recording tracks with weights N(m, n).  Classes with fewer
    than two distinct tokens, or with all P equal, have no correlation and are left out; so
    are steps where dz is flat."""
    groups.check_context(traj.plan)
    rhos, weights, rows = [], [], []
    for k in _tracked(traj, groups):
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
