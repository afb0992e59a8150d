"""Token kinds: the one vocabulary (`TokenKind`) and their assignment from co-occurrence
statistics (`token_kinds`, giving `TokenKinds`; the kinds and the paper's definitions:
docs/glossary.md, "Token kinds").

>>> [k.word for k in TokenKind]
['undetermined', 'distinct', 'common', 'query', 'next']

Kind tensors hold these integer codes; compare against the enum, never bare numbers.  The
synthetic laboratory also marks the query and next tokens themselves.  Counts are context
occurrences, so repeats of l in one window count more than once.

>>> from scansnap_lens.statistics.corpus import cooccurrence
>>> rows = torch.tensor([[5, 0, 1, 2], [6, 0, 1, 3], [5, 6, 1, 2]])
>>> kinds = token_kinds(cooccurrence(rows, vocab_size=7), guard=False)
>>> frame = kinds.to_dataframe()
>>> frame[frame["query"] == 1][["token", "kind", "support"]].to_dict("list")
{'token': [0, 5, 6], 'kind': ['common', 'distinct', 'common'], 'support': [2, 2, 2]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numba
import numpy as np
import pandas as pd
import torch
from scipy.stats import binom
from torch import Tensor

from scansnap_lens.statistics._counting import pair_counts, pair_summary, whole_share_p_values
from scansnap_lens.statistics.corpus import CooccurrenceStats

__all__ = ["COMMON", "DISTINCT", "UNDETERMINED", "TokenKind", "TokenKinds", "token_kinds"]


class TokenKind(IntEnum):
    UNDETERMINED = 0
    DISTINCT = 1
    COMMON = 2
    QUERY = 3
    NEXT = 4

    @property
    def word(self) -> str:
        """The lower-case name used in tables and figures."""
        return self.name.lower()


UNDETERMINED, DISTINCT, COMMON = TokenKind.UNDETERMINED, TokenKind.DISTINCT, TokenKind.COMMON
WORDS = {kind: kind.word for kind in (UNDETERMINED, DISTINCT, COMMON)}  # codes 0, 1, 2


@dataclass
class TokenKinds:
    """One entry per judged (query, context token) pair (``query`` is -1 when global).

    Attributes (all [Pz]: one row per (query, context token)):
        query, token: the query m (local) and the context token l.
        kind: UNDETERMINED, DISTINCT or COMMON.
        next_token: l's most frequent next token (the one it is distinct for, if distinct).
        support: occurrences of l in the contexts (of m), summed over next tokens.
        num_next: |Omega|, the number of next tokens l co-occurs with.
        purity: share of l's occurrences that go to ``next_token``.
        p_value: adjusted p-value of the guard (NaN when the guard is off or l is common).
    """

    scope: str
    vocab_size: int
    query: Tensor
    token: Tensor
    kind: Tensor
    next_token: Tensor
    support: Tensor
    num_next: Tensor
    purity: Tensor
    p_value: Tensor
    params: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.token.numel())

    def __repr__(self) -> str:
        counts = torch.bincount(self.kind, minlength=3).tolist()
        return (
            f"TokenKinds({len(self):,} pairs ({self.scope}): {counts[DISTINCT]:,} distinct,"
            f" {counts[COMMON]:,} common, {counts[UNDETERMINED]:,} undetermined; {self.params})"
        )

    def _select(self, query: int | None) -> Tensor:
        if self.scope == "global" or query is None:
            return torch.ones(len(self), dtype=torch.bool)
        return self.query == int(query)

    def distinct_tokens(self, query: int | None = None, next_token: int | None = None) -> Tensor:
        """Context tokens of kind distinct (for ``query``; for ``next_token`` if given)."""
        keep = self._select(query) & (self.kind == DISTINCT)
        if next_token is not None:
            keep &= self.next_token == int(next_token)
        return self.token[keep]

    def kind_map(self, query: int | None = None) -> Tensor:
        """[V] kind of every token (for ``query`` when local); unseen tokens UNDETERMINED."""
        keep = self._select(query)
        out = torch.full((self.vocab_size,), UNDETERMINED, dtype=torch.long)
        out[self.token[keep]] = self.kind[keep]
        return out

    def counts_by_query(self) -> pd.DataFrame:
        """Number of distinct, common and undetermined tokens of each query."""
        frame = self.to_dataframe()
        table = frame.groupby(["query", "kind"], observed=False).size().unstack(fill_value=0)
        return table.reindex(columns=list(WORDS.values()), fill_value=0).reset_index()

    def to_dataframe(self, decode=None) -> pd.DataFrame:
        """One row per judged pair; ``decode`` (id -> str, or a tokenizer) adds strings."""
        frame = pd.DataFrame(
            {
                "query": self.query.numpy(),
                "token": self.token.numpy(),
                "kind": pd.Categorical.from_codes(self.kind.numpy(), list(WORDS.values())),
                "next": self.next_token.numpy(),
                "support": self.support.numpy(),
                "num_next": self.num_next.numpy(),
                "purity": self.purity.numpy(),
                "p_value": self.p_value.numpy(),
            }
        )
        decode = _decoder(decode)
        if decode is not None:
            for col in ("query", "token", "next"):
                frame[f"{col}_str"] = [decode(int(i)) if i >= 0 else "" for i in frame[col]]
        return frame


def _decoder(decode):
    """id -> str from a callable, or from any tokenizer `tokens.codec` takes."""
    if decode is None or (callable(decode) and not hasattr(decode, "decode")):
        return decode
    from scansnap_lens.inputs.tokens import codec

    return codec(decode).decode


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """BH-adjusted p-values (monotone, capped at 1): p * n / (number of p-values <= p),
    then the running minimum from the largest p down.  Only the values below 1 are sorted
    (usually a minority, with few distinct values); a p-value of 1 stays 1."""
    n = p.size
    out = np.ones(n)
    below = np.flatnonzero(p < 1.0)
    if below.size:
        values = np.unique(p[below])
        where = np.searchsorted(values, p[below])
        at_most = np.cumsum(np.bincount(where, minlength=values.size))
        adjusted = np.minimum.accumulate((values * n / at_most)[::-1])[::-1]
        out[below] = np.minimum(adjusted, 1.0)[where]
    return out


def _guard_p_values(top, support, base, rivals) -> np.ndarray:
    """Bonferroni-corrected one-sided binomial p-values P(X >= top), X ~ Bin(support, base).
    Where every occurrence goes to the top next token (top = support, all of them when
    purity = 1) that is base ** support, computed directly."""
    p = whole_share_p_values(support, base, rivals)
    partial = np.flatnonzero(top < support)
    if partial.size:
        sf = binom.sf(top[partial] - 1, support[partial], base[partial])
        p[partial] = np.minimum(sf * rivals[partial], 1.0)
    return p


def _tensor(values: np.ndarray, dtype) -> Tensor:
    """A tensor of `values`, copied only where the dtype or layout asks for it."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))


def _blocks(class_offsets: np.ndarray, query_bounds: np.ndarray) -> np.ndarray:
    """[B + 1] query indices cutting the queries into blocks of about equal triple counts,
    four per thread (a few queries hold most triples)."""
    triples = class_offsets[query_bounds]  # [Q + 1] cumulative triples at each query's start
    num_queries = len(query_bounds) - 1
    targets = np.linspace(0, triples[-1], 4 * numba.get_num_threads() + 1)[1:-1]
    cuts = np.searchsorted(triples, targets, side="right")
    return np.unique(np.clip(np.r_[0, cuts, num_queries], 0, num_queries))


def _local_pairs(stats: CooccurrenceStats):
    """Per (query m, token l), by a linear pass over each query's triples (`pair_summary`):
    query, token, support, top count, top next token, |Omega_m(l)|, the base share of the top
    next token among m's context positions, and m's number of next tokens (Bonferroni)."""
    offsets = stats.offsets.numpy()
    count = stats.count.numpy()
    cum = np.concatenate([[0], np.cumsum(count)])
    class_total = (cum[offsets[1:]] - cum[offsets[:-1]]).astype(np.float64)
    queries, per_query = np.unique(stats.query.numpy(), return_counts=True)
    bounds = np.concatenate([[0], np.cumsum(per_query)])
    token, blocks = stats.token.numpy(), _blocks(offsets, bounds)
    starts = np.concatenate(
        [[0], np.cumsum(pair_counts(bounds, offsets, token, stats.vocab_size, blocks))]
    )
    # numpy allocates the output (numba would not ask for huge pages: page faults cost more
    # than the pass itself here)
    out = tuple(np.empty(starts[-1], np.int64) for _ in range(7))
    base = np.empty(starts[-1], np.float64)
    pair_summary(
        bounds,
        offsets,
        token,
        count,
        stats.vocab_size,
        blocks,
        queries.astype(np.int64),
        stats.next_token.numpy().astype(np.int64),
        class_total,
        starts,
        out,
        base,
    )
    query, token, support, top, top_next, num_next, rivals = out
    return query, token, support, top, top_next, num_next, base, rivals


def _global_pairs(stats: CooccurrenceStats):
    """As `_local_pairs` with the queries pooled (Omega(l) over all next tokens); query -1."""
    V = stats.vocab_size
    cls = stats.triple_class.numpy()
    key, inv = np.unique(
        stats.next_token.numpy()[cls] * V + stats.token.numpy(), return_inverse=True
    )
    count = np.bincount(inv, weights=stats.count.numpy()).astype(np.int64)
    nxt, tok = key // V, key % V
    next_ids, next_inv = np.unique(nxt, return_inverse=True)
    next_total = np.bincount(next_inv, weights=count)
    base_of_next = next_total / next_total.sum()
    order = np.lexsort((-count, tok))
    tok_s, count_s, next_s = tok[order], count[order], next_inv[order]
    starts = np.flatnonzero(np.r_[True, tok_s[1:] != tok_s[:-1]])
    support = np.add.reduceat(count_s, starts)
    top_n = next_s[starts]
    num_next = np.diff(np.r_[starts, len(tok_s)])
    rivals = np.full(len(starts), len(next_ids), dtype=np.int64)
    return (
        np.full(len(starts), -1),
        tok_s[starts],
        support,
        count_s[starts],
        next_ids[top_n],
        num_next,
        base_of_next[top_n],
        rivals,
    )


def token_kinds(
    stats: CooccurrenceStats,
    scope: str = "local",
    min_support: int = 1,
    purity: float = 1.0,
    guard: bool = True,
    alpha: float = 0.05,
) -> TokenKinds:
    """Label each context token distinct, common or undetermined.

    scope: "local" (Sec. 7: Omega_m(l) = {n : C(m, n, l) > 0}, per query m) or "global"
    (Sec. 3.2: Omega(l) over every query).  On real text nearly every frequent token meets
    several next tokens, so: ``min_support``: l needs this many context occurrences (with m)
    to be judged; ``purity``: l is distinct when its top next token takes at least this
    share (1.0: the paper's |Omega| = 1); ``guard``: it must also be significant, a one-sided
    binomial test of its top next token's count against the query's base next-token
    distribution, Bonferroni over the query's next tokens, then Benjamini-Hochberg over the
    candidates at ``alpha`` (a token distinct only by rarity becomes undetermined).
    ``purity=1.0, min_support=1, guard=False`` is exactly the paper's definition."""
    if scope not in ("local", "global"):
        raise ValueError(f"scope must be 'local' or 'global', got {scope!r}")
    if not 0.0 < purity <= 1.0:
        raise ValueError(f"purity must lie in (0, 1], got {purity}")
    if min_support < 1:
        raise ValueError(f"min_support must be >= 1, got {min_support}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    V = stats.vocab_size
    if scope == "local":
        query, token, support, top, top_next, num_next, base, rivals = _local_pairs(stats)
    else:
        query, token, support, top, top_next, num_next, base, rivals = _global_pairs(stats)
    share = top / support
    judged = support >= min_support
    cand = np.flatnonzero(judged & (share >= purity - 1e-12))  # looks distinct
    if guard:  # the binomial test only where support and purity already pass
        raw = _guard_p_values(top[cand], support[cand], base[cand], rivals[cand])
    # base and rivals are spent: their memory takes p_value and kind (fresh pages are slow)
    p_value, kind = base, rivals
    p_value.fill(np.nan)
    kind.fill(UNDETERMINED)
    kind[judged] = COMMON
    if guard:
        p_value[cand] = _benjamini_hochberg(raw)
        kind[cand] = np.where(p_value[cand] <= alpha, DISTINCT, UNDETERMINED)
    else:
        kind[cand] = DISTINCT
    return TokenKinds(
        scope=scope,
        vocab_size=V,
        query=_tensor(query, np.int64),
        token=_tensor(token, np.int64),
        kind=_tensor(kind, np.int64),
        next_token=_tensor(top_next, np.int64),
        support=_tensor(support, np.int64),
        num_next=_tensor(num_next, np.int64),
        purity=_tensor(share, np.float64),
        p_value=torch.from_numpy(p_value),
        params={"min_support": min_support, "purity": purity, "guard": guard, "alpha": alpha},
    )
