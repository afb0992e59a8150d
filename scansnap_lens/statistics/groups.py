"""Token groups the measurements compare: per class (m, n) its distinct tokens with P(l|m, n),
per query m its common tokens.

They come from the synthetic truth (`TokenGroups.from_synthetic`) or from corpus statistics and
their token kinds (`TokenGroups.from_statistics`, `TokenGroups.from_kinds`), so every
measurement runs the same way on the lab and on real models.

>>> from scansnap_lens.lab.synthetic import syn_small
>>> groups = TokenGroups.from_synthetic(syn_small())
>>> groups.num_classes, len(groups.distinct[0]), groups.common[int(groups.query[0])].numel()
(2, 10, 10)
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens._io import read_tensors, write_tensors
from scansnap_lens._settings import Settings, count, setting, share
from scansnap_lens.statistics.context import Context, require_same

GROUPS_FORMAT = "scansnap-groups-1"


def _flat(parts: list[Tensor], dtype=torch.long) -> Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


def _sizes(parts: list[Tensor]) -> Tensor:
    return torch.tensor([p.numel() for p in parts], dtype=torch.long)


__all__ = ["Classification", "TokenGroups"]

KINDS = "how context tokens get their kinds"
# A token distinct for more than this many times as many queries as the median distinct token
# leaves the scan's units (`Classification`): the verdict's spread is over tokens, and one
# shared by a third of the queries makes it one unit
# (docs/glossary.md, "Shared distinct tokens"; chosen in bench_calibration.py's real-text cases).
MAX_SHARED = 8


@dataclass(frozen=True)
class Classification(Settings):
    """How the context tokens of corpus statistics get their kinds and the classes their
    groups: the one set of settings (and defaults) that `TokenGroups.from_statistics`,
    ``scansnap report`` (each field an option: ``--min-support``, ...) and the report share,
    saved in ``summary.json`` and shown on the page.

    scope, min_support, purity, guard, alpha: `kinds.token_kinds` (``guard=False, purity=1,
    min_support=1`` is the paper's definition); min_events, min_distinct: the classes kept
    (`TokenGroups.from_kinds`).  The context window is the statistics' own
    (`CooccurrenceStats.window`): it is how they were counted.

    >>> Classification(purity=0.9).describe().split(", ")[:4]
    ['local scope', 'min_support 1', 'purity 0.9', 'binomial guard at alpha 0.05']
    """

    scope: str = setting(
        "local",
        KINDS,
        "distinct for the next token of its own query (local, Sec. 7) or of all"
        " queries (global, Sec. 3.2)",
        choices=("local", "global"),
    )
    min_support: int = setting(
        1, KINDS, "occurrences a context token needs before it is judged", reads=count(1)
    )
    purity: float = setting(
        1.0,
        KINDS,
        "a token is distinct when its top next token takes at least this share of"
        " its occurrences (1: the paper's definition)",
        reads=share,
    )
    guard: bool = setting(
        True,
        KINDS,
        "no binomial guard (by default a distinct-looking token must be"
        " significantly more often before its next token than the query's base rate, at alpha)",
    )
    alpha: float = 0.05
    min_events: int = 1
    min_distinct: int = setting(1, KINDS, "classes need this many distinct tokens", reads=count(0))
    max_shared: int = setting(
        MAX_SHARED,
        KINDS,
        "a token distinct for more than this many times as many queries as"
        " the median distinct token is left out of the scan's units, as distinct and as common"
        " (on WikiText the heading marker '=' is distinct for a third of the queries and would"
        " carry the verdict alone); 0 keeps every token",
        reads=count(0),
    )

    def __post_init__(self):
        if self.scope not in ("local", "global"):
            raise ValueError(f"scope must be 'local' or 'global' (scope=), got {self.scope!r}")
        for name in ("min_support", "min_events", "max_shared"):
            value = getattr(self, name)
            least = 0 if name == "max_shared" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least} ({name}=), got {value!r}")
        if (
            isinstance(self.min_distinct, bool)
            or not isinstance(self.min_distinct, int)
            or (self.min_distinct < 0)
        ):
            raise ValueError(
                f"min_distinct must be an integer >= 0 (min_distinct=), got {self.min_distinct!r}"
            )
        if not 0.0 < self.purity <= 1.0:
            raise ValueError(f"purity must lie in (0, 1] (purity=), got {self.purity!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha!r}")

    def describe(self) -> str:
        """One line for the page and the command line."""
        guard = f"binomial guard at alpha {self.alpha:g}" if self.guard else "no binomial guard"
        return (
            f"{self.scope} scope, min_support {self.min_support}, purity {self.purity:g}, {guard},"
            f" min_events {self.min_events}, min_distinct {self.min_distinct},"
            f" max_shared {self.max_shared}"
        )


def _empty_filter_message(counts: list[tuple[str, int]]) -> str:
    """Which filter emptied the classes, and what to relax."""
    chain = ", ".join(f"{n} {what}" for what, n in counts)
    first_zero = next(what for what, n in counts if n == 0)
    if "distinct" in first_zero:
        advice = (
            "no tracked class has enough distinct tokens: lower min_distinct=, or relax the"
            " classification (lower purity= or min_support=, or no binomial guard,"
            " guard=False), or count statistics over a larger corpus"
        )
    elif "tracked query" in first_zero:
        advice = (
            "the trajectory's queries do not occur as queries in the statistics: count the"
            " statistics on the same tokenizer and without a queries= restriction that"
            " excludes them"
        )
    elif "events" in first_zero:
        advice = "lower min_events"
    else:
        advice = "the statistics hold no class: count them on a larger corpus"
    return f"no class of the statistics passes the filters ({chain}): {advice}"


def check_vocabulary(stats_vocab: int, plan) -> None:
    """Statistics of V_s tokens measure a trajectory whose model has V_m >= V_s tokens when
    every id the recording tracks is < V_s: a model's vocabulary padded beyond its
    tokenizer's (Pythia: 50304 against 50277) is not a mismatch."""
    if stats_vocab > plan.vocab_size:
        raise ValueError(
            f"vocabulary mismatch: the statistics have {stats_vocab} tokens and the"
            f" trajectory's model only {plan.vocab_size}: count the statistics with the"
            " model's tokenizer"
        )
    used = [plan.queries, plan.pair_token, plan.class_next]
    top = max((int(t.max()) for t in used if t.numel()), default=-1)
    if top >= stats_vocab:
        raise ValueError(
            f"vocabulary mismatch: the trajectory tracks token id {top}, beyond the"
            f" statistics' {stats_vocab} tokens: count the statistics with the model's"
            " tokenizer (or give vocab_size=)"
        )


# measured on 2 cores: 0.35-0.56 us a triple of C(m, n, l) (the first-day and 160m benches)
CLASSIFY_SECONDS_PER_TRIPLE = 6e-7


@dataclass
class TokenGroups:
    """Per class k = (query[k], next_token[k]) with weight events[k]:
    distinct[k] ([D_k] token ids) and distinct_p[k] (P(l|m, n) of each); per query m:
    common[m] ([C_m] token ids).  source: "synthetic" or "corpus".  token_count [V]: how often
    each token occurs as context in the corpus the kinds came from (sum over m, n of
    C(m, n, l), the word's frequency); pair_key, pair_count [P]: the pair's count C(m, l) =
    sum over n of C(m, n, l) in that corpus, for every pair (m, l) of a kept query that
    occurs there, keyed m * V + l and sorted (`pair_count_of`).  The scan's frequency control
    matches on both; None for groups made by hand.  shared [S]: the tokens left out of every
    class and query because the corpus makes them distinct for more than
    `Classification.max_shared` queries (sorted; None: no such rule, groups made by hand)."""

    query: Tensor
    next_token: Tensor
    events: Tensor
    distinct: list[Tensor]
    distinct_p: list[Tensor]
    common: dict[int, Tensor]
    source: str = "corpus"
    context: Context | None = None  # of the statistics the groups came from (None: the lab)
    settings: Classification | None = None  # how they were classified (None: by hand, the lab)
    token_count: Tensor | None = None  # [V] each token's count as context in the corpus
    pair_key: Tensor | None = None  # [P] m * V + l, sorted
    pair_count: Tensor | None = None  # [P] C(m, l) in the corpus
    shared: Tensor | None = None  # [S] tokens left out: distinct for > max_shared queries

    def __post_init__(self) -> None:
        # the frequency control matches on the word's and the pair's counts together, and a
        # pair's key needs the vocabulary the word counts span: all three, or none
        given = [
            n for n in ("token_count", "pair_key", "pair_count") if getattr(self, n) is not None
        ]
        if given and len(given) < 3:
            missing = sorted({"token_count", "pair_key", "pair_count"} - set(given))
            raise ValueError(
                f"TokenGroups: {', '.join(given)} given without {' and '.join(missing)}: the"
                " scan's frequency control matches on the word's count and the pair's"
                " together; give all three (TokenGroups.from_statistics makes them) or none"
            )
        shared = self.shared
        if shared is not None and (
            not isinstance(shared, Tensor)
            or shared.dim() != 1
            or shared.is_floating_point()
            or shared.dtype == torch.bool
            or (shared.numel() and int(shared.min()) < 0)
        ):
            raise ValueError(
                "TokenGroups: shared must be a 1-D tensor of token ids (the tokens left out"
                f" of the scan's units), got {getattr(shared, 'shape', type(shared).__name__)}"
                f" {getattr(shared, 'dtype', '')}"
            )
        if self.pair_key is not None and self.pair_key.shape != self.pair_count.shape:
            raise ValueError(
                f"TokenGroups: pair_key {tuple(self.pair_key.shape)} and pair_count"
                f" {tuple(self.pair_count.shape)} differ in shape: one count per pair"
            )

    def __repr__(self) -> str:
        sizes = [t.numel() for t in self.distinct]
        return (
            f"TokenGroups({self.num_classes:,} classes of {len(set(self.query.tolist())):,}"
            f" queries, {sum(sizes):,} distinct tokens (median {_median(sizes)} per class),"
            f" common tokens of {len(self.common):,} queries, source={self.source!r})"
        )

    def save(self, path: str | Path) -> Path:
        """One safetensors file: the tensors (ragged ones flat, with their sizes) and, in its
        metadata, the source, context and classification."""
        common = sorted(self.common)
        tensors = {
            "query": self.query,
            "next_token": self.next_token,
            "events": self.events,
            "distinct": _flat(self.distinct),
            "distinct_p": _flat(self.distinct_p, torch.float64),
            "distinct_sizes": _sizes(self.distinct),
            "common_query": torch.tensor(common),
            "common": _flat([self.common[m] for m in common]),
            "common_sizes": _sizes([self.common[m] for m in common]),
        }
        for name in ("token_count", "pair_key", "pair_count", "shared"):
            if getattr(self, name) is not None:
                tensors[name] = getattr(self, name)
        said = {
            "source": self.source,
            "context": None if self.context is None else asdict(self.context),
            "settings": None if self.settings is None else self.settings.to_dict(),
        }
        return write_tensors(path, tensors, {"format": GROUPS_FORMAT, "groups": json.dumps(said)})

    @classmethod
    def load(cls, path: str | Path) -> TokenGroups:
        """Groups `save` wrote (safetensors: nothing is unpickled)."""
        meta, t = read_tensors(path, GROUPS_FORMAT, "token groups file (TokenGroups.save)")
        said = json.loads(meta["groups"])
        sizes = t["distinct_sizes"].tolist()
        common = dict(
            zip(t["common_query"].tolist(), t["common"].split(t["common_sizes"].tolist()))
        )
        return cls(
            t["query"],
            t["next_token"],
            t["events"],
            list(t["distinct"].split(sizes)),
            list(t["distinct_p"].split(sizes)),
            common,
            said["source"],
            None if said["context"] is None else Context(**said["context"]),
            None if said["settings"] is None else Classification.from_dict(said["settings"]),
            t.get("token_count"),
            t.get("pair_key"),
            t.get("pair_count"),
            t.get("shared"),
        )

    def check_context(self, plan) -> None:
        """Refuse a recording whose context convention differs from the statistics'."""
        require_same(self, plan)

    @property
    def num_classes(self) -> int:
        return self.query.numel()

    def pair_count_of(self, query: Tensor, token: Tensor) -> Tensor | None:
        """[N] C(m, l) in the corpus of each pair (`query`, `token`) [N] (0 where it never
        occurred there); None for groups without corpus counts."""
        if self.pair_key is None or self.token_count is None:
            return None
        key = query.long() * self.token_count.numel() + token.long()
        if not self.pair_key.numel():
            return torch.zeros(key.shape, dtype=torch.float64)
        at = torch.searchsorted(self.pair_key, key).clamp_max(self.pair_key.numel() - 1)
        return torch.where(self.pair_key[at] == key, self.pair_count[at].double(), 0.0)

    def classes_of(self, query: int) -> list[int]:
        """The indices of the classes whose query is `query` (none: [])."""
        return list(self._classes_of_query.get(int(query), ()))

    def distinct_of_query(self, query: int) -> Tensor:
        """Union of the distinct tokens of the classes of `query`."""
        parts = [self.distinct[k] for k in self.classes_of(query)]
        return torch.unique(torch.cat(parts)) if parts else torch.empty(0, dtype=torch.long)

    @cached_property
    def _classes_of_query(self) -> dict[int, list[int]]:
        """query -> its class indices, built once (a scan per query would be quadratic)."""
        out: dict[int, list[int]] = {}
        for k, m in enumerate(self.query.tolist()):
            out.setdefault(m, []).append(k)
        return out

    @classmethod
    def from_synthetic(cls, classes) -> TokenGroups:
        """The ground truth of `SequenceClasses`: distinct = owned by one class (Sec. 3.2)."""
        owner = classes.distinct_for()
        common_mask = classes.common_mask()
        distinct, distinct_p, common = [], [], {}
        for k in range(classes.num_classes):
            tokens = (owner == k).nonzero().flatten()
            distinct.append(tokens)
            distinct_p.append(classes.probs[k, tokens].double())
        for m in classes.query.unique().tolist():
            rows = (classes.query == m).nonzero().flatten()
            support = (classes.probs[rows] > 0).any(0)
            common[m] = (support & common_mask).nonzero().flatten()
        return cls(
            classes.query.clone(),
            classes.next_token.clone(),
            torch.ones(classes.num_classes, dtype=torch.long),
            distinct,
            distinct_p,
            common,
            source="synthetic",
        )

    @classmethod
    def from_statistics(
        cls,
        stats,
        queries=None,
        settings: Classification | None = None,
        **overrides,
    ) -> TokenGroups:
        """Assign the kinds of the context tokens of `stats` (`kinds.token_kinds`) and group
        them (`from_kinds`) with `settings` (default `Classification()`, the report's), any
        field replaced by a keyword (``purity=0.9``): the one call from statistics to the
        groups that every measurement takes.  queries: keep the classes of these queries (a
        trajectory's, ``traj.plan.queries``).  Without `queries`, the groups of one
        statistics value and settings are made once and shared (the recorder's plan and the
        command line's power take the same; seconds at a real corpus's size)."""
        from scansnap_lens.statistics.corpus import CooccurrenceStats

        if not isinstance(stats, CooccurrenceStats):
            raise TypeError(
                "TokenGroups.from_statistics needs CooccurrenceStats (statistics.cooccurrence,"
                f" CooccurrenceStats.load, scansnap stats), got {type(stats).__name__}"
            )
        settings = (settings or Classification()).replace(**overrides)
        if queries is not None:
            return cls._classified(stats, queries, settings)
        with stats._groups_lock:  # one made in the background (`ahead`) is waited for
            if settings not in stats._groups:
                stats._groups[settings] = cls._classified(stats, None, settings)
            return stats._groups[settings]

    @classmethod
    def _classified(cls, stats, queries, settings: Classification) -> TokenGroups:
        from scansnap_lens.statistics.kinds import token_kinds

        estimate = stats.num_triples * CLASSIFY_SECONDS_PER_TRIPLE
        if estimate > 10:  # a real corpus's statistics: said before it starts
            from tqdm.auto import tqdm

            tqdm.write(
                f"classifying the context tokens of {stats.num_triples:,} co-occurrences:"
                f" about {estimate:.0f} s"
            )
        kinds = token_kinds(
            stats,
            scope=settings.scope,
            min_support=settings.min_support,
            purity=settings.purity,
            guard=settings.guard,
            alpha=settings.alpha,
        )
        groups = cls.from_kinds(
            kinds, stats, queries, settings.min_events, settings.min_distinct, settings.max_shared
        )
        groups.settings = settings
        return groups

    @classmethod
    def ahead(cls, stats, settings: Classification | None = None) -> threading.Thread:
        """Start making `from_statistics(stats, settings=settings)` in a background thread
        and return it: a later call takes its groups, waiting for them if need be (the
        recorder classifies while it loads its first model: seconds each at a real corpus's
        size).  An error there is left for that later call to raise."""

        def classify() -> None:
            try:
                cls.from_statistics(stats, settings=settings)
            except Exception:  # the caller's own call raises it, in its thread
                pass

        thread = threading.Thread(target=classify, name="scansnap-groups", daemon=True)
        thread.start()
        return thread

    @classmethod
    def from_kinds(
        cls,
        kinds,
        stats,
        queries=None,
        min_events: int = Classification.min_events,
        min_distinct: int = Classification.min_distinct,
        max_shared: int = 0,
    ):
        """Groups from `token_kinds(stats)`: every class (m, n) of the statistics with a tracked
        query, its tokens labelled distinct for n, and P(l|m, n) from the statistics.

        min_events, min_distinct: keep only classes with at least this many events and
        distinct tokens (`Classification`'s defaults: real text has many classes and few
        distinct tokens; common tokens are kept for every query; 0 keeps every class).
        max_shared: leave out, as distinct and as common, every token distinct for more than
        this many times as many queries as the median distinct token, counted over every
        class with `min_events` of the corpus whatever `queries` keeps (`shared_tokens`; 0
        keeps them all): the same tokens for a recording's plan and its report.
        """
        if stats.num_triples == 0:
            raise ValueError(
                "the statistics hold no co-occurrence (C(m, n, l) is empty): count them on a"
                " larger corpus, or with a smaller min_count="
            )
        frame = stats.classes()
        keep = frame["events"] >= min_events
        counts = [("classes in the statistics", len(frame)), (f"with >= {min_events} events", 0)]
        counts[1] = (counts[1][0], int(keep.sum()))
        if queries is not None:
            keep &= frame["query"].isin([int(q) for q in queries])
            counts.append(("with a tracked query", int(keep.sum())))
        if min_distinct > 0:
            from scansnap_lens.statistics.kinds import DISTINCT

            d = kinds.kind == DISTINCT
            q = kinds.query[d] if kinds.scope == "local" else None
            n = kinds.next_token[d]
            pairs = pd.DataFrame({"query": q.numpy() if q is not None else -1, "next": n.numpy()})
            sizes = pairs.value_counts().rename("n").reset_index()
            sizes = sizes[sizes["n"] >= min_distinct]
            if kinds.scope == "local":
                key = frame[["query", "next"]].merge(sizes, on=["query", "next"], how="left")
            else:
                key = frame[["next"]].merge(sizes.drop(columns="query"), on="next", how="left")
            keep &= key["n"].notna().to_numpy()
            counts.append((f"with >= {min_distinct} distinct tokens", int(keep.sum())))
        all_queries = frame.loc[frame["events"] >= min_events, "query"].unique().tolist()
        whole, frame = frame, frame[keep]
        if frame.empty:
            raise ValueError(_empty_filter_message(counts))
        shared = None
        if max_shared:  # counted over every class of the corpus, whichever are kept here
            counted = whole[whole["events"] >= min_events]
            all_distinct, all_p = _distinct_of_classes(kinds, stats, counted)
            shared = shared_tokens(counted, all_distinct, max_shared)
            at = counted.index.get_indexer(frame.index).tolist()
            distinct, distinct_p = [all_distinct[i] for i in at], [all_p[i] for i in at]
        else:
            distinct, distinct_p = _distinct_of_classes(kinds, stats, frame)
        tracked = None if queries is None else {int(q) for q in queries}
        wanted = [m for m in all_queries if tracked is None or m in tracked]
        common = _common_of_queries(kinds, wanted)
        if max_shared:
            frame, distinct, distinct_p, common = _without(
                shared, frame, distinct, distinct_p, common, min_distinct
            )
            if frame.empty:
                raise ValueError(
                    f"every class's distinct tokens are distinct for more than max_shared ="
                    f" {max_shared} queries: give a larger max_shared (0 keeps every token)"
                )
        pair_key, pair_count = _pair_counts(stats, wanted)
        return cls(
            torch.tensor(frame["query"].to_numpy(), dtype=torch.long),
            torch.tensor(frame["next"].to_numpy(), dtype=torch.long),
            torch.tensor(frame["events"].to_numpy(), dtype=torch.long),
            distinct,
            distinct_p,
            common,
            source="corpus",
            context=stats.context,
            token_count=torch.bincount(
                stats.token, weights=stats.count.double(), minlength=stats.vocab_size
            ),
            pair_key=pair_key,
            pair_count=pair_count,
            shared=shared,
        )


def shared_tokens(frame: pd.DataFrame, distinct: list[Tensor], limit: int) -> Tensor:
    """[S] the tokens distinct for more than `limit` times as many of the queries of the
    classes in `frame` (rows of ``stats.classes()``, with their `distinct` tokens) as the
    median distinct token, sorted; each (query, token) counted once.  Relative to the median:
    where every distinct token serves many queries alike (the lab's topic words, distinct for
    each query), none carries the verdict alone and none is left out."""
    sizes = _sizes(distinct)
    query = torch.repeat_interleave(torch.tensor(frame["query"].to_numpy()), sizes)
    pairs = torch.unique(torch.stack([_flat(distinct), query.long()]), dim=1)
    ids, queries = torch.unique(pairs[0], return_counts=True)
    if not queries.numel():
        return ids
    return ids[queries > limit * queries.median()]


def _without(shared: Tensor, frame, distinct, distinct_p, common, min_distinct: int):
    """The classes and commons with the `shared` tokens taken out (flat, no pass per class); a
    class left with fewer than `min_distinct` distinct tokens is dropped."""
    sizes = _sizes(distinct)
    owner = torch.repeat_interleave(torch.arange(len(distinct)), sizes)
    flat, flat_p = _flat(distinct), _flat(distinct_p, torch.float64)
    keep = ~torch.isin(flat, shared)
    sizes = torch.bincount(owner[keep], minlength=len(distinct))
    kept = (sizes >= min_distinct).nonzero().flatten()
    distinct = list(flat[keep].split(sizes.tolist()))
    distinct_p = list(flat_p[keep].split(sizes.tolist()))
    if kept.numel() < len(distinct):
        frame = frame.iloc[kept.numpy()]
        distinct = [distinct[i] for i in kept.tolist()]
        distinct_p = [distinct_p[i] for i in kept.tolist()]
    queries = list(common)
    if queries and all(common[m] is common[queries[0]] for m in queries):  # global kinds: one
        tokens = common[queries[0]]
        tokens = tokens[~torch.isin(tokens, shared)]
        return frame, distinct, distinct_p, {m: tokens for m in queries}
    c_sizes = _sizes([common[m] for m in queries])
    c_owner = torch.repeat_interleave(torch.arange(len(queries)), c_sizes)
    c_flat = _flat([common[m] for m in queries])
    c_keep = ~torch.isin(c_flat, shared)
    parts = c_flat[c_keep].split(torch.bincount(c_owner[c_keep], minlength=len(queries)).tolist())
    return frame, distinct, distinct_p, dict(zip(queries, parts))


def _pair_counts(stats, queries: list[int]) -> tuple[Tensor, Tensor]:
    """(key [P], count [P]): C(m, l) = sum over n of C(m, n, l) of every pair of `queries`,
    keyed m * V + l and sorted; one pass over the triples."""
    triple_query = stats.query[stats.triple_class]
    keep = torch.isin(triple_query, torch.tensor(queries, dtype=torch.long))
    key = triple_query[keep] * stats.vocab_size + stats.token[keep]
    unique, at = torch.unique(key, return_inverse=True)
    count = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(
        0, at, stats.count[keep].double()
    )
    return unique, count


def _median(values: list[int]):
    return sorted(values)[len(values) // 2] if values else 0


def _distinct_of_classes(kinds, stats, frame: pd.DataFrame) -> tuple[list[Tensor], list[Tensor]]:
    """Per class of `frame` (rows of ``stats.classes()``): the tokens `kinds` call distinct
    for it that occur in its contexts (in the kinds' order), and P(l|m, n) of each.

    One sort of the distinct kinds and one of the statistics' triples, then binary searches:
    linear in the kinds and triples up to the sorts, with no pass per class.
    """
    from scansnap_lens.statistics.kinds import DISTINCT

    V = stats.vocab_size
    local = kinds.scope == "local"
    rows = (kinds.kind == DISTINCT).nonzero().flatten()
    row_key = kinds.next_token[rows] + (kinds.query[rows] * V if local else 0)
    order = torch.argsort(row_key, stable=True)  # stable: the kinds' order within a class
    rows, row_key = rows[order], row_key[order]
    cls = torch.tensor(frame.index.to_numpy(), dtype=torch.long)  # class index in stats
    query = torch.tensor(frame["query"].to_numpy(), dtype=torch.long)
    nxt = torch.tensor(frame["next"].to_numpy(), dtype=torch.long)
    key = nxt + (query * V if local else 0)
    lo = torch.searchsorted(row_key, key)
    size = torch.searchsorted(row_key, key, right=True) - lo
    owner = torch.repeat_interleave(torch.arange(key.numel()), size)  # [n] class of each
    start = torch.cumsum(size, 0) - size
    tokens = kinds.token[rows[torch.arange(owner.numel()) - start[owner] + lo[owner]]]
    triple_key, perm = torch.sort(stats.triple_class * V + stats.token)
    want = cls[owner] * V + tokens
    at = torch.searchsorted(triple_key, want).clamp_max(max(triple_key.numel() - 1, 0))
    seen = triple_key[at] == want if triple_key.numel() else torch.zeros_like(want, dtype=bool)
    count = stats.count[perm[at[seen]]].double()
    p = count / stats.total_context[cls[owner[seen]]].double()
    sizes = torch.bincount(owner[seen], minlength=key.numel()).tolist()
    return list(torch.split(tokens[seen], sizes)), list(torch.split(p, sizes))


def _common_of_queries(kinds, queries: list[int]) -> dict[int, Tensor]:
    """query -> the tokens `kinds` call common for it (in the kinds' order; the same
    tokens for every query when the kinds are global)."""
    from scansnap_lens.statistics.kinds import COMMON

    rows = (kinds.kind == COMMON).nonzero().flatten()
    if kinds.scope != "local":
        tokens = kinds.token[rows]
        return {m: tokens for m in queries}
    query = kinds.query[rows]
    order = torch.argsort(query, stable=True)
    ids, counts = torch.unique_consecutive(query[order], return_counts=True)
    parts = dict(zip(ids.tolist(), torch.split(kinds.token[rows[order]], counts.tolist())))
    empty = torch.empty(0, dtype=torch.long)
    return {m: parts.get(m, empty) for m in queries}
