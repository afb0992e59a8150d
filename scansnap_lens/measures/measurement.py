"""`Measurement`: one measured quantity per (step, layer, head), and the trajectory lookups
the quantities share.

dz = zbar(t) - zbar(t_first): softmax is shift-invariant, so only changes of the logits are
compared, never raw levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.recording.trajectory import Trajectory

__all__ = ["INDEX", "Measurement", "segment_ranks"]


def _z(traj: Trajectory, query: int, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """zbar [S, L, H, n] of the pairs (query, l) the plan holds, and the mask of `tokens` held."""
    slot = traj.plan.pair_slot(query, tokens)
    held = slot >= 0
    return traj.zbar[..., slot[held]].double(), held


def _tracked(traj, groups) -> list[int]:
    """Indices of the groups' classes that the recording tracks (class slots of its plan; a
    trajectory or its `RecordPlan`): the per-class measurements average over these, one
    vectorised lookup for all of them."""
    from scansnap_lens.recording.plan import find_sorted

    plan = getattr(traj, "plan", traj)
    keys = groups.query * plan.vocab_size + groups.next_token
    return (find_sorted(plan.class_keys, keys) >= 0).nonzero().flatten().tolist()


def segment_starts(segment: Tensor, num: int) -> Tensor:
    """[num + 1] where each of `num` segments begins in the ascending ids `segment` [N] (and
    the end): the layout every per-query and per-class figure is summed over.

    >>> segment_starts(torch.tensor([0, 0, 2]), 3).tolist()
    [0, 2, 2, 3]
    """
    start = torch.zeros(num + 1, dtype=torch.long)
    start[1:] = torch.cumsum(torch.bincount(segment, minlength=num), 0)
    return start


MAX_ELEMENTS = 1 << 22  # segment_ranks works on row blocks of at most this many values


def segment_ranks(values: Tensor, segment: Tensor, start: Tensor) -> Tensor:
    """Ranks (1-based, ties averaged, as scipy's ``rankdata``) of `values` [..., N] within each
    segment: `segment` [N] ascending ids, `start` [U + 1] where each begins.  NaN ranks the
    whole segment NaN.  Sorts, no loop over segments.

    >>> segment_ranks(torch.tensor([3.0, 1.0, 1.0, 5.0, 4.0]), torch.tensor([0, 0, 0, 1, 1]),
    ...               torch.tensor([0, 3, 5]))
    tensor([3.0000, 1.5000, 1.5000, 2.0000, 1.0000], dtype=torch.float64)
    """
    shape = values.shape
    v = values.reshape(-1, shape[-1]).double()
    R, N = v.shape
    out = torch.empty(R, N, dtype=torch.float64)
    if N == 0:
        return out.reshape(shape)
    position = (torch.arange(N) - start[segment] + 1).double()  # rank in the segment, before ties
    same_segment = segment[1:] == segment[:-1]
    nan_segments = torch.zeros(R, start.numel() - 1, dtype=torch.bool)
    for r0 in range(0, R, max(1, MAX_ELEMENTS // N)):
        block = v[r0 : r0 + max(1, MAX_ELEMENTS // N)]
        b = block.shape[0]
        order, sorted_values = _by_segment_and_value(block, segment, same_segment)
        new_run = torch.ones(b, N, dtype=torch.bool)
        new_run[:, 1:] = (sorted_values[:, 1:] != sorted_values[:, :-1]) | ~same_segment
        if bool(new_run.all()):  # no ties: the rank is the position
            averaged = position.expand(b, N)
        else:
            run = torch.cumsum(new_run, -1) - 1 + torch.arange(b)[:, None] * N  # unique ids
            sums = torch.zeros(b * N, dtype=torch.float64).index_add_(
                0, run.reshape(-1), position.expand(b, N).reshape(-1)
            )
            counts = torch.zeros(b * N, dtype=torch.float64).index_add_(
                0, run.reshape(-1), torch.ones(b * N, dtype=torch.float64)
            )
            averaged = (sums / counts.clamp_min(1))[run]
        out[r0 : r0 + b] = torch.empty_like(block).scatter_(-1, order, averaged)
        if bool(torch.isnan(block).any()):
            nan_segments[r0 : r0 + b].index_put_(
                (torch.arange(b)[:, None].expand(b, N), segment.expand(b, N)),
                torch.isnan(block),
                accumulate=True,
            )
    out = torch.where(nan_segments.gather(-1, segment.expand(R, N)), math.nan, out)
    return out.reshape(shape)


def _by_segment_and_value(block: Tensor, segment: Tensor, same_segment: Tensor):
    """(order, sorted values) [b, N] of each row of `block` by (segment, value): one sort of
    segment + value scaled into [0, 1/2) per row, checked (where two values of a segment are
    closer than the scaled key resolves, two stable sorts instead)."""
    finite = torch.nan_to_num(block, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = finite.min(-1, keepdim=True).values, finite.max(-1, keepdim=True).values
    scaled = (finite - lo) / (hi - lo).clamp_min(1e-300) * 0.499
    order = torch.sort(segment.double() + scaled, dim=-1).indices
    sorted_values = block.gather(-1, order)
    rising = (sorted_values[:, 1:] >= sorted_values[:, :-1]) | ~same_segment
    ordered = torch.isfinite(block).all() and bool(rising.all())
    if not ordered:
        by_value = torch.sort(block, dim=-1, stable=True)
        by_segment = torch.sort(segment[by_value.indices], dim=-1, stable=True).indices
        order = by_value.indices.gather(-1, by_segment)
        sorted_values = by_value.values.gather(-1, by_segment)
    return order, sorted_values


def _frame(traj: Trajectory, values: dict[str, Tensor]) -> pd.DataFrame:
    """Long table of [S, L, H] tensors."""
    idx = pd.MultiIndex.from_product(
        [traj.steps.tolist(), traj.layers, traj.heads], names=["step", "layer", "head"]
    ).to_frame(index=False)
    for name, v in values.items():
        idx[name] = v.reshape(-1).numpy()
    return idx


def _weighted_nanmean(values: Tensor, weights: Tensor) -> Tensor:
    """Mean over the last axis of `values`, weights [n], NaNs left out."""
    w = weights.double().expand_as(values).clone()
    ok = ~torch.isnan(values)
    w[~ok] = 0
    total = w.sum(-1)
    return torch.where(total > 0, (torch.nan_to_num(values) * w).sum(-1) / total, math.nan)


INDEX = ("step", "layer", "head")


@dataclass
class Measurement:
    """Per (step, layer, head) values in ``table``, per query or class detail in ``detail``.

    `tensor` gives a column as a tensor indexed like TransformerLens's head scores,
    ``[step, layer, head]`` (``[layer, head]`` for per-head results such as snap steps):

    >>> table = pd.DataFrame({"step": [0, 0, 9, 9], "layer": 0, "head": [0, 1, 0, 1],
    ...                       "bias": [0.0, 0.1, 2.0, 0.5]})
    >>> Measurement("bias", table).tensor("bias")[-1]  # the last step, [layer, head]
    tensor([[2.0000, 0.5000]], dtype=torch.float64)
    """

    name: str
    table: pd.DataFrame
    detail: pd.DataFrame | None = None
    values: Tensor | None = None  # [S, L, H] where the measurement has one value per head
    predictions: list | None = None  # `theory_fit`: the predicted trajectories it compared

    def to_dataframe(self) -> pd.DataFrame:
        return self.table

    def final(self) -> pd.DataFrame:
        """The rows of the last checkpoint."""
        return self.table[self.table["step"] == self.table["step"].max()].reset_index(drop=True)

    def tensor(self, column: str | None = None) -> Tensor:
        """`column` of the table (default: the measurement's first value column) as a float64
        tensor [S, L, H] over the table's steps, layers and heads in ascending order (or
        [L, H] where the table has no step); NaN where the table has no row."""
        index = [c for c in INDEX if c in self.table.columns]
        if column is None:
            numeric = self.table.select_dtypes("number").columns
            column = next(c for c in numeric if c not in index)
        if column not in self.table.columns:
            raise KeyError(f"{self.name} has no column {column!r}: {list(self.table.columns)}")
        grid = pd.MultiIndex.from_product([sorted(self.table[c].unique()) for c in index])
        values = self.table.set_index(index)[column].astype(float).reindex(grid)
        shape = [len(level) for level in grid.levels]
        return torch.tensor(values.to_numpy(), dtype=torch.float64).reshape(shape)

    def tensors(self) -> dict[str, Tensor]:
        """Every numeric value column as `tensor` gives it."""
        index = [c for c in INDEX if c in self.table.columns]
        numeric = self.table.select_dtypes("number").columns
        return {c: self.tensor(c) for c in numeric if c not in index}
