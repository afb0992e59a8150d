"""Frequency bias (Sec. 5, Theorem 3): among a class's distinct tokens, the more frequent
co-occurrence gains more attention logit.

The one definition: per class (`ClassTokens`), the Spearman correlation of dz with P(l|m, n)
over the distinct tokens the recording holds; averaged over classes with weights N(m, n).
`frequency_bias` gives it over checkpoints, `ClassTokens.estimate` its interval over classes
and `ClassTokens.null_p` its p-value against P shuffled within each class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
from scipy import stats as scipy_stats
from torch import Tensor

from scansnap_lens.measures.measurement import (
    Measurement,
    _frame,
    _tracked,
    _weighted_nanmean,
    segment_ranks,
    segment_starts,
)
from scansnap_lens.measures.resampling import Estimate, mean_over_units, normal_p
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["ClassTokens", "frequency_bias"]


@dataclass
class ClassTokens:
    """The distinct tokens the recording holds of every tracked class that has at least two
    of them with different P(l|m, n), flat and sorted by class.

    query, next_token, events: [K] the classes and N(m, n); unit, slot, p: [N] the class
    index, zbar slot and P(l|m, n) of each entry; start: [K + 1] where each class begins.
    """

    query: Tensor
    next_token: Tensor
    events: Tensor
    unit: Tensor
    slot: Tensor
    p: Tensor
    start: Tensor

    @classmethod
    def of(cls, traj: Trajectory, groups: TokenGroups) -> ClassTokens:
        """The units of `traj` under `groups` (`of_plan`)."""
        return cls.of_plan(traj.plan, groups)

    @classmethod
    def of_plan(cls, plan, groups: TokenGroups) -> ClassTokens:
        """The units a recording of `plan` (`RecordPlan`) holds under `groups`."""
        ks = torch.tensor(_tracked(plan, groups), dtype=torch.long)
        sizes = torch.tensor([groups.distinct[k].numel() for k in ks.tolist()], dtype=torch.long)
        unit = torch.repeat_interleave(torch.arange(ks.numel()), sizes)
        token = _cat([groups.distinct[k] for k in ks.tolist()]).long()
        p = _cat([groups.distinct_p[k] for k in ks.tolist()]).double()
        slot = plan.pair_slot(groups.query[ks][unit], token)
        held = slot >= 0
        unit, slot, p = unit[held], slot[held], p[held]
        K = ks.numel()
        n = torch.bincount(unit, minlength=K)
        top = torch.full((K,), -math.inf, dtype=torch.float64).scatter_reduce(
            0, unit, p, "amax", include_self=True
        )
        low = torch.full((K,), math.inf, dtype=torch.float64).scatter_reduce(
            0, unit, p, "amin", include_self=True
        )
        keep = (n >= 2) & (top > low)
        new = torch.cumsum(keep.long(), 0) - 1
        entry = keep[unit]
        unit, slot, p = new[unit[entry]], slot[entry], p[entry]
        ks = ks[keep]
        return cls(
            groups.query[ks],
            groups.next_token[ks],
            groups.events[ks].double(),
            unit,
            slot,
            p,
            segment_starts(unit, ks.numel()),
        )

    num_classes = property(lambda self: self.query.numel())  # K

    @property
    def sizes(self) -> Tensor:
        """[K] the held distinct tokens of each class."""
        return torch.diff(self.start)

    def spearman(self, values: Tensor) -> Tensor:
        """[..., K] Spearman's rho of `values` [..., N] with P(l|m, n) within each class
        (ranks with ties averaged, as scipy's); NaN where `values` are flat in a class."""
        mean_rank = ((self.sizes.double() + 1) / 2)[self.unit]
        rx = segment_ranks(values, self.unit, self.start) - mean_rank
        rp = segment_ranks(self.p, self.unit, self.start) - mean_rank
        return self._correlation(rx, rp)

    def mean_over_classes(self, rho: Tensor) -> Tensor:
        """[...] the figure `rho` [..., K] averaged over the classes, weights N(m, n)."""
        return _weighted_nanmean(rho, self.events)

    def pearson(self, values: Tensor) -> Tensor:
        """[..., K] Pearson's r of `values` [..., N] with P(l|m, n) itself within each class:
        the frequency bias in the form the dynamics give it (a distinct token's logit grows
        at a rate proportional to its attention, P(l|m, n) exp(z), Theorem 3); NaN where
        `values` are flat in a class."""
        return self._correlation(self._centred(values.double()), self._centred(self.p))

    def _centred(self, x: Tensor) -> Tensor:
        """`x` [..., N] less its mean within each class."""
        total = x.new_zeros(*x.shape[:-1], self.num_classes).index_add_(-1, self.unit, x)
        return x - (total / self.sizes.to(x.dtype))[..., self.unit]

    def _correlation(self, x: Tensor, y: Tensor) -> Tensor:
        """[..., K] sum x y / sqrt(sum x^2 sum y^2) within each class, of centred `x`, `y`."""

        def per_class(v: Tensor) -> Tensor:
            return v.new_zeros(*v.shape[:-1], self.num_classes).index_add_(-1, self.unit, v)

        den = torch.sqrt(per_class(x**2) * per_class(y**2))
        return torch.where(den > 0, per_class(x * y) / den.clamp_min(1e-300), math.nan)

    def estimate(self, values: Tensor) -> Estimate:
        """The weighted mean of `spearman(values)` [...] over classes, with its interval's
        pieces: the classes are the units (another draw of classes like these)."""
        rho = self.spearman(values)
        return mean_over_units(rho.movedim(-1, 0), self.events, bounds=(-1.0, 1.0))

    def growth_test(self, values: Tensor) -> tuple[Tensor, Tensor]:
        """(r [...], p [...]): the paper's frequency bias as a test, these classes' tokens the
        units: Pearson's r of `values` [..., N] with P(l|m, n) (`pearson`) averaged over the
        classes with weights n - 1 (the inverse of its variance under permutation), and its
        one-sided p-value of r > 0 against P shuffled within each class (mean 0, variance
        1 / sum (n - 1), nearly normal).  A head that prefers rare tokens has r < 0."""
        r = self.pearson(values)
        w = (self.sizes.double() - 1) * ~torch.isnan(r)
        total = w.sum(-1)
        mean = (torch.nan_to_num(r) * w).sum(-1) / total.clamp_min(1e-300)
        z = mean * total.sqrt()
        p = torch.from_numpy(scipy_stats.norm.sf(z.numpy()))
        return torch.where(total > 0, mean, math.nan), torch.where(total > 0, p, math.nan)

    def null_p(self, values: Tensor) -> Tensor:
        """[...] two-sided p-value of the weighted mean rho against P(l|m, n) shuffled within
        each class: under that null each class's rho has mean 0 and variance exactly
        1 / (n - 1) (a rank correlation of n tokens), and the weighted mean is nearly normal."""
        rho = self.spearman(values)
        ok = ~torch.isnan(rho)
        w = self.events * ok
        total = w.sum(-1)
        mean = (torch.nan_to_num(rho) * w).sum(-1) / total.clamp_min(1e-300)
        var0 = (w**2 / (self.sizes.double() - 1)).sum(-1) / total.clamp_min(1e-300) ** 2
        return torch.where(total > 0, normal_p(mean, var0.sqrt()), math.nan)


def _cat(parts) -> Tensor:
    parts = list(parts)
    return torch.cat(parts) if parts else torch.empty(0)


def frequency_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Spearman correlation of dz[m, l] with P(l|m, n) over the distinct tokens of each class,
    averaged over the classes the recording tracks with weights N(m, n).  Classes with fewer
    than two distinct tokens, or with all P equal, have no correlation and are left out; so
    are steps where dz is flat."""
    groups.check_context(traj.plan)
    units = ClassTokens.of(traj, groups)
    if not units.num_classes:
        raise ValueError("no class has two distinct tokens with different P(l|m, n)")
    z = traj.zbar[..., units.slot].double()  # [S, L, H, N]
    rho = units.spearman(z - z[:1])  # [S, L, H, K]
    table = _frame(traj, {"spearman": units.mean_over_classes(rho)})
    table["spearman_classes"] = units.num_classes
    final = rho[-1].flatten(0, 1)  # [L * H, K]
    final_mean = torch.where((~torch.isnan(final)).any(0), torch.nanmean(final, 0), math.nan)
    detail = pd.DataFrame(
        {
            "query": units.query.numpy(),
            "next": units.next_token.numpy(),
            "distinct": units.sizes.numpy(),
            "final_spearman_mean": final_mean.numpy(),
        }
    )
    return Measurement("frequency_bias", table, detail)
