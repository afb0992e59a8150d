"""Per-head views of a model: the paper's Fig. 10 attention entropy, and every head ranked by
scan and snap.

Shape letters: S checkpoints, L watched layers, H watched heads, Q tracked queries.

>>> import pandas as pd
>>> summary = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
...                         "auroc": [0.5, 0.9, 0.7, float("nan")], "bias": [0.0, 2.0, 1.0, 0.5]})
>>> rank_heads(summary)[["layer", "head", "rank"]].values.tolist()
[[0, 1, 1], [1, 0, 2], [0, 0, 3], [1, 1, 4]]
>>> head_grid(summary, "bias", layers=[0, 1], heads=[0, 1])
tensor([[0.0000, 2.0000],
        [1.0000, 0.5000]], dtype=torch.float64)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from .measure import Measurement, _frame
from .trajectory import Trajectory

__all__ = ["attention_entropy", "head_grid", "rank_heads"]


def attention_entropy(traj: Trajectory) -> Measurement:
    """Fig. 10: the entropy (nats) of each head's attention row, averaged over every recorded
    evaluation position (events-weighted over the tracked queries), per checkpoint.

    The row is the recorded context: with ``plan_recording(include_self=True)`` the query's
    own position is in it, as the authors measured; by default it is not (the paper's model
    masks it).  ``values`` of the result: [S, L, H].
    """
    plan = traj.plan
    w = plan.query_events.double()
    if w.numel() == 0 or float(w.sum()) == 0:
        raise ValueError("the trajectory tracks no query events")
    ent = traj.query_entropy.double()  # [S, L, H, Q]
    ok = ~torch.isnan(ent)
    weights = torch.where(ok, w, torch.zeros_like(w))
    total = weights.sum(-1)
    values = torch.where(
        total > 0, (torch.nan_to_num(ent) * weights).sum(-1) / total.clamp_min(1e-300), math.nan
    )
    table = _frame(traj, {"attention_entropy": values})
    table.attrs["include_self"] = bool(plan.include_self)
    return Measurement("attention_entropy", table, values=values)


def rank_heads(summary: pd.DataFrame, by: Sequence[str] = ("auroc", "bias")) -> pd.DataFrame:
    """Every head, best scanning first: sorted by `by` (descending, NaN last), with a rank."""
    by = [c for c in by if c in summary]
    if not by:
        raise ValueError(f"the summary has none of the ranking columns {list(by)}")
    ranked = summary.sort_values(by, ascending=False, na_position="last", kind="stable")
    ranked = ranked.reset_index(drop=True)
    ranked.insert(0, "rank", range(1, len(ranked) + 1))
    return ranked


def head_grid(
    summary: pd.DataFrame, column: str, layers: Sequence[int], heads: Sequence[int]
) -> Tensor:
    """[L, H] values of one summary column (NaN where a head has none), for heat maps."""
    grid = torch.full((len(layers), len(heads)), math.nan, dtype=torch.float64)
    li = {int(v): i for i, v in enumerate(layers)}
    hi = {int(v): i for i, v in enumerate(heads)}
    for layer, head, value in zip(summary["layer"], summary["head"], summary[column]):
        if int(layer) in li and int(head) in hi:
            grid[li[int(layer)], hi[int(head)]] = float(value)
    return grid
