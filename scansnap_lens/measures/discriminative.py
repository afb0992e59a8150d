"""Discriminative bias (Sec. 5, Theorem 2): a query's distinct tokens gain attention logit
and its common tokens lose it.

The one definition of the scan's figures, per query over its held distinct and common tokens
(`QueryTokens`): ``bias`` (mean dz of the distinct minus the common tokens), ``auroc`` (how
cleanly dz separates them) and ``matched_auroc`` (the same, each distinct token against the
common tokens of its query that are about as frequent: the control for token frequency).
Each returns its value per query and its influences per query and per context token, from
which `resampling.crossed` makes the interval.  Every query counts once: weighting queries by
their events would let the most frequent one decide (one carried half the weight on a
Pythia-like run) and leave a test without units; `discriminative_bias` gives the values over
checkpoints, `uncertainty.scan_uncertainty` the intervals, p-values and verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.measures.measurement import (
    Measurement,
    _frame,
    _weighted_nanmean,
    segment_ranks,
    segment_starts,
)
from scansnap_lens.measures.resampling import Estimate, crossed, kish
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "HELD_KNOTS",
    "HELD_SUPPORT",
    "MATCH_NEIGHBOURS",
    "MATCH_RATIO",
    "QueryTokens",
    "discriminative_bias",
]

MATCH_RATIO = 2**0.5  # a matched common token is at most this factor more or less frequent
MATCH_NEIGHBOURS = 8  # and among the this many nearest in frequency of its query
# the held AUROC's frequency terms bend at these quantiles of each log count: a head that
# follows frequency as a step (the top 30 % of words) is no straight line in the log count
HELD_KNOTS = (0.25, 0.5, 0.75)
HELD_SUPPORT = 2.0  # a held distinct token has a common one within this factor on every count
PAIR_BLOCK = 1 << 22  # the held AUROC orders at most this many (head, pair) values at once


@dataclass
class QueryTokens:
    """Every query's distinct and common tokens that the recording holds, as flat arrays sorted
    by query, each query's distinct tokens first: the per-query figures are segment sums over
    these, not a loop over queries.  Only queries with both kinds held are kept.

    query, events: [U] the query ids and their events N(m); unit, slot, token, count,
    distinct: [N] the query index, zbar slot, token id, count in the evaluation contexts
    (`RecordPlan.pair_count`) and kind of each entry; start: [U + 1] where each query's
    entries begin (and the end); corpus_count: [N] each entry's token's count as context in
    the corpus the kinds came from (`TokenGroups.token_count`, the word's frequency), and
    corpus_pair_count: [N] the pair's count C(m, l) there (`TokenGroups.pair_count_of`, what
    decided the token's kind), None without a corpus.
    """

    query: Tensor
    events: Tensor
    unit: Tensor
    slot: Tensor
    token: Tensor
    count: Tensor
    distinct: Tensor
    start: Tensor
    corpus_count: Tensor | None = None
    corpus_pair_count: Tensor | None = None

    @classmethod
    def of(cls, traj: Trajectory, groups: TokenGroups) -> QueryTokens:
        """The units of `traj` under `groups`; ValueError where no query has both kinds."""
        return cls.of_plan(traj.plan, groups)

    @classmethod
    def of_plan(cls, plan, groups: TokenGroups) -> QueryTokens:
        """The units a recording of `plan` (`RecordPlan`) will hold under `groups`."""
        groups.check_context(plan)
        sizes = torch.tensor([t.numel() for t in groups.distinct], dtype=torch.long)
        d_query = torch.repeat_interleave(groups.query, sizes)
        d_keys = torch.unique(d_query * plan.vocab_size + _cat(groups.distinct))  # union per query
        c_ids = [int(m) for m in groups.common]
        c_sizes = torch.tensor([groups.common[m].numel() for m in c_ids], dtype=torch.long)
        c_query = torch.repeat_interleave(torch.tensor(c_ids, dtype=torch.long), c_sizes)
        c_token = _cat([groups.common[m] for m in c_ids])
        query = torch.cat([d_keys // plan.vocab_size, c_query])
        token = torch.cat([d_keys % plan.vocab_size, c_token])
        kind = torch.cat([torch.zeros_like(d_keys), torch.ones_like(c_query)])  # 0: distinct
        slot = plan.pair_slot(query, token)
        held = slot >= 0
        query, token, kind, slot = query[held], token[held], kind[held], slot[held]
        ids, unit = torch.unique(query, return_inverse=True)
        counts = torch.zeros(ids.numel(), 2, dtype=torch.long)
        counts.index_put_((unit, kind), torch.ones_like(unit), accumulate=True)
        both = (counts > 0).all(-1)
        keep = both[unit]
        new_unit = torch.cumsum(both, 0) - 1
        unit, token, kind, slot = new_unit[unit[keep]], token[keep], kind[keep], slot[keep]
        order = torch.sort(unit * 2 + kind, stable=True).indices  # by query, distinct first
        unit, token, kind, slot = unit[order], token[order], kind[order], slot[order]
        ids = ids[both]
        start = segment_starts(unit, ids.numel())
        with_class, at = torch.unique(groups.query, return_inverse=True)  # every id has a class
        events = torch.zeros(with_class.numel(), dtype=torch.float64).index_add_(
            0, at, groups.events.double()
        )[torch.searchsorted(with_class, ids)]
        count = plan.pair_count[slot].clamp_min(1)
        if not ids.numel():
            raise ValueError(
                "no query has both distinct and common tokens in the trajectory: track the"
                " queries the statistics give distinct tokens (record with stats=) or relax the"
                " classification (see statistics.groups.Classification)"
            )
        corpus = pair = None
        if groups.token_count is not None:  # a token the corpus never held counts 1
            known = groups.token_count.numel()
            corpus = torch.where(token < known, groups.token_count[token.clamp_max(known - 1)], 0)
            corpus = corpus.double().clamp_min(1)
            pair = groups.pair_count_of(ids[unit], token)
            pair = None if pair is None else pair.clamp_min(1)
        return cls(ids, events, unit, slot, token, count, kind == 0, start, corpus, pair)

    # -- design: counts and segments, the same for every head ---------------------------
    @cached_property
    def num_distinct(self) -> Tensor:
        """[U] the distinct tokens held of each query."""
        return torch.bincount(self.unit[self.distinct], minlength=self.query.numel())

    @cached_property
    def num_common(self) -> Tensor:
        """[U] the common tokens held of each query."""
        return torch.bincount(self.unit[~self.distinct], minlength=self.query.numel())

    @cached_property
    def _kind_segments(self) -> tuple[Tensor, Tensor]:
        """(segment [N], start [2U + 1]): each query's distinct tokens, then its common ones."""
        segment = self.unit * 2 + (~self.distinct).long()
        return segment, segment_starts(segment, 2 * self.query.numel())

    @cached_property
    def token_index(self) -> Tensor:
        """[N] the index of each entry's token among the tokens the entries hold."""
        return torch.unique(self.token, return_inverse=True)[1]

    def _n_eff(self, coefficient: Tensor) -> tuple[Tensor, Tensor]:
        """(n_eff, dof): Kish's n_eff of the tokens of the sparser kind, each token weighted by
        its total |coefficient| [N] in the figure (a token shared by queries counts once), or
        the number of queries where fewer (with one query the figure is about that query's
        tokens; with several, about queries like these); and the design's degrees of freedom,
        Kish's n_eff of the squared weights (the variance's own units), likewise."""
        sides, dof = [], []
        for mask in (self.distinct, ~self.distinct):
            per_token = torch.zeros(int(self.token_index.max()) + 1, dtype=torch.float64)
            per_token.index_add_(0, self.token_index[mask], coefficient[mask].abs().double())
            sides.append(kish(per_token))
            dof.append(kish(per_token**2))
        per_query = torch.zeros(self.query.numel(), dtype=torch.float64)
        per_query.index_add_(0, self.unit, coefficient.abs().double())
        queries = (per_query > 0).sum()
        if queries > 1:  # several queries: the figure is about queries like these, which count
            sides.append(queries.double())
            dof.append(queries.double())
        return torch.stack(sides).min(), torch.stack(dof).min()

    @cached_property
    def _kind_size(self) -> Tensor:
        """[N] how many tokens of its kind each entry's query holds."""
        n = torch.where(self.distinct, self.num_distinct[self.unit], self.num_common[self.unit])
        return n.double()

    @cached_property
    def _kind_coefficient(self) -> Tensor:
        """[N] each entry's weight in a mean over its query's tokens of its kind (queries
        weighted equally)."""
        return 1 / self._kind_size

    @cached_property
    def matched_pairs(self) -> tuple[Tensor, Tensor]:
        """(d [P], c [P]) entry indices: each distinct token with the (at most
        `MATCH_NEIGHBOURS`) common tokens of its query nearest in its count in the evaluation
        text, within a factor `MATCH_RATIO` (`pairs_matched_on`)."""
        return self.pairs_matched_on(self.count)

    @cached_property
    def corpus_matched_pairs(self) -> tuple[Tensor, Tensor] | None:
        """`matched_pairs` on the words' counts in the corpus (`corpus_count`); None without."""
        return None if self.corpus_count is None else self.pairs_matched_on(self.corpus_count)

    @cached_property
    def corpus_pair_matched_pairs(self) -> tuple[Tensor, Tensor] | None:
        """`matched_pairs` on the pairs' counts C(m, l) in the corpus (`corpus_pair_count`);
        None without."""
        c = self.corpus_pair_count
        return None if c is None else self.pairs_matched_on(c)

    def pairs_matched_on(self, count: Tensor) -> tuple[Tensor, Tensor]:
        """(d [P], c [P]) entry indices: each distinct token with the (at most
        `MATCH_NEIGHBOURS`) common tokens of its query nearest in `count` [N], within a factor
        `MATCH_RATIO`.  Sorted by query; one sort and one search, no loop over queries."""
        f = count.double().log()
        common = (~self.distinct).nonzero().flatten()
        key = self.unit[common].double() * 1e3 + f[common]  # log counts stay far below 1e3
        order = torch.argsort(key, stable=True)
        common, key = common[order], key[order]
        lo = torch.searchsorted(key, self.unit.double() * 1e3 - 1)  # where each query's begin
        hi = torch.searchsorted(key, self.unit.double() * 1e3 + 999)
        d = self.distinct.nonzero().flatten()
        at = torch.searchsorted(key, self.unit[d].double() * 1e3 + f[d])
        k = MATCH_NEIGHBOURS
        cand = at[:, None] + torch.arange(-k, k)[None, :]  # [D, 2k] positions in `common`
        inside = (cand >= lo[d][:, None]) & (cand < hi[d][:, None])
        cand = cand.clamp(0, max(common.numel() - 1, 0))
        dist = (f[common[cand]] - f[d][:, None]).abs() if common.numel() else cand.double()
        dist = torch.where(inside & (dist <= math.log(MATCH_RATIO) + 1e-9), dist, math.inf)
        best, pick = torch.topk(dist, min(k, 2 * k), largest=False, dim=-1)
        ok = torch.isfinite(best)
        d_idx = d[:, None].expand_as(pick)[ok]
        c_idx = common[cand.gather(-1, pick)[ok]] if common.numel() else d_idx[:0]
        return d_idx, c_idx

    @cached_property
    def all_pairs(self) -> tuple[Tensor, Tensor]:
        """(d [P], c [P]) entry indices: every distinct token of each query with every common
        token of it, sorted by query."""
        d_idx = self.distinct.nonzero().flatten()
        unit = self.unit[d_idx]
        reps = self.num_common[unit]
        first_common = self.start[unit] + self.num_distinct[unit]  # entries: distinct first
        d = torch.repeat_interleave(d_idx, reps)
        before = torch.repeat_interleave(torch.cumsum(reps, 0) - reps, reps)
        c = torch.repeat_interleave(first_common, reps) + torch.arange(d.numel()) - before
        return d, c

    @cached_property
    def frequency_counts(self) -> dict[str, Tensor]:
        """name -> [N] the counts the held AUROC holds: the pair's C(m, l) and the word's
        count in the corpus the kinds came from, or the pair's count in the evaluation text
        where the groups carry no corpus counts."""
        if self.corpus_count is None or self.corpus_pair_count is None:
            return {"pair": self.count.double()}
        return {"pair": self.corpus_pair_count.double(), "word": self.corpus_count.double()}

    @cached_property
    def _held_design(self) -> dict[str, Tensor] | None:
        """The held AUROC's least squares (`held_auroc_estimate`), the same for every head:
        ``d``, ``c`` [P] its pairs: every common token of a query with each of its distinct
        tokens that has a common token within a factor `HELD_SUPPORT` on every held count
        (where none has, the counts are apart in every pair and the model would only
        extrapolate); ``weight`` [P] (each query with pairs weighing 1 in all); ``design``
        [P, K]: the intercept and, per count, the difference of its log between the pair's
        tokens, of its hinges at `HELD_KNOTS` (frequency as any bent line) and its tanh (an
        ordering saturates); ``solve`` [K, K]; ``coefficient`` [P] each pair's weight in the
        intercept; ``share`` [N] an entry's share of its query's held distinct tokens; ``kept``
        [U] the queries with pairs.  None where no pair is left or the counts do not tell the
        intercept."""
        d, c = self.all_pairs
        logs = [count.clamp_min(1).log() for count in self.frequency_counts.values()]
        near = torch.ones_like(d, dtype=torch.bool)
        for x in logs:
            near &= (x[d] - x[c]).abs() <= math.log(HELD_SUPPORT) + 1e-9
        supported = torch.zeros_like(self.distinct)
        supported[d[near]] = True
        keep = supported[d]
        d, c = d[keep], c[keep]
        if not d.numel():
            return None
        U = self.query.numel()
        held = torch.bincount(self.unit[supported], minlength=U)  # held distinct per query
        kept = held > 0
        unit = self.unit[d]
        weight = 1 / (int(kept.sum()) * held[unit] * self.num_common[unit]).double()
        columns = [torch.ones_like(weight)]
        for x in logs:
            knots = torch.quantile(x, torch.tensor(HELD_KNOTS, dtype=torch.float64))
            columns.append(x[d] - x[c])
            columns += [(x[d] - k).clamp_min(0) - (x[c] - k).clamp_min(0) for k in knots]
            columns.append(torch.tanh(x[d] - x[c]))
        design = torch.stack(columns, -1)
        gram = design.T @ (design * weight[:, None])
        solve = torch.linalg.pinv(gram, hermitian=True)
        first = torch.zeros(design.shape[1], dtype=torch.float64)
        first[0] = 1
        if not torch.allclose(gram @ solve[:, 0], first, atol=1e-6):
            return None
        share = torch.where(supported, 1 / held[self.unit].clamp_min(1).double(), 0.0)
        share = torch.where(self.distinct, share, 1 / self.num_common[self.unit].double())
        return {
            "d": d,
            "c": c,
            "weight": weight,
            "design": design,
            "solve": solve,
            "coefficient": weight * (design @ solve[:, 0]),
            "share": share,
            "kept": kept,
        }

    def held_auroc_estimate(self, values: Tensor) -> Estimate:
        """The AUROC of `values` [..., N] with frequency held (the module): over the pairs of
        a distinct and a common token of a query (`_held_design`), whether the distinct one is
        above (ties half), least squares on the pair's count differences, read at none;
        queries weigh alike, and with equal counts it is the AUROC itself.  Its crossed
        interval's pieces are each token's part of the pairs' residuals (DeLong's placements
        where nothing is held).  NaN (too few units) where the counts leave it untold."""
        design = self._held_design
        lead = values.shape[:-1]
        if design is None:
            nan = torch.full(lead, math.nan, dtype=torch.float64)
            return Estimate(nan, nan, torch.zeros(lead, dtype=torch.float64), (0.0, 1.0))
        d, c, weight, z, solve = (design[k] for k in ("d", "c", "weight", "design", "solve"))
        coefficient, share, kept = design["coefficient"], design["share"], design["kept"]
        U, N = self.query.numel(), self.unit.numel()
        pair_unit = self.unit[d]
        flat = values.reshape(-1, N)
        value = torch.empty(flat.shape[0], dtype=torch.float64)
        residual = torch.zeros(flat.shape[0], U, dtype=torch.float64)
        A = torch.zeros(flat.shape[0], N, dtype=torch.float64)
        B = torch.zeros(flat.shape[0], N, dtype=torch.float64)
        step = max(1, PAIR_BLOCK // d.numel())
        for r in range(0, flat.shape[0], step):  # blocks of heads: pairs times heads is large
            v = flat[r : r + step]
            above = (v[:, d] > v[:, c]).double() + 0.5 * (v[:, d] == v[:, c])
            fitted = ((above * weight) @ z @ solve) @ z.T
            part = coefficient * (above - fitted)  # each pair's part of the intercept's error
            value[r : r + step] = above @ coefficient
            A[r : r + step].index_add_(-1, d, part)
            B[r : r + step].index_add_(-1, c, part)
            residual[r : r + step].index_add_(-1, pair_unit, part)
        value, residual = value.reshape(lead), residual.reshape(*lead, U)
        A, B = A.reshape(*lead, N), B.reshape(*lead, N)
        n = int(kept.sum())  # per query, a figure that averages to the value over the kept
        per_query = torch.where(kept, value[..., None] + n * residual, math.nan)
        nc = self.num_common[self.unit].double()
        distinct_part = torch.where(self.distinct, n * A + value[..., None] * share, 0.0)
        common_part = torch.where(self.distinct, 0.0, n * (B - residual[..., self.unit] / nc))
        carried = torch.zeros(N, dtype=torch.float64)
        carried.index_add_(0, d, coefficient.abs()).index_add_(0, c, coefficient.abs())
        return self._crossed(per_query, distinct_part, common_part, share, carried)

    # -- figures: one definition each, over any leading shape of `values` [..., N] -------
    def kind_means(self, values: Tensor) -> tuple[Tensor, Tensor]:
        """([..., U], [..., U]): the mean of `values` [..., N] over each query's distinct and
        over its common tokens."""
        U = self.query.numel()
        out = []
        for mask, n in ((self.distinct, self.num_distinct), (~self.distinct, self.num_common)):
            total = values.new_zeros(*values.shape[:-1], U)
            out.append(total.index_add_(-1, self.unit[mask], values[..., mask]) / n)
        return out[0], out[1]

    def figures(self, dz: Tensor, means: tuple[Tensor, Tensor] | None = None) -> dict:
        """The scan's figures of `dz` [..., N] (each entry's logit change since the first
        checkpoint), each query counting once: ``bias``, ``auroc``, ``dz_distinct`` and
        ``dz_common``, each [...].  means: `kind_means(dz)` where the caller has them."""
        d_mean, c_mean = self.kind_means(dz) if means is None else means
        w = torch.ones_like(self.events)
        return {
            "bias": _weighted_nanmean(d_mean - c_mean, w),
            "auroc": _weighted_nanmean(self.auroc(dz), w),
            "dz_distinct": _weighted_nanmean(d_mean, w),
            "dz_common": _weighted_nanmean(c_mean, w),
        }

    def ranks(self, values: Tensor) -> Tensor:
        """[..., N] the ranks of `values` [..., N] within each query (`segment_ranks`)."""
        return segment_ranks(values, self.unit, self.start)

    def auroc(self, values: Tensor, ranks: Tensor | None = None) -> Tensor:
        """[..., U] P(distinct > common) + P(equal) / 2 of `values` [..., N] within each query
        (Mann-Whitney U over ranks with ties averaged); NaN where a query holds a NaN.  `ranks`:
        `self.ranks(values)` where the caller has them already."""
        ranks = self.ranks(values) if ranks is None else ranks
        U = self.query.numel()
        total = ranks.new_zeros(*ranks.shape[:-1], U)
        rank_sum = total.index_add_(-1, self.unit[self.distinct], ranks[..., self.distinct])
        nd, nc = self.num_distinct.double(), self.num_common.double()
        return (rank_sum - nd * (nd + 1) / 2) / (nd * nc)

    def bias_estimate(self, values: Tensor) -> Estimate:
        """The bias of `values` [..., N] (distinct minus common mean per query, averaged over
        the queries) with its crossed interval's pieces."""
        d_mean, c_mean = self.kind_means(values)
        part = (values - c_mean[..., self.unit]) / self._kind_size  # against the query's commons
        return self._crossed(
            d_mean - c_mean,
            part,
            -part,
            1 / self._kind_size,
            self._kind_coefficient,
            bounds=(-math.inf, math.inf),
        )

    def auroc_estimate(self, values: Tensor, ranks: Tensor | None = None) -> Estimate:
        """The AUROC of `values` [..., N] (per query, averaged over the queries) with its
        crossed interval's pieces (DeLong's placement values within each query)."""
        ranks = self.ranks(values) if ranks is None else ranks
        per_query = self.auroc(values, ranks)
        own = segment_ranks(values, *self._kind_segments)
        others_below = ranks - own  # the other kind's tokens below (ties count half)
        nd, nc = self.num_distinct[self.unit].double(), self.num_common[self.unit].double()
        placement = torch.where(self.distinct, others_below / nc, (nd - others_below) / nd)
        common = placement - per_query[..., self.unit]  # DeLong's component of a common token
        return self._crossed(
            per_query,
            placement / self._kind_size,
            common / self._kind_size,
            1 / self._kind_size,
            self._kind_coefficient,
        )

    def matched_auroc_estimate(
        self, values: Tensor, pairs: tuple[Tensor, Tensor] | None = None
    ) -> Estimate:
        """The AUROC of `values` [..., N] over frequency-matched `pairs` (default
        `matched_pairs`), per query and averaged over the queries; queries without a matched
        pair are left out."""
        d, c = self.matched_pairs if pairs is None else pairs
        U = self.query.numel()
        pair_unit = self.unit[d]
        pairs = torch.bincount(pair_unit, minlength=U).double()
        above = (values[..., d] > values[..., c]).double() + 0.5 * (
            values[..., d] == values[..., c]
        )
        total = above.new_zeros(*above.shape[:-1], U).index_add_(-1, pair_unit, above)
        per_query = torch.where(pairs > 0, total / pairs.clamp_min(1), math.nan)
        n = pairs[pair_unit]
        zeros = values.new_zeros(values.shape).double()
        distinct_part = zeros.index_add(-1, d, above / n)
        common_part = zeros.index_add(-1, c, (above - per_query[..., pair_unit]) / n)
        in_pairs = torch.zeros(self.unit.numel(), dtype=torch.float64)
        in_pairs.index_add_(0, d, 1 / n)
        in_pairs.index_add_(0, c, 1 / n)  # an entry's share of its query's pairs
        est = self._crossed(per_query, distinct_part, common_part, in_pairs, in_pairs)
        est.pairs = True
        return est

    def _crossed(
        self,
        per_query: Tensor,
        distinct_part: Tensor,
        common_part: Tensor,
        share: Tensor,
        coefficient: Tensor,
        bounds=(0.0, 1.0),
    ) -> Estimate:
        """The mean over queries of `per_query` [..., U] (NaN: left out) and its influences,
        from the figure written as a sum over entries [..., N]: a distinct entry's part
        (`distinct_part`, summing to the query's figure over its distinct tokens; `share` [N]
        its share of them) less the mean's share of it, a common entry's part (`common_part`,
        summing to 0 over its query's common tokens).  The influence of a query is the sum of
        its entries', that of a token the sum over its entries in every query: a distinct
        token shared by many queries carries their deviations together.  Each is corrected
        for its leverage; `coefficient` [N]: each entry's weight in the figure (for n_eff)."""
        ok = ~torch.isnan(per_query)
        w = ok.double()  # every query counts once (its events enter through its zbar)
        total = w.sum(-1, keepdim=True)
        weight = w / total.clamp_min(1e-300)
        value = torch.where(
            total[..., 0] > 0, (torch.nan_to_num(per_query) * weight).sum(-1), math.nan
        )
        query_terms = weight * torch.nan_to_num(per_query - value[..., None])
        query_terms = query_terms / (1 - weight).clamp_min(1e-12).sqrt()  # leverage (CR2)
        mine = torch.where(self.distinct, distinct_part - value[..., None] * share, common_part)
        entry = weight[..., self.unit] * torch.nan_to_num(mine.double())
        room = 1 - weight[..., self.unit] * share.double()
        entry = torch.where(room > 1e-9, entry / room.clamp_min(1e-12).sqrt(), 0.0)
        token_terms = entry.new_zeros(*entry.shape[:-1], int(self.token_index.max()) + 1)
        token_terms.index_add_(-1, self.token_index, entry)
        n_eff, dof = (x.expand_as(value) for x in self._n_eff(coefficient))
        n_eff = torch.where(ok.any(-1), n_eff, 0.0)
        squares = [(x**2).sum(-1) for x in (query_terms, token_terms, entry)]
        est = crossed(value, *squares, n_eff, dof, bounds)
        est.terms = (query_terms, token_terms, entry)
        return est

    def difference(self, a: Estimate, b: Estimate) -> Estimate:
        """`a` - `b`, two figures of these units (made here, each with its influence terms),
        with the crossed interval of the difference: the same queries and tokens move both,
        so its influences are the differences of theirs (the raw AUROC less the held one
        moves little where both read one kind effect); NaN where either has none (a figure
        the counts left untold)."""
        if a.terms is None or b.terms is None:
            nan = torch.full_like(a.value, math.nan)
            return Estimate(nan, nan, torch.zeros_like(a.value))
        terms = [x - y for x, y in zip(a.terms, b.terms)]
        squares = [(x**2).sum(-1) for x in terms]
        dof = torch.minimum(a.df, b.df)
        return crossed(a.value - b.value, *squares, torch.minimum(a.n_eff, b.n_eff), dof)


def _cat(parts) -> Tensor:
    parts = list(parts)
    return torch.cat(parts).long() if parts else torch.empty(0, dtype=torch.long)


def discriminative_bias(traj: Trajectory, groups: TokenGroups) -> Measurement:
    """Mean dz of a query's distinct tokens minus its common tokens, and the AUROC of dz
    separating them; averaged over the queries with both kinds, each counting once (a query's
    events enter through its zbar; weighting by them would let one frequent query decide).
    The table also keeps the two means, dz_distinct and dz_common (bias is their difference)."""
    units = QueryTokens.of(traj, groups)
    z = traj.zbar[..., units.slot].double()  # [S, L, H, N], one read for every query
    dz = z - z[:1]
    d_mean, c_mean = units.kind_means(dz)  # [S, L, H, U]
    bias = d_mean - c_mean
    table = _frame(traj, units.figures(dz, (d_mean, c_mean)))
    table["bias_queries"] = units.query.numel()
    detail = pd.DataFrame(
        {
            "query": units.query.numpy(),
            "distinct": units.num_distinct.numpy(),
            "common": units.num_common.numpy(),
            "final_bias_mean_heads": bias[-1].mean((0, 1)).numpy(),
            "events": units.events.numpy(),
        }
    )
    return Measurement("discriminative_bias", table, detail)
