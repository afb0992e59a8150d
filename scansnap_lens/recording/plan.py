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

from scansnap_lens.statistics.context import Context
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence

if TYPE_CHECKING:
    from scansnap_lens.inputs.tokens import TokenizerLike

__all__ = [
    "CLASSES_PER_QUERY",
    "COMMON_PER_QUERY",
    "RecordPlan",
    "budget_queries",
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
        common_per_query: where the plan was made for power (`plan_recording` with `groups`),
            the most common tokens each query keeps, a uniform sample of those it has; None:
            every context token.
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
    common_per_query: int | None = None  # commons sampled per query (None: every one held)

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
        common_per_query: int | None = None,
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
        pair_keys, inverse = torch.unique(
            class_query[triple_class] * V + triple_token, return_inverse=True
        )
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
            common_per_query=common_per_query,
        )

    def for_queries(self, queries: Tensor) -> tuple[RecordPlan, dict[str, Tensor]]:
        """The plan restricted to `queries`, and per plan axis (`aggregates.AXES`: pairs,
        triples, classes, queries) the mask of its slots kept."""
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
        return sub, {"pairs": z, "triples": t, "classes": c, "queries": q}

    # the sizes of the plan's axes: Q queries, C classes, zbar pairs, c_hat triples
    num_queries = property(lambda self: self.queries.numel())
    num_classes = property(lambda self: self.class_query.numel())
    num_pairs = property(lambda self: self.pair_query.numel())
    num_triples = property(lambda self: self.triple_class.numel())

    @property
    def num_slots(self) -> int:
        """Values the plan's axes take per head (one per zbar pair, c_hat triple, class and
        query), what its queries cost; the rows aggregates add a fixed number of rows."""
        return self.num_pairs + self.num_triples + self.num_classes + self.num_queries

    def __repr__(self) -> str:
        sampled = "" if self.common_per_query is None else f", {self.common_per_query} commons"
        return f"RecordPlan({self.describe()}, V={self.vocab_size}, window={self.window}{sampled})"

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
        return find_sorted(self.pair_keys, torch.as_tensor(query) * self.vocab_size + _ids(tokens))

    def class_slot(self, query: int, next_token: int) -> int | None:
        """The slot of class (query, next_token), None where the plan does not track it."""
        c = int(
            find_sorted(self.class_keys, torch.tensor([int(query) * self.vocab_size + next_token]))
        )
        return None if c < 0 else c

    def triple_slot(self, c: int, tokens) -> Tensor:
        """[n] the c_hat slot of each token of class slot `c`, -1 where the plan holds none."""
        return find_sorted(self.triple_keys, c * self.vocab_size + _ids(tokens))

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
            "common_per_query": self.common_per_query,
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
            common_per_query=meta.get("common_per_query"),
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
        for name in (
            "queries",
            "class_query",
            "class_next",
            "pair_query",
            "pair_token",
            "triple_token",
        ):
            t = getattr(self, name)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
                out.append(f"{name} ids lie outside [0, vocab_size={V})")
        c = self.triple_class
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.num_classes):
            out.append("triple_class points outside the classes")
        for name, keys in (
            ("pairs", self.pair_keys),
            ("classes", self.class_keys),
            ("triples", self.triple_keys),
        ):
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
    at_least_one: bool = True,
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
    keep[0] |= at_least_one and not keep.any()
    return torch.sort(query[torch.from_numpy(keep)]).values


COMMON_PER_QUERY = 32  # common tokens a query keeps in a plan made for power (a sample)
CLASSES_PER_QUERY = 4  # classes (m, n) with distinct tokens whose c_hat a query keeps


def _hash_uniform(keys: Tensor, seed: int) -> Tensor:
    """[n] a number in [0, 1) for each int64 key, the same whatever other keys there are
    (splitmix64's finaliser of key + seed; int64 arithmetic wraps).

    >>> a = _hash_uniform(torch.tensor([5, 7, 9]), 0)
    >>> bool(torch.equal(a[1:], _hash_uniform(torch.tensor([7, 9]), 0))), bool((a < 1).all())
    (True, True)
    """
    x = keys.long() + seed * 0x632BE59BD9B4E019 % (1 << 62)
    x = (x ^ (x >> 30)) * -4658895280553007687  # 0xBF58476D1CE4E5B9 as int64
    x = (x ^ ((x >> 27) & ((1 << 37) - 1))) * -7723592293110705685  # 0x94D049BB133111EB
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    return ((x >> 11) & ((1 << 53) - 1)).double() / float(1 << 53)


def _power_plan(
    stats: CooccurrenceStats,
    groups,
    max_slots: int | None,
    common_per_query: int,
    classes_per_query: int,
    include_self: bool,
    seed: int,
):
    """The triples and kept classes of a plan made for power: the queries whose distinct and
    common tokens (by `groups`) both occur in the evaluation contexts, most events first, while
    they fit `max_slots` values per head; each keeps its distinct tokens and a uniform sample
    of at most `common_per_query` common ones (for zbar and c_hat), and the c_hat of at most
    `classes_per_query` of its classes with distinct tokens (most events first).  Vectorised
    over pairs and classes; one pass over the queries for the budget.

    Returns (the chosen query ids, the mask of the triples of `stats` kept, the mask of its
    classes whose c_hat is kept, the slots left of `max_slots`), or None where no query has
    both kinds in the evaluation text; a query without both keeps all its triples and
    classes.  `stats`: canonical (`CooccurrenceStats.canonical`)."""
    V = stats.vocab_size
    pair_key = stats.query[stats.triple_class] * V + stats.token  # [P'] per triple
    keys, at = torch.unique(pair_key, return_inverse=True)  # the evaluation's pairs
    sizes = torch.tensor([t.numel() for t in groups.distinct], dtype=torch.long)
    d_keys = (
        torch.repeat_interleave(groups.query, sizes) * V
        + torch.cat([*groups.distinct, torch.empty(0, dtype=torch.long)]).long()
    )
    c_keys = torch.cat(
        [m * V + t.long() for m, t in groups.common.items()] or [torch.empty(0, dtype=torch.long)]
    )
    is_d = torch.isin(keys, d_keys)
    is_c = torch.isin(keys, c_keys) & ~is_d
    ids = torch.unique(stats.query)
    q_of = torch.searchsorted(ids, keys // V)
    n_d = torch.zeros(ids.numel(), dtype=torch.long).index_add_(0, q_of, is_d.long())
    n_c = torch.zeros(ids.numel(), dtype=torch.long).index_add_(0, q_of, is_c.long())
    measurable = (n_d > 0) & (n_c > 0)
    if not bool(measurable.any()):
        return None
    # a uniform sample of each query's common tokens: rank them within the query by a seeded
    # random key and keep the first `common_per_query`
    shuffle = _hash_uniform(keys, seed)  # a pair's draw does not depend on the other pairs
    order = torch.argsort(q_of.double() * 2 + (~is_c).double() + shuffle / 2)  # commons first
    rank = torch.empty_like(order)
    first = torch.searchsorted(q_of[order], torch.arange(ids.numel()))
    rank[order] = torch.arange(order.numel()) - first[q_of[order]]
    kept_pair = measurable[q_of] & (is_d | (is_c & (rank < common_per_query)))
    # classes: those of the groups with distinct tokens, the most events first per query
    class_key = stats.query * V + stats.next_token
    with_distinct = groups.query[sizes > 0] * V + groups.next_token[sizes > 0]
    c_ids = torch.searchsorted(ids, stats.query)
    eligible = torch.isin(class_key, with_distinct) & measurable[c_ids]
    share = stats.events.double() / (2 * stats.events.max().clamp_min(1))
    c_order = torch.argsort(c_ids.double() * 2 + (~eligible).double() - share)
    c_rank = torch.empty_like(c_order)
    c_first = torch.searchsorted(c_ids[c_order], torch.arange(ids.numel()))
    c_rank[c_order] = torch.arange(c_order.numel()) - c_first[c_ids[c_order]]
    keep_class = eligible & (c_rank < classes_per_query)
    kept_triple = kept_pair[at]
    # the cost of each query per head, as `RecordPlan.num_slots` counts it
    cost = torch.zeros(ids.numel(), dtype=torch.long)
    cost.index_add_(0, q_of, kept_pair.long())  # zbar pairs
    t_class = stats.triple_class
    cost.index_add_(0, c_ids[t_class], (kept_triple & keep_class[t_class]).long())  # c_hat
    cost.index_add_(0, c_ids, keep_class.long() * (1 + int(include_self)))  # entropy (+ self)
    cost += 1 + int(include_self)  # the query's entropy (and its own pair)
    events = torch.zeros(ids.numel(), dtype=torch.long).index_add_(0, c_ids, stats.events)
    chosen = torch.zeros(ids.numel(), dtype=torch.bool)
    left = max_slots if max_slots is not None else None
    most_first = -events.double() / (events.max().double() + 1) - 2 * measurable.double()
    for i in torch.argsort(most_first, stable=True).tolist():
        if not measurable[i]:
            break  # one pass over the queries, most events first
        if left is None or int(cost[i]) <= left:
            chosen[i] = True
            left = None if left is None else left - int(cost[i])
    if not bool(chosen.any()):
        chosen[torch.nonzero(measurable).flatten()[0]] = True
    # a query without both kinds (one that fills the budget's rest) keeps all it has
    whole = ~measurable
    triple_ok = (kept_triple & chosen[c_ids[t_class]]) | whole[c_ids[t_class]]
    return ids[chosen], triple_ok, (keep_class & chosen[c_ids]) | whole[c_ids], left


def _window(value) -> int | None:
    """A plan file's window: None (the whole row; files before windows) or W >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"window must be a positive integer or null, got {value!r}")
    return value


def _ids(tokens) -> Tensor:
    return torch.as_tensor(tokens, dtype=torch.long).reshape(-1)


def find_sorted(keys: Tensor, wanted: Tensor) -> Tensor:
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
    groups=None,
    common_per_query: int = COMMON_PER_QUERY,
    classes_per_query: int = CLASSES_PER_QUERY,
    context: Context | None = None,
) -> RecordPlan:
    """Build the plan for evaluation `tokens` [N, T] (or a list of such batches).

    Args:
        queries: None tracks every query token (or, with `max_slots`, those that fit it); a
            float q in (0, 1] the most frequent queries that cover a share q of the events;
            otherwise the token ids to track.
        max_slots, priority: with ``queries=None``, track the queries in order of `priority`
            (default: most frequent first) while the plan holds at most `max_slots` values per
            head (`budget_queries`).
        classes: (m, n) pairs whose c_hat is kept (default: every class of a tracked query);
            zbar always uses all events of a tracked query.  min_class_events: fewer, dropped.
        exclude_bos, include_self, window: the context convention, as `corpus.cooccurrence`
            counts it (window None: every position before the query); or `context`, one value.
        tokenizer: anything with ``decode([id])``, for readable token strings.
        groups: `TokenGroups` of the training corpus's statistics: with ``queries=None`` the
            plan is made for the scan's power (`_power_plan`): the queries whose distinct and
            common tokens both occur in the evaluation contexts, most events first, while
            they fit `max_slots`, each with its distinct tokens, at most `common_per_query`
            common ones and `classes_per_query` classes; the rest of the budget to the most
            frequent other queries whole.  Without such a query: as without groups.
    """
    rows = _rows(tokens)
    if not rows:
        raise ValueError("no evaluation tokens: the plan needs at least one row")
    context = Context.given(context, _window(window), exclude_bos, include_self)
    window, exclude_bos, include_self = context.window, context.exclude_bos, context.include_self
    stats_all = cooccurrence(rows, vocab_size, window=window, exclude_bos=exclude_bos)
    seed = int(stats_all.fingerprint[:8], 16)
    power = None
    if groups is not None and queries is None:
        power = _power_plan(
            stats_all.canonical(),
            groups,
            max_slots,
            common_per_query,
            classes_per_query,
            include_self,
            seed,
        )
    queries = _chosen_queries(stats_all, queries, power, max_slots, priority, include_self)
    stats = (
        stats_all
        if queries is None
        else cooccurrence(rows, vocab_size, window=window, exclude_bos=exclude_bos, queries=queries)
    )
    stats = stats.canonical()
    triple_cls, triple_l, triple_c = stats.triple_class, stats.token, stats.count
    power_classes = None
    if power is not None:  # the chosen queries' kept tokens and classes (no budget left to fit)
        _, kept, power_classes, _ = _power_plan(
            stats, groups, None, common_per_query, classes_per_query, include_self, seed
        )
        triple_cls, triple_l, triple_c = triple_cls[kept], triple_l[kept], triple_c[kept]
    if include_self:  # the query's own position adds one occurrence of m per event of (m, n)
        triple_cls, triple_l, triple_c = _with_self(
            stats, vocab_size, triple_cls, triple_l, triple_c
        )
    keep = stats.events >= min_class_events
    if power_classes is not None:
        keep &= power_classes
    if classes is not None:
        wanted = torch.tensor([m * vocab_size + n for m, n in classes], dtype=torch.long)
        keep &= torch.isin(stats.query * vocab_size + stats.next_token, wanted)
    plan = RecordPlan.from_counts(
        vocab_size,
        stats.query,
        stats.next_token,
        stats.events,
        triple_cls,
        triple_l,
        triple_c,
        keep=keep,
        exclude_bos=exclude_bos,
        include_self=include_self,
        fingerprint=int(stats.fingerprint, 16),
        window=window,
        common_per_query=None if power is None else common_per_query,
    )
    if tokenizer is not None:  # the tokens the groups leave out too: the report names them
        shared = getattr(groups, "shared", None)
        plan.token_strings = _token_strings(plan, tokenizer, shared)
    return plan


def _chosen_queries(stats, queries, power, max_slots, priority, include_self):
    """The queries a plan tracks: those given (a share of the events: the most frequent that
    cover it), or those made for power with the rest of the budget to the most frequent
    other queries whole, or those that fit `max_slots`, or every one (None)."""
    if power is not None:
        queries, left = power[0], power[3]
        if left is not None and left > 0:
            others = stats.query_counts()[0]
            others = others[~torch.isin(others, queries)]
            more = budget_queries(stats, left, others, include_self, at_least_one=False)
            queries = torch.sort(torch.cat([queries, more])).values
        return queries
    if isinstance(queries, float):
        return select_queries(stats, queries)
    if queries is None and max_slots is not None:
        return budget_queries(stats, max_slots, priority, include_self)
    return queries


def _with_self(stats, V: int, triple_cls, triple_l, triple_c):
    """The triples with the query's own position: one more occurrence of m per event."""
    triple_cls = torch.cat([triple_cls, torch.arange(stats.num_classes)])
    triple_l = torch.cat([triple_l, stats.query])
    triple_c = torch.cat([triple_c, stats.events])
    keys, inverse = torch.unique(triple_cls * V + triple_l, return_inverse=True)
    triple_c = torch.zeros(keys.numel(), dtype=torch.long).index_add_(0, inverse, triple_c)
    return keys // V, keys % V, triple_c


def _token_strings(plan: RecordPlan, tokenizer, extra: Tensor | None = None) -> dict[int, str]:
    from scansnap_lens.inputs.tokens import codec

    more = [] if extra is None else [extra.long()]
    ids = torch.unique(torch.cat([plan.queries, plan.class_next, plan.pair_token, *more]))
    try:
        decode = codec(tokenizer).decode
    except TypeError:  # anything else with decode([id])
        decode = lambda i: tokenizer.decode([i])  # noqa: E731
    return {int(i): decode(int(i)) for i in ids}


def _rows(tokens) -> list:
    if isinstance(tokens, Tensor):
        if tokens.ndim != 2:
            raise ValueError(f"evaluation tokens must be [batch, seq], got {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"evaluation tokens must be integer ids, got {tokens.dtype} values")
        return list(tokens)
    rows = []
    for batch in tokens:
        batch = torch.as_tensor(batch)
        if batch.dtype.is_floating_point or batch.dtype == torch.bool:
            raise ValueError(f"evaluation tokens must be integer ids, got {batch.dtype} values")
        rows.extend(batch if batch.ndim == 2 else [batch])
    return rows
