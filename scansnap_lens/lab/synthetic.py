"""Sequence classes (paper Sec. 3.2): the synthetic data whose ground truth is known.

Each class ``n`` is a triple (query ``m``, next token ``n``, P(l|n)); a sequence of the class
has ``T - 1`` context tokens drawn i.i.d. from P(.|n), then the query, and its label is the
next token.  Vocabulary layout, in index order (the authors' own):

    global common | per-query common (a block per query) | distinct (a block per next token)
    | query tokens | next tokens

>>> classes = syn_small()
>>> classes.vocab_size, classes.num_classes
(34, 2)
>>> tokens, labels, class_idx = classes.sample(4, 128, torch.Generator().manual_seed(0))
>>> tokens.shape, labels.shape
(torch.Size([4, 128]), torch.Size([4]))
>>> bool((tokens[:, -1] == classes.query[class_idx]).all())
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from scansnap_lens.statistics.kinds import TokenKind

__all__ = ["SequenceClasses", "sequence_classes", "sequence_sampler", "syn_medium", "syn_small"]

# `SequenceClasses.kind` codes (`kinds.TokenKind`); a token in no class is UNDETERMINED.
UNDETERMINED, DISTINCT, COMMON = TokenKind.UNDETERMINED, TokenKind.DISTINCT, TokenKind.COMMON
QUERY, NEXT = TokenKind.QUERY, TokenKind.NEXT


@dataclass(frozen=True)
class SequenceClasses:
    """A mixture of sequence classes over a vocabulary of ``vocab_size`` tokens.

    Attributes:
        probs: [K, V] P(l|n), each row sums to 1 (the context distribution of class n).
        query: [K] the query token m = psi(n) of each class.
        next_token: [K] the next token (label) of each class.
    """

    probs: Tensor
    query: Tensor
    next_token: Tensor

    def __post_init__(self) -> None:
        if self.probs.ndim != 2:
            raise ValueError(f"probs must be [K, V], got shape {tuple(self.probs.shape)}")
        num_classes, vocab = self.probs.shape
        for name in ("query", "next_token"):
            ids = getattr(self, name)
            if ids.shape != (num_classes,):
                raise ValueError(f"{name} must have shape [{num_classes}], got {tuple(ids.shape)}")
            if ids.min() < 0 or ids.max() >= vocab:
                raise ValueError(f"{name} ids must lie in [0, {vocab})")
        if (self.probs < 0).any():
            raise ValueError("probs must be non-negative")
        if not torch.allclose(
            self.probs.sum(1),
            torch.ones(num_classes, dtype=self.probs.dtype, device=self.probs.device),
        ):
            raise ValueError("each row of probs must sum to 1")

    @property
    def num_classes(self) -> int:
        return self.probs.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.probs.shape[1]

    def support(self) -> Tensor:
        """[K, V] bool: P(l|n) > 0."""
        return self.probs > 0

    def distinct_for(self) -> Tensor:
        """[V] global definition (Sec. 3.2): the class index l is distinct for, -1 otherwise.

        Distinct means |Omega(l)| = 1: l is in the context support of exactly one class.
        """
        support = self.support()
        owner = support.float().argmax(0)
        return torch.where(support.sum(0) == 1, owner, torch.full_like(owner, -1))

    def distinct_for_query(self, query: int) -> Tensor:
        """[V] local definition (Sec. 7) for query m: the class l is distinct for among the
        classes of that query only, or -1."""
        rows = (self.query == query).nonzero().flatten()
        if rows.numel() == 0:
            raise ValueError(f"token {query} is the query of no class")
        support = self.support()[rows]
        single = support.sum(0) == 1
        owner = rows[support.float().argmax(0)]
        return torch.where(single, owner, torch.full_like(owner, -1))

    def kind(self) -> Tensor:
        """[V] per-token `TokenKind`: DISTINCT or COMMON (global definition), QUERY, NEXT, or
        UNDETERMINED for a token in no class."""
        count = self.support().sum(0)
        kind = torch.full((self.vocab_size,), UNDETERMINED, dtype=torch.long)
        kind[count == 1] = DISTINCT
        kind[count > 1] = COMMON
        kind[self.query] = QUERY
        kind[self.next_token] = NEXT
        return kind

    def common_mask(self) -> Tensor:
        """[V] bool: tokens in the context support of more than one class."""
        return self.support().sum(0) > 1

    def sample(
        self, batch_size: int, seq_len: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Online sampling: class uniform, ``seq_len - 1`` context tokens i.i.d., query last.

        Returns ``tokens`` [batch, seq_len], ``labels`` [batch] (next tokens) and ``class_idx``
        [batch].  The leading dimensions may be a tuple for many independent runs at once.
        """
        if seq_len < 2:
            raise ValueError(
                f"seq_len must be >= 2 (one context token and the query), got {seq_len}"
            )
        shape = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
        n = int(torch.tensor(shape).prod())
        class_idx = torch.randint(self.num_classes, (n,), generator=generator)
        context = torch.multinomial(
            self.probs[class_idx], seq_len - 1, replacement=True, generator=generator
        )
        tokens = torch.cat([context, self.query[class_idx, None]], dim=1)
        return (
            tokens.reshape(*shape, seq_len),
            self.next_token[class_idx].reshape(shape),
            class_idx.reshape(shape),
        )

    def token_labels(self) -> list[str]:
        """Readable names: ``c3`` common, ``d1.4`` distinct (class 1, rank 4), ``q0``, ``n1``."""
        names = [f"u{i}" for i in range(self.vocab_size)]
        owner = self.distinct_for()
        rank: dict[int, int] = {}
        for tok in range(self.vocab_size):
            if owner[tok] >= 0:
                k = int(owner[tok])
                names[tok] = f"d{k}.{rank.setdefault(k, 0)}"
                rank[k] += 1
        for i, tok in enumerate(self.common_mask().nonzero().flatten().tolist()):
            names[tok] = f"c{i}"
        for i, tok in enumerate(dict.fromkeys(self.query.tolist())):
            names[tok] = f"q{i}"
        for k, tok in enumerate(self.next_token.tolist()):
            names[tok] = f"n{k}"
        return names


def sequence_classes(
    num_queries: int,
    next_per_query: int,
    num_common: int = 10,
    num_common_per_query: int = 0,
    distinct_per_next: int = 10,
    distinct_weights: Sequence[float] | Tensor | None = None,
    common_weight: float = 1.0,
) -> SequenceClasses:
    """Build classes in the authors' vocabulary layout (see the module docstring).

    Each class puts unnormalised weight ``common_weight`` on every global common token and
    every common token of its query, and ``distinct_weights`` (default linspace(0.1, 1.0)) on
    its own block of distinct tokens, in index order; the row is then normalised.
    """
    for name, value in [("num_queries", num_queries), ("next_per_query", next_per_query)]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if min(num_common, num_common_per_query, distinct_per_next) < 0:
        raise ValueError("token counts must be non-negative")
    if distinct_weights is None:
        distinct_weights = torch.linspace(0.1, 1.0, distinct_per_next)
    distinct_weights = torch.as_tensor(distinct_weights, dtype=torch.float64)
    if distinct_weights.shape != (distinct_per_next,):
        raise ValueError(
            f"distinct_weights needs {distinct_per_next} entries,"
            f" got {tuple(distinct_weights.shape)}"
        )
    num_next = num_queries * next_per_query
    per_query_offset = num_common
    distinct_offset = per_query_offset + num_common_per_query * num_queries
    query_offset = distinct_offset + distinct_per_next * num_next
    next_offset = query_offset + num_queries
    vocab = next_offset + num_next

    probs = torch.zeros(num_next, vocab, dtype=torch.float64)
    query = torch.empty(num_next, dtype=torch.long)
    for k in range(num_next):
        m = k // next_per_query
        probs[k, :num_common] = common_weight
        start = per_query_offset + m * num_common_per_query
        probs[k, start : start + num_common_per_query] = common_weight
        start = distinct_offset + k * distinct_per_next
        probs[k, start : start + distinct_per_next] = distinct_weights
        query[k] = query_offset + m
    if (probs.sum(1) <= 0).any():
        raise ValueError("every class needs at least one context token with positive weight")
    probs = probs / probs.sum(1, keepdim=True)
    return SequenceClasses(probs.float(), query, torch.arange(next_offset, vocab))


def syn_small() -> SequenceClasses:
    """Syn-Small (Fig. 4): 2 queries, 1 next token each, 10 common, 10 distinct each; M = 34."""
    return sequence_classes(num_queries=2, next_per_query=1)


def syn_medium(num_queries: int = 1) -> SequenceClasses:
    """Syn-Medium (Fig. 6): ``num_queries`` queries with 2 next tokens each."""
    return sequence_classes(num_queries=num_queries, next_per_query=2)


def sequence_sampler(classes: SequenceClasses, seq_len: int = 32):
    """A sampler ``(batch_size, generator) -> [B, seq_len + 1]``: context, query, next token."""

    def sample(batch_size: int, generator: torch.Generator) -> torch.Tensor:
        tokens, labels, _ = classes.sample(batch_size, seq_len, generator)
        return torch.cat([tokens, labels[:, None]], 1)

    return sample
