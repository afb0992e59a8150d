"""Every head of a model ranked by scan and snap, and a summary column as a [layer, head] grid.

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

from scansnap_lens.measures.catalog import MEASURES, columns

__all__ = ["atlas", "head_grid", "rank_heads"]


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


def atlas(summary: pd.DataFrame, entries=None) -> pd.DataFrame:
    """Every head in one table, layer by layer: the verdict (``scans`` and its words: "too few
    units", "no scan (could have seen AUROC >= x)", ...), bias and AUROC with their intervals,
    AUROC's p-value, effective units and minimal detectable effect, the AUROC with frequency
    held and how frequency was ruled out, the frequency bias with its interval, p-value and
    number of classes, the snap step with its interval (``snap`` says "not yet snapped" or
    "no scan" where there is none) beside the head types' scores and formation steps
    (induction, previous_token, first_token: does the snap coincide with the head becoming
    one?), the theory's fit and the attention entropy: what each measurement of `entries`
    (default `catalog.MEASURES`; `catalog.measures_of` a trajectory) shows in the atlas; the
    columns the summary lacks are left out.

    >>> summary = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "scans": [True, False],
    ...                         "bias": [2.0, 0.1], "snap_step": [120.0, float("nan")],
    ...                         "snap_reason": ["", "not yet snapped"]})
    >>> atlas(summary)[["head", "scans", "snap"]].values.tolist()
    [[0, True, '120'], [1, False, 'not yet snapped']]
    """
    table = summary[[c for c in columns("atlas", entries or MEASURES) if c in summary]].copy()
    if "snap_step" in summary:
        reason = summary.get("snap_reason", pd.Series([""] * len(summary)))
        nan = pd.Series([math.nan] * len(summary))
        lo, hi = (summary.get(f"snap_step_grid_{e}", nan).astype(float) for e in ("lo", "hi"))
        table["snap"] = [
            (r or "none")
            if math.isnan(v)
            else f"{v:.4g}"
            if math.isnan(a)
            else f"{v:.4g} (checkpoints {a:.4g} to {b:.4g})"
            for v, r, a, b in zip(summary["snap_step"].astype(float), reason.fillna(""), lo, hi)
        ]
    return table.sort_values(["layer", "head"], kind="stable").reset_index(drop=True)
