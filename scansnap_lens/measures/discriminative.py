"""Discriminative bias (Sec. 5, Theorem 2): a query's distinct tokens gain attention logit
and its common tokens lose it."""

from __future__ import annotations

import pandas as pd

from scansnap_lens.measures.measurement import Measurement, QueryTokens, _frame, _weighted_nanmean
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["discriminative_bias"]


def discriminative_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Mean dz of a query's distinct tokens minus its common tokens, and the AUROC of dz
    separating them; averaged over queries with both kinds, weighted by their events.
    The table also keeps the two means, dz_distinct and dz_common (bias is their difference)."""
    groups.check_context(traj.plan)
    units = QueryTokens.of(traj, groups)
    if not units.query.numel():
        raise ValueError("no query has both distinct and common tokens in the trajectory")
    z = traj.zbar[..., units.slot].double()  # [S, L, H, N], one read for every query
    dz = z - z[:1]
    d_mean, c_mean = units.kind_means(dz)  # [S, L, H, U]
    bias = d_mean - c_mean
    w = units.events
    table = _frame(
        traj,
        {
            "bias": _weighted_nanmean(bias, w),
            "auroc": _weighted_nanmean(units.auroc(dz), w),
            "dz_distinct": _weighted_nanmean(d_mean, w),
            "dz_common": _weighted_nanmean(c_mean, w),
        },
    )
    table["bias_queries"] = units.query.numel()
    detail = pd.DataFrame({
        "query": units.query.numpy(), "distinct": units.num_distinct.numpy(),
        "common": units.num_common.numpy(),
        "final_bias_mean_heads": bias[-1].mean((0, 1)).numpy(), "events": w.numpy(),
    })  # fmt: skip
    return Measurement("discriminative_bias", table, detail)
