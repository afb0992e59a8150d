"""Sparsity: the entropy of attention over a class's distinct tokens (Fig. 6), the recall of
distinct tokens above a threshold (Figs. 11, 12), and the entropy of each head's whole
attention row (Fig. 10): over a trajectory's recorded events (`attention_entropy`) or over
every position of any text, straight from a model (`position_entropy`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from scansnap_lens.measures.measurement import (
    Measurement,
    _frame,
    _weighted_nanmean,
    segment_starts,
)
from scansnap_lens.measures.resampling import Estimate, mean_over_units
from scansnap_lens.recording.hooks import (
    check_tokens,
    evaluating,
    model_vocab_size,
    run_until,
)
from scansnap_lens.recording.plan import find_sorted
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

if TYPE_CHECKING:
    from scansnap_lens.models.backend import HookedModel

__all__ = [
    "SINGLE_DISTINCT",
    "attention_entropy",
    "over_queries",
    "position_entropy",
    "restricted_entropy",
    "sparsity",
]


def restricted_entropy(attention: Tensor, mask: Tensor) -> Tensor:
    """Shannon entropy (nats) of ``attention`` restricted to ``mask`` and renormalised.

    attention: [..., K, V] per-token attention of each class (rows sum to 1);
    mask: [K, V] bool, the tokens to keep for each class (its distinct tokens for the Fig. 6
    metric).  Returns [..., K]; a class with one kept token has entropy 0, and 0 log 0 = 0.

    >>> a = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    >>> restricted_entropy(a, torch.tensor([[False, True, True, True]]))
    tensor([0.6931])
    """
    if attention.shape[-2:] != mask.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match attention {tuple(attention.shape)}"
        )
    if not mask.any(-1).all():
        raise ValueError("every class needs at least one token in the mask")
    kept = attention * mask.to(attention.dtype)
    p = kept / kept.sum(-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(-1)


@dataclass
class DistinctAttention:
    """The distinct tokens of every tracked class as c_hat slots, flat and sorted by class.

    classes: [K] indices of the classes in the groups; num_distinct: [K] each class's distinct
    tokens (held or not: a token that never occurred in its contexts has c_hat 0); unit,
    slot: [N] the class and c_hat slot of each held one; start: [K + 1] where each begins.
    """

    classes: Tensor
    num_distinct: Tensor
    unit: Tensor
    slot: Tensor
    start: Tensor

    @classmethod
    def of(cls, traj: Trajectory, groups: TokenGroups) -> DistinctAttention:
        plan = traj.plan
        c = find_sorted(plan.class_keys, groups.query * plan.vocab_size + groups.next_token)
        sizes = torch.tensor([t.numel() for t in groups.distinct], dtype=torch.long)
        ks = ((c >= 0) & (sizes > 0)).nonzero().flatten()
        unit = torch.repeat_interleave(torch.arange(ks.numel()), sizes[ks])
        tokens = torch.cat([groups.distinct[k] for k in ks.tolist()] or [torch.empty(0)]).long()
        slot = find_sorted(plan.triple_keys, c[ks][unit] * plan.vocab_size + tokens)
        held = slot >= 0
        unit, slot = unit[held], slot[held]
        return cls(ks, sizes[ks], unit, slot, segment_starts(unit, ks.numel()))

    @property
    def held(self) -> Tensor:
        """[K] the distinct tokens of each class that occurred in its contexts."""
        return torch.diff(self.start)

    def figures(self, c_hat: Tensor, thresholds: Tensor) -> dict[str, Tensor]:
        """Per class [..., K] from c_hat [..., N] of the held distinct tokens: ``mass`` on
        them, ``entropy`` of the attention over them renormalised and ``top_share`` (NaN where
        fewer than two are held: 0 and 1 by construction), and ``recall`` [..., K,
        thresholds]."""
        K = self.classes.numel()
        c = c_hat.double()

        def per_class(x: Tensor) -> Tensor:
            return x.new_zeros(*x.shape[:-1], K).index_add_(-1, self.unit, x)

        mass = per_class(c)
        q = c / mass[..., self.unit].clamp_min(1e-300)
        top = q.new_zeros(*q.shape[:-1], K).scatter_reduce(
            -1, self.unit.expand_as(q), q, "amax", include_self=True
        )
        ok = (mass > 0) & (self.held >= 2)
        recall = torch.stack(
            [per_class((c >= t).double()) for t in thresholds.tolist()]
            or [mass.new_zeros(mass.shape)],
            -1,
        )[..., : len(thresholds)]
        return {
            "mass": mass,
            "entropy": torch.where(ok, per_class(-torch.special.xlogy(q, q)), math.nan),
            "top_share": torch.where(ok, top, math.nan),
            "recall": recall / self.num_distinct[:, None].double(),
        }


def sparsity(
    traj: Trajectory, groups: TokenGroups, thresholds: Tensor | None = None
) -> Measurement:
    """Entropy of c_hat restricted to distinct tokens and renormalised (Fig. 6), averaged over
    classes; also the attention mass on distinct tokens, the top distinct token's share of it,
    and recall(threshold): the share of distinct tokens with c_hat >= threshold (Figs. 11, 12).

    Entropy and top share need two distinct tokens that occurred in the class's contexts: a
    class with one would give 0 and 1 by construction, so it counts for the mass and recall
    only (``sparsity_classes`` counts the classes the entropy averages; NaN where there is
    none, `SINGLE_DISTINCT` says why)."""
    groups.check_context(traj.plan)
    units = DistinctAttention.of(traj, groups)
    if not units.classes.numel():
        raise ValueError("no tracked class has distinct tokens")
    if thresholds is None:
        thresholds = torch.tensor([0.5, 1.0, 2.0]) / max(traj.plan.vocab_size, 1)
    per_class = units.figures(traj.c_hat[..., units.slot], thresholds)  # [S, L, H, K]
    values = {
        "entropy": _nanmean(per_class["entropy"]),
        "distinct_mass": per_class["mass"].mean(-1),
        "top_share": _nanmean(per_class["top_share"]),
    }
    recall = per_class["recall"].mean(-2)  # [S, L, H, thresholds]
    for j, t in enumerate(thresholds.tolist()):
        values[f"recall@{t:.4g}"] = recall[..., j]
    table = _frame(traj, values)
    table["sparsity_classes"] = int((units.held >= 2).sum())
    return Measurement("sparsity", table)


def _nanmean(x: Tensor) -> Tensor:
    """Mean over the last axis without NaNs; NaN (no warning) where all are NaN."""
    ok = ~torch.isnan(x)
    n = ok.sum(-1)
    return torch.where(n > 0, torch.nan_to_num(x).sum(-1) / n.clamp_min(1), math.nan)


def distinct_entropy_estimate(traj: Trajectory, groups: TokenGroups) -> Estimate:
    """[L, H] the entropy over distinct tokens at the last checkpoint, averaged over the
    classes (with equal weight, as `sparsity`) that hold two distinct tokens, with its
    interval's pieces: the classes are the units."""
    units = DistinctAttention.of(traj, groups)
    ent = units.figures(traj.c_hat[-1][..., units.slot], torch.empty(0))["entropy"]  # [L, H, K]
    return mean_over_units(ent.movedim(-1, 0), torch.ones(ent.shape[-1]), (0.0, math.inf))


def attention_entropy_estimate(traj: Trajectory) -> Estimate:
    """[L, H] the attention entropy at the last checkpoint (`attention_entropy`) with its
    interval's pieces: the tracked queries, weighted by their events, are the units."""
    ent = traj.query_entropy[-1].double()  # [L, H, Q]
    return mean_over_units(ent.movedim(-1, 0), traj.plan.query_events.double(), (0.0, math.inf))


SINGLE_DISTINCT = (
    "every class has a single distinct token, so the entropy over distinct tokens and the top"
    " share are not defined (they would be 0 and 1 by construction): relax the classification"
    " (lower purity= or min_support=, or guard=False), track more queries, or count the"
    " statistics over a larger corpus"
)


def over_queries(entropy: Tensor, plan) -> Tensor:
    """[...] the entropy `entropy` [..., Q] of each tracked query averaged over them, weighted
    by their events (`RecordPlan.query_events`; a NaN has no weight)."""
    w = plan.query_events.double()
    if w.numel() == 0 or float(w.sum()) == 0:
        raise ValueError("the trajectory tracks no query events")
    return _weighted_nanmean(entropy.double(), w)


def attention_entropy(traj: Trajectory) -> Measurement:
    """Fig. 10: the entropy (nats) of each head's attention row, averaged over every recorded
    evaluation position (events-weighted over the tracked queries), per checkpoint.

    The row is the recorded context: with ``plan_recording(include_self=True)`` the query's
    own position is in it, as the authors measured; by default it is not (the paper's model
    masks it).  ``values`` of the result: [S, L, H].
    """
    plan = traj.plan
    values = over_queries(traj.query_entropy, plan)  # [S, L, H]
    table = _frame(traj, {"attention_entropy": values})
    table.attrs["include_self"] = bool(plan.include_self)
    return Measurement("attention_entropy", table, values=values)


@torch.no_grad()
def position_entropy(
    model: HookedModel,
    tokens: Tensor,
    layers: Sequence[int] | None = None,
    include_self: bool = True,
    exclude_bos: bool = False,
    batch_size: int = 64,
) -> Tensor:
    """[L, H] mean entropy (nats) of the attention rows of every position of `tokens` [N, T].

    The measure of the paper's Fig. 10 ("average self-attention map entropy over the
    validation set"): every position T is one row, its weights renormalised over its context
    (positions before T, minus position 0 if `exclude_bos`, plus T itself if `include_self`,
    as the authors measured; the recorder's entropies leave T out).  Rows with an empty
    context are skipped.  No trajectory or plan needed: any text, all positions.

    >>> from scansnap_lens.models.training import attention_only_model
    >>> model = attention_only_model(vocab_size=10, d_model=8, n_ctx=6)  # no positions
    >>> same = torch.zeros(2, 6, dtype=torch.long)  # one token: attention is uniform
    >>> expected = torch.arange(1, 7.0, dtype=torch.float64).log().mean()  # row T: T + 1 positions
    >>> bool(torch.isclose(position_entropy(model, same)[0, 0], expected))
    True
    """
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [N, T] with T >= 2, got {tuple(tokens.shape)}")
    check_tokens(tokens, model_vocab_size(model))
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    T = tokens.shape[1]
    context = torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=0 if include_self else -1)
    if exclude_bos:
        context[:, 0] = False
    rows = context.any(-1)  # [T] positions with a context
    device = next(model.parameters()).device
    context = context.to(device)
    totals = {layer: torch.zeros(model.cfg.n_heads, dtype=torch.float64) for layer in layers}

    def keep(layer: int):
        def hook(pattern: Tensor, hook=None):
            a = pattern.double() * context  # [B, H, T, T]
            a = a / a.sum(-1, keepdim=True).clamp_min(1e-300)
            ent = -(a * torch.log(a.clamp_min(1e-300))).sum(-1)  # [B, H, T]
            totals[layer] += ent[..., rows.to(ent.device)].sum((0, 2)).cpu()

        return hook

    hooks = [(f"blocks.{layer}.attn.hook_pattern", keep(layer)) for layer in layers]
    with evaluating(model):
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size].to(device)
            run_until(model, batch, max(layers), hooks)
    count = tokens.shape[0] * int(rows.sum())
    return torch.stack([totals[layer] / count for layer in layers])
