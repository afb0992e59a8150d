"""What a recording tracks: query tokens, classes (m, n), and the slots of zbar and c_hat.

A `RecordPlan` is built once from the evaluation tokens, which stay the same for every
checkpoint.  Its slots are sparse, like `CooccurrenceStats`: one zbar slot per pair (m, l)
and one c_hat slot per triple (m, n, l) that actually occurs in the evaluation text, so
memory follows the text's co-occurrence structure, never V x V.

>>> rows = torch.tensor([[0, 1, 2, 1, 3], [0, 2, 2, 1, 3]])
>>> plan = plan_recording(rows, vocab_size=4, queries=[1], exclude_bos=True)  # 0 is BOS
>>> plan.pair_query.tolist(), plan.pair_token.tolist(), plan.pair_count.tolist()
([1, 1], [1, 2], [1, 3])
>>> plan.class_query.tolist(), plan.class_next.tolist(), plan.class_events.tolist()
([1], [3], [2])

(The query 1 at position 1 makes no event: with BOS excluded it has no context.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from scansnap_lens.recording.budget import BYTES_PER_VALUE
from scansnap_lens.statistics.context import Context
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence

if TYPE_CHECKING:
    from scansnap_lens.inputs.tokens import TokenizerLike

__all__ = [
    "RecordPlan",
    "budget_queries",
    "measured_queries",
    "plan_recording",
    "select_queries",
]


@dataclass
class RecordPlan:
    """Tracked queries and classes, and the sparse slots the recorder fills.

    Attributes:
        vocab_size: V of the evaluation tokens (must equal the model's d_vocab).
        exclude_bos: the first position of every row is not context.
        include_self: the query's own position counts as context.
        fingerprint: order-free hash of the evaluation rows the plan was built from.
        queries: [Q] tracked query tokens, ascending.
        query_events: [Q] events of each tracked query.
        class_query, class_next, class_events: [K] tracked classes (m, n), sorted, and N(m, n).
        pair_query, pair_token, pair_count: [Pz] zbar slots (m, l), sorted, and the number of
            (T, t) position pairs averaged in each.
        triple_class, triple_token, triple_count: [Pc] c_hat slots (class index, l), sorted, and
            C(m, n, l) (occurrences of l in the contexts of the class).
        token_strings: decoded strings of the ids the plan mentions, when a tokenizer was given.
        window: W, the most context positions before a query (None: the whole row), as the
            statistics count them (`CooccurrenceStats.window`).
    """

    vocab_size: int
    exclude_bos: bool
    include_self: bool
    fingerprint: int
    queries: Tensor
    query_events: Tensor
    class_query: Tensor
    class_next: Tensor
    class_events: Tensor
    pair_query: Tensor
    pair_token: Tensor
    pair_count: Tensor
    triple_class: Tensor
    triple_token: Tensor
    triple_count: Tensor
    token_strings: dict[int, str] = field(default_factory=dict)
    window: int | None = None

    @classmethod
    def from_counts(
        cls,
        vocab_size: int,
        class_query: Tensor,
        class_next: Tensor,
        class_events: Tensor,
        triple_class: Tensor,
        triple_token: Tensor,
        triple_count: Tensor,
        keep: Tensor | None = None,
        exclude_bos: bool = False,
        include_self: bool = False,
        fingerprint: int = 0,
        token_strings: dict[int, str] | None = None,
        window: int | None = None,
    ) -> RecordPlan:
        """The one constructor of plans: slots from counted classes and their context tokens.

        class_query, class_next, class_events: [K'] classes (m, n) and N(m, n), unique;
        triple_class, triple_token, triple_count: [P'] (class index, l) and C(m, n, l);
        keep: [K'] bool, the classes whose c_hat is kept (default all).  Every class counts
        for the queries' events and the zbar pairs (zbar averages all events of a query).
        """
        V = int(vocab_size)
        order = torch.argsort(class_query * V + class_next)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel())
        keep = torch.ones(order.numel(), dtype=torch.bool) if keep is None else keep
        keep, class_query, class_next = keep[order], class_query[order], class_next[order]
        class_events, triple_class = class_events[order], rank[triple_class]
        queries, inverse = torch.unique(class_query, return_inverse=True)
        query_events = torch.zeros(queries.numel(), dtype=torch.long)
        query_events.index_add_(0, inverse, class_events.long())
        pair_keys, inverse = torch.unique(class_query[triple_class] * V + triple_token,
                                          return_inverse=True)  # fmt: skip
        pair_count = torch.zeros(pair_keys.numel(), dtype=torch.long)
        pair_count.index_add_(0, inverse, triple_count.long())
        new_index = torch.cumsum(keep.long(), 0) - 1
        kept = keep[triple_class]
        triple_keys, at = torch.sort(new_index[triple_class[kept]] * V + triple_token[kept])
        return cls(
            vocab_size=V,
            exclude_bos=exclude_bos,
            include_self=include_self,
            fingerprint=fingerprint,
            queries=queries,
            query_events=query_events,
            class_query=class_query[keep],
            class_next=class_next[keep],
            class_events=class_events[keep].long(),
            pair_query=pair_keys // V,
            pair_token=pair_keys % V,
            pair_count=pair_count,
            triple_class=triple_keys // V,
            triple_token=triple_keys % V,
            triple_count=triple_count[kept][at].long(),
            token_strings=dict(token_strings or {}),
            window=window,
        )

    def for_queries(self, queries: Tensor) -> tuple[RecordPlan, dict[str, Tensor]]:
        """The plan restricted to `queries`, and per recorded tensor the mask of its slots
        kept (``zbar``, ``c_hat``, ``entropy``, ``query_entropy``)."""
        q = torch.isin(self.queries, queries)
        c = torch.isin(self.class_query, queries)
        z = torch.isin(self.pair_query, queries)
        t = c[self.triple_class]
        new_class = torch.cumsum(c.long(), 0) - 1
        sub = replace(
            self,
            queries=self.queries[q],
            query_events=self.query_events[q],
            class_query=self.class_query[c],
            class_next=self.class_next[c],
            class_events=self.class_events[c],
            pair_query=self.pair_query[z],
            pair_token=self.pair_token[z],
            pair_count=self.pair_count[z],
            triple_class=new_class[self.triple_class[t]],
            triple_token=self.triple_token[t],
            triple_count=self.triple_count[t],
        )
        return sub, {"zbar": z, "c_hat": t, "entropy": c, "query_entropy": q}

    @property
    def num_queries(self) -> int:
        return self.queries.numel()

    @property
    def num_classes(self) -> int:
        return self.class_query.numel()

    @property
    def num_pairs(self) -> int:
        return self.pair_query.numel()

    @property
    def num_triples(self) -> int:
        return self.triple_class.numel()

    @property
    def num_slots(self) -> int:
        """Values recorded per head: zbar pairs, c_hat triples, classes and queries."""
        return self.num_pairs + self.num_triples + self.num_classes + self.num_queries

    def checkpoint_bytes(self, layers: int, heads: int, prompt_length: int = 0) -> int:
        """Bytes of one checkpoint's tensors for `layers` x `heads` watched heads (and an
        example prompt of `prompt_length` tokens, whose [T, T] weights are kept)."""
        per_head = self.num_slots + prompt_length**2
        return BYTES_PER_VALUE * layers * heads * per_head

    def describe(self) -> str:
        """One line: what the plan tracks."""
        return (
            f"{self.num_queries:,} queries, {self.num_classes:,} classes,"
            f" {self.num_pairs:,} zbar pairs, {self.num_triples:,} c_hat triples"
        )

    # The lookup keys are built once per plan: every slot lookup searches them, and building
    # them per lookup made a measurement's lookups quadratic in the plan's size.
    @cached_property
    def pair_keys(self) -> Tensor:
        """[Pz] m * V + l, ascending: the lookup key of each zbar slot."""
        return self.pair_query * self.vocab_size + self.pair_token

    @cached_property
    def class_keys(self) -> Tensor:
        """[K] m * V + n, ascending."""
        return self.class_query * self.vocab_size + self.class_next

    @cached_property
    def triple_keys(self) -> Tensor:
        """[Pc] class * V + l, ascending."""
        return self.triple_class * self.vocab_size + self.triple_token

    def triple_pair(self) -> Tensor:
        """[Pc] the zbar slot (m, l) of every c_hat slot (m, n, l)."""
        return self.pair_slot(self.class_query[self.triple_class], self.triple_token)

    # -- slot lookups: the one place that maps (query, token) pairs to tensor slots --------
    def pair_slot(self, query, tokens) -> Tensor:
        """[n] the zbar slot of each pair (query, token), -1 where the plan holds none."""
        return _find(self.pair_keys, torch.as_tensor(query) * self.vocab_size + _ids(tokens))

    def class_slot(self, query: int, next_token: int) -> int | None:
        """The slot of class (query, next_token), None where the plan does not track it."""
        c = int(_find(self.class_keys, torch.tensor([int(query) * self.vocab_size + next_token])))
        return None if c < 0 else c

    def triple_slot(self, c: int, tokens) -> Tensor:
        """[n] the c_hat slot of each token of class slot `c`, -1 where the plan holds none."""
        return _find(self.triple_keys, c * self.vocab_size + _ids(tokens))

    def decode(self, token: int) -> str:
        return self.token_strings.get(int(token), str(int(token)))

    # -- serialisation: tensors + JSON metadata, used by `trajectory` --------------------
    def tensors(self) -> dict[str, Tensor]:
        return {
            f.name: getattr(self, f.name).contiguous()
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }

    def metadata(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "exclude_bos": self.exclude_bos,
            "include_self": self.include_self,
            "fingerprint": str(self.fingerprint),
            "token_strings": {str(k): v for k, v in self.token_strings.items()},
            "window": self.window,
        }

    @classmethod
    def from_parts(cls, meta: dict, tensors: dict[str, Tensor]) -> RecordPlan:
        return cls(
            vocab_size=int(meta["vocab_size"]),
            exclude_bos=bool(meta["exclude_bos"]),
            include_self=bool(meta["include_self"]),
            fingerprint=int(meta["fingerprint"]),
            token_strings={int(k): v for k, v in meta.get("token_strings", {}).items()},
            window=_window(meta.get("window")),
            **tensors,
        )

    def problems(self) -> list[str]:
        """What makes this plan inconsistent ([] for a plan `plan_recording` built): lengths,
        sorted slots, ids inside the vocabulary, class indices inside the classes."""
        out = []
        groups = {
            "queries": ("queries", "query_events"),
            "classes": ("class_query", "class_next", "class_events"),
            "pairs": ("pair_query", "pair_token", "pair_count"),
            "triples": ("triple_class", "triple_token", "triple_count"),
        }
        for what, names in groups.items():
            tensors = [getattr(self, n) for n in names]
            if any(t.dtype != torch.int64 or t.ndim != 1 for t in tensors):
                out.append(f"the {what} tensors must be 1-D int64")
            elif len({t.numel() for t in tensors}) > 1:
                out.append(f"the {what} tensors differ in length")
        if out:
            return out
        V = self.vocab_size
        for name in ("queries", "class_query", "class_next", "pair_query", "pair_token",
                     "triple_token"):  # fmt: skip
            t = getattr(self, name)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
                out.append(f"{name} ids lie outside [0, vocab_size={V})")
        c = self.triple_class
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.num_classes):
            out.append("triple_class points outside the classes")
        for name, keys in (("pairs", self.pair_keys), ("classes", self.class_keys),
                           ("triples", self.triple_keys)):  # fmt: skip
            if keys.numel() > 1 and not bool((torch.diff(keys) > 0).all()):
                out.append(f"the {name} are not sorted and unique")
        return out

    @property
    def context(self) -> Context:
        """The context convention of the recording: its window, position 0, the query's own."""
        return Context(
            window=self.window,
            exclude_bos=bool(self.exclude_bos),
            include_self=bool(self.include_self),
        )

    def same_as(self, other: RecordPlan) -> bool:
        """True when both plans track the same slots of the same evaluation text."""
        mine, theirs = self.metadata(), other.metadata()
        mine.pop("token_strings"), theirs.pop("token_strings")  # labels, not slots
        if mine != theirs:
            return False
        a, b = self.tensors(), other.tensors()
        return all(torch.equal(a[k], b[k]) for k in a)


def select_queries(stats: CooccurrenceStats, coverage: float) -> Tensor:
    """The most frequent query tokens that together hold at least `coverage` of all events."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
    query, events = stats.query_counts()
    order = torch.argsort(events, descending=True, stable=True)
    share = torch.cumsum(events[order].double(), 0) / events.sum()
    k = int(torch.searchsorted(share, torch.tensor([coverage], dtype=share.dtype)).item()) + 1
    return torch.sort(query[order[: min(k, order.numel())]]).values


def budget_queries(
    stats: CooccurrenceStats,
    max_slots: int,
    priority: Tensor | None = None,
    include_self: bool = False,
) -> Tensor:
    """The queries, taken in order of `priority` (default: most events first), each while the
    plan still fits `max_slots` values per head (`RecordPlan.num_slots`); a query too large
    for what is left is passed over for the smaller ones after it.  At least one query.

    stats: the co-occurrence of the evaluation tokens (every query), from which the plan's
    slots are counted: per query its classes, triples (m, n, l), pairs (m, l) and itself.
    priority: query ids, most wanted first; ids that never occur as queries are passed over.

    >>> from scansnap_lens.statistics.corpus import cooccurrence
    >>> rows = torch.tensor([[1, 2, 1, 3, 1, 2, 4]])
    >>> budget_queries(cooccurrence(rows, vocab_size=5), max_slots=12).tolist()
    [1]
    """
    V = stats.vocab_size
    query, _ = stats.query_counts()  # most events first
    if priority is not None:
        priority = torch.as_tensor(priority, dtype=torch.long).reshape(-1)
        query = priority[torch.isin(priority, query)]
    if query.numel() == 0:
        return query
    rank = torch.full((V,), -1, dtype=torch.long)
    rank[query] = torch.arange(query.numel())
    per_class = torch.diff(stats.offsets) + int(include_self)  # triples (and m itself)
    slots = torch.zeros(query.numel(), dtype=torch.long)
    wanted = rank[stats.query] >= 0
    slots.index_add_(0, rank[stats.query[wanted]], per_class[wanted] + 1)  # triples, class
    pair_keys = torch.unique(stats.query[stats.triple_class] * V + stats.token)
    pair_rank = rank[pair_keys // V]
    slots.index_add_(0, pair_rank[pair_rank >= 0], torch.ones_like(pair_keys[pair_rank >= 0]))
    slots += 1 + int(include_self)  # the query's own entropy slot (and its pair (m, m))
    keep, left = np.zeros(query.numel(), dtype=bool), int(max_slots)
    for i, size in enumerate(slots.tolist()):  # one pass over the queries, in order
        if size <= left:
            keep[i], left = True, left - size
    keep[0] |= not keep.any()
    return torch.sort(query[torch.from_numpy(keep)]).values


def measured_queries(stats: CooccurrenceStats) -> Tensor:
    """The queries the measurements can use, most events first: those with a class that
    `token_kinds(stats)` (its defaults, as the report's) gives a distinct token."""
    from scansnap_lens.statistics.kinds import DISTINCT, token_kinds

    kinds = token_kinds(stats)
    distinct = kinds.kind == DISTINCT
    if kinds.scope == "local":
        wanted = torch.unique(kinds.query[distinct])
    else:
        next_tokens = kinds.next_token[distinct]
        wanted = torch.unique(stats.query[torch.isin(stats.next_token, next_tokens)])
    query, _ = stats.query_counts()
    return query[torch.isin(query, wanted)]


def _window(value) -> int | None:
    """A plan file's window: None (the whole row; files before windows) or W >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"window must be a positive integer or null, got {value!r}")
    return value


def _ids(tokens) -> Tensor:
    return torch.as_tensor(tokens, dtype=torch.long).reshape(-1)


def _find(keys: Tensor, wanted: Tensor) -> Tensor:
    """Positions of `wanted` in the ascending `keys`, -1 where absent."""
    if keys.numel() == 0:
        return torch.full_like(wanted, -1)
    slot = torch.searchsorted(keys, wanted).clamp_max(keys.numel() - 1)
    return torch.where(keys[slot] == wanted, slot, -1)


def plan_recording(
    tokens: Tensor | Sequence,
    vocab_size: int,
    queries: Iterable[int] | Tensor | float | None = None,
    classes: Iterable[tuple[int, int]] | None = None,
    min_class_events: int = 1,
    exclude_bos: bool = False,
    include_self: bool = False,
    tokenizer: TokenizerLike | None = None,
    max_slots: int | None = None,
    priority: Tensor | None = None,
    window: int | None = None,
) -> RecordPlan:
    """Build the plan for evaluation `tokens` [N, T] (or a list of such batches).

    Args:
        queries: None tracks every query token (or, with `max_slots`, those that fit it); a
            float q in (0, 1] the most frequent queries that cover a share q of the events;
            otherwise the token ids to track.
        max_slots, priority: with ``queries=None``, track the queries in order of `priority`
            (default: most frequent first) while the plan holds at most `max_slots` values per
            head (`budget_queries`).
        classes: (m, n) pairs whose per-token attention c_hat is kept (default: every class of a
            tracked query); zbar always uses all events of a tracked query.
        min_class_events: drop classes with fewer events from c_hat.
        exclude_bos, include_self, window: the context convention (`context.Context`):
            position 0 is context unless exclude_bos, and a query's context is its `window`
            positions before it (None: every one), as `corpus.cooccurrence` counts them.
        tokenizer: anything with ``decode([id])`` (HF tokenizer, TransformerLens model's
            ``tokenizer``), for readable token strings.
    """
    rows = _rows(tokens)
    if not rows:
        raise ValueError("no evaluation tokens: the plan needs at least one row")
    window = _window(window)
    stats_all = cooccurrence(rows, vocab_size, window=window, exclude_bos=exclude_bos)
    if isinstance(queries, float):
        queries = select_queries(stats_all, queries)
    elif queries is None and max_slots is not None:
        queries = budget_queries(stats_all, max_slots, priority, include_self)
    stats = (
        stats_all
        if queries is None
        else cooccurrence(rows, vocab_size, window=window, exclude_bos=exclude_bos, queries=queries)
    )
    stats = stats.canonical()
    triple_cls, triple_l, triple_c = stats.triple_class, stats.token, stats.count
    if include_self:  # the query's own position adds one occurrence of m per event of (m, n)
        V = vocab_size
        triple_cls = torch.cat([triple_cls, torch.arange(stats.num_classes)])
        triple_l = torch.cat([triple_l, stats.query])
        triple_c = torch.cat([triple_c, stats.events])
        keys, inverse = torch.unique(triple_cls * V + triple_l, return_inverse=True)
        triple_c = torch.zeros(keys.numel(), dtype=torch.long).index_add_(0, inverse, triple_c)
        triple_cls, triple_l = keys // V, keys % V
    keep = stats.events >= min_class_events
    if classes is not None:
        wanted = torch.tensor([m * vocab_size + n for m, n in classes], dtype=torch.long)
        keep &= torch.isin(stats.query * vocab_size + stats.next_token, wanted)
    plan = RecordPlan.from_counts(
        vocab_size, stats.query, stats.next_token, stats.events, triple_cls, triple_l, triple_c,
        keep=keep, exclude_bos=exclude_bos, include_self=include_self,
        fingerprint=int(stats.fingerprint, 16), window=window,
    )  # fmt: skip
    if tokenizer is not None:
        ids = torch.unique(torch.cat([plan.queries, plan.class_next, plan.pair_token]))
        from scansnap_lens.inputs.tokens import codec

        try:
            decode = codec(tokenizer).decode
        except TypeError:  # anything else with decode([id])
            decode = lambda i: tokenizer.decode([i])  # noqa: E731
        plan.token_strings = {int(i): decode(int(i)) for i in ids}
    return plan


def _rows(tokens) -> list:
    if isinstance(tokens, Tensor):
        if tokens.ndim != 2:
            raise ValueError(f"evaluation tokens must be [batch, seq], got {tuple(tokens.shape)}")
        return list(tokens)
    rows = []
    for batch in tokens:
        batch = torch.as_tensor(batch)
        rows.extend(batch if batch.ndim == 2 else [batch])
    return rows
