"""Discriminative bias (Sec. 5, Theorem 2): a query's distinct tokens gain attention logit
and its common tokens lose it."""

from __future__ import annotations

import pandas as pd
import torch
from scipy.stats import rankdata
from torch import Tensor

from scansnap_lens.measures.measurement import Measurement, _dz, _frame, _weighted_nanmean
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["discriminative_bias"]


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
        weights.append(groups.events_of_query(m))
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
