"""`match_heads`: the heads of several runs matched by what they do, not by their index.

Seeds of the initialisation permute a layer's heads: head 2 of one run may do what head 0
does in another.  Each head is described by its attention on the recorded example prompt at
the last checkpoint (the same tokens in every run); the distance of two heads is the mean
over query positions of the total variation between their attention rows (0: the same
attention, 1: disjoint).  Per layer, each run's heads are assigned to the first run's heads
by the assignment of least total distance (Hungarian method), so every head is matched once.

The match's quality: each pair's ``similarity`` (1 - distance) beside ``chance``, the mean
similarity of every pair of heads of the layer across the two runs (what a random match
would give).  A match well above chance is a match of behaviour; near chance, the heads do
not do distinct things this prompt shows, and the index is as good a match as any.

Shape letters: L watched layers, H watched heads, T prompt positions.

>>> pattern = torch.eye(3).expand(1, 1, 2, 3, 3).clone()  # [S, L, H, T, T]
>>> pattern[0, 0, 1] = torch.tensor([[1.0, 0, 0], [1, 0, 0], [1, 0, 0]])  # head 1: first token
>>> other = pattern.flip(2)  # the same heads, swapped
>>> _distances(pattern[-1, 0], other[-1, 0])
tensor([[0.6667, 0.0000],
        [0.0000, 0.6667]], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from scansnap_lens.recording.trajectory import Trajectory

__all__ = ["match_heads"]


def _distances(first: Tensor, second: Tensor) -> Tensor:
    """[H, H'] mean total variation between the attention rows of each head of `first`
    [H, T, T] and each head of `second` [H', T, T] (causal rows, each summing to 1)."""
    a, b = first.double(), second.double()
    return 0.5 * (a[:, None] - b[None]).abs().sum(-1).mean(-1)


def match_heads(trajs: Mapping[str, Trajectory]) -> tuple[pd.DataFrame | None, str]:
    """(matching, why not): one row per run, layer and head: ``reference_head`` (the head of
    the first run it is matched to), ``similarity`` and the layer's ``chance`` (see the
    module); the first run's rows match themselves.  None, with the reason, where the runs
    hold no common example prompt."""
    items = list(trajs.items())
    first = items[0][1]
    for name, traj in items:
        if traj.prompt_pattern is None:
            return None, f"run {name} holds no example prompt (record with prompt=)"
        if traj.prompt is None or not torch.equal(traj.prompt, first.prompt):
            return None, f"run {name} recorded another example prompt than {items[0][0]}"
    reference = first.prompt_pattern[-1]  # [L, H, T, T]
    rows = []
    for name, traj in items:
        pattern = traj.prompt_pattern[-1]
        for li, layer in enumerate(traj.layers):
            distance = _distances(reference[li], pattern[li])  # [H_ref, H_run]
            ref, own = linear_sum_assignment(distance.numpy())
            chance = float(1 - distance.mean())
            for r, o in zip(ref, own):
                rows.append(
                    {
                        "run": name,
                        "layer": layer,
                        "head": traj.heads[o],
                        "reference_head": first.heads[r],
                        "similarity": float(1 - distance[r, o]),
                        "chance": chance,
                    }
                )
    return pd.DataFrame(rows), ""
