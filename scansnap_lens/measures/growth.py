"""The growth factor of Theorem 3: how the dominant distinct token's share grows over the
others', and how far a trajectory deviates from the theorem's ratio law."""

from __future__ import annotations

import pandas as pd
import torch

from scansnap_lens.measures.measurement import Measurement, _frame, _tracked, _z
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["growth_factor"]


def growth_factor(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Theorem 3 per class: l0 = the distinct token with the highest P(l|m, n); for every other
    distinct l, r(t) = (ctilde_l0 / ctilde_l)^2 - 1 with ctilde = P exp(zbar), the growth factor
    chi_l0(t) = exp(2 (z_l0(t) - z_l0(0))), and the relative deviation |r - r(0) chi| / r(0) chi.
    The table keeps chi of l0 (mean over the classes the recording tracks) and the worst
    deviation per step."""
    groups.check_context(traj.plan)
    chis, devs, rows = [], [], []
    for k in _tracked(traj, groups):
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
    return Measurement("growth_factor", table, detail)
