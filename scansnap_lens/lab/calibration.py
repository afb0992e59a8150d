"""Trajectories whose truth is known, shaped like real text: what the scan's intervals, p-values
and verdict are checked against (``analyses/benchmarks/bench_calibration.py`` and the tests).

Each head's logit change of query m on context token l is

    dz[m, l] = a[m] + b[l] + effect * distinct(m, l) + noise[m, l]     (per head)

with a query effect a (which no within-query figure sees), a token effect b shared by every
query that holds l, and independent noise; b and noise together have variance 1 for a
common token.  Real text's structure comes from `Scenario`:

- ``queries`` with events drawn Zipf-like (one query can carry much of the weight),
- per query 1 + Poisson(0.7) distinct tokens of its own and ``commons`` common tokens drawn
  from a shared pool of ``pool`` tokens with Zipf weights (the frequent words are common for
  almost every query), or its own common tokens where ``pool`` is 0,
- ``token_share``: the token effect's share of the variance,
- ``distinct_pool``: the distinct tokens drawn from a small shared pool with Zipf weights (on
  WikiText, " =" is the distinct token of a third of the queries), so that a distinct
  token's effect too is shared by the queries that hold it,
- ``distinct_noise``: the distinct tokens' noise standard deviation against 1,
- ``frequency_slope``: a head that only follows token frequency: dz falls with the log count of
  the pair in the evaluation text (standardised), and the kinds mark rare tokens as distinct
  more often (no effect of the kind itself).

``effect`` is set from a target AUROC: P(dz of a distinct token > dz of a common token of the
same query) = Phi(effect / sqrt(2)) where the noise is equal.

>>> traj, groups, truth = crossed_run(Scenario(queries=8), heads=2, seed=0)
>>> traj.zbar.shape[:3], truth["auroc"].tolist()
(torch.Size([2, 1, 2]), [[0.5, 0.5]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from scansnap_lens.recording.plan import RecordPlan
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "HEAD_TYPE_SCENARIOS",
    "SCENARIOS",
    "CorpusScenario",
    "Scenario",
    "TextHead",
    "TextLayout",
    "corpus_run",
    "corpus_text",
    "crossed_run",
    "effect_for_auroc",
    "head_type_run",
    "head_type_truth",
    "text_run",
]


@dataclass(frozen=True)
class Scenario:
    """The structure of a synthetic trajectory (see the module)."""

    queries: int = 30
    pool: int = 400  # shared common tokens (0: every query has its own)
    commons: int = 40  # common tokens per query
    token_share: float = 0.2  # share of the variance that belongs to the token
    distinct_noise: float = 1.0  # noise sd of distinct tokens against common ones
    frequency_slope: float = 0.0  # a frequency-only head: dz ~ -slope * log count
    query_skew: float = 1.0  # events of the r-th query ~ 1 / r ** skew
    distinct_pool: int = 0  # distinct tokens shared by queries, Zipf-drawn (0: each its own)

    def with_queries(self, queries: int) -> Scenario:
        return replace(self, queries=queries)


# The null scenarios of the calibration benchmark: nothing depends on the token's kind.
SCENARIOS = {
    "clean": Scenario(pool=0, token_share=0.0, query_skew=0.0),
    "shared_pool_20": Scenario(token_share=0.2),
    "shared_pool_50": Scenario(token_share=0.5),
    "same_few_commons": Scenario(pool=6, commons=6, token_share=0.2),
    "unequal_noise": Scenario(token_share=0.2, distinct_noise=3.0),
    "shared_distinct": Scenario(token_share=0.2, distinct_pool=30),
    "frequency_only": Scenario(token_share=0.2, frequency_slope=1.0),
}


def effect_for_auroc(auroc: float) -> float:
    """The kind effect giving this AUROC where distinct and common tokens have equal noise."""
    return math.sqrt(2.0) * _probit(auroc)


def _probit(p: float) -> float:
    return math.sqrt(2.0) * torch.erfinv(torch.tensor(2 * p - 1, dtype=torch.float64)).item()


def _design(s: Scenario, g: torch.Generator) -> tuple:
    """`crossed_run`'s design drawn from `g`: per entry its query q [N], token t [N], kind
    is_d [N] and count [N]; the query ids [Q], their events [Q] and the vocabulary size."""
    Q = s.queries
    # the tokens of each query: own distinct ones, then common ones (shared pool or own)
    pool = max(s.pool, 0)
    num_distinct = 1 + torch.poisson(torch.full((Q,), 0.7), generator=g).long()
    if s.distinct_pool:
        num_distinct = num_distinct.clamp_max(s.distinct_pool)
    d_first = pool + torch.cumsum(num_distinct, 0) - num_distinct
    d_tokens = s.distinct_pool or int(num_distinct.sum())
    own_common = 0 if pool else s.commons
    c_first = pool + d_tokens + torch.arange(Q) * own_common
    query_ids = pool + d_tokens + Q * own_common + torch.arange(Q)
    d_zipf = 1.0 / torch.arange(1, max(s.distinct_pool, 1) + 1, dtype=torch.float64)
    vocab = int(query_ids[-1]) + 2  # one next token for every query: the last id
    zipf = 1.0 / torch.arange(1, max(pool, 1) + 1, dtype=torch.float64)
    entries_q, entries_t, entries_d, counts = [], [], [], []
    events = 1.0 / torch.arange(1, Q + 1, dtype=torch.float64) ** s.query_skew
    events = torch.round(events / events.min() * 10).long()
    for m in range(Q):  # a few tensors per query to build the design; the values are drawn once
        if s.distinct_pool:
            d = pool + torch.multinomial(d_zipf, int(num_distinct[m]), generator=g)
        else:
            d = d_first[m] + torch.arange(int(num_distinct[m]))
        if pool:
            take = min(s.commons, pool)
            c = torch.multinomial(zipf, take, replacement=False, generator=g)
            c_rate = zipf[c] / zipf[:take].mean() * 4.0
        else:
            c = c_first[m] + torch.arange(s.commons)
            c_rate = torch.full((s.commons,), 4.0, dtype=torch.float64)
        d_rate = torch.empty(d.numel(), dtype=torch.float64).exponential_(1 / 3.0, generator=g)
        rate = torch.cat([d_rate, c_rate])
        count = 1 + torch.poisson(rate, generator=g).long()
        entries_q.append(torch.full((rate.numel(),), m))
        entries_t.append(torch.cat([d, c]))
        entries_d.append(torch.cat([torch.ones(d.numel()), torch.zeros(c.numel())]).bool())
        counts.append(count)
    q, t, is_d, count = (torch.cat(x) for x in (entries_q, entries_t, entries_d, counts))
    if s.frequency_slope:  # the kinds follow frequency: rare tokens are distinct more often
        logc = count.double().log()
        rare = torch.sigmoid(-2.0 * (logc - logc.median()))
        is_d = torch.rand(logc.numel(), generator=g, dtype=torch.float64) < rare
        has_both = (
            torch.zeros(Q, 2, dtype=torch.long)
            .index_put_((q, is_d.long()), torch.ones_like(q), accumulate=True)
            .gt(0)
            .all(-1)
        )
        keep = has_both[q]
        q, t, is_d, count = q[keep], t[keep], is_d[keep], count[keep]
    return q, t, is_d, count, query_ids, events, vocab


def crossed_run(
    scenario: Scenario,
    heads: int = 8,
    layers: int = 1,
    auroc: Tensor | float = 0.5,
    seed: int = 0,
    values_seed: int | None = None,
) -> tuple[Trajectory, TokenGroups, dict[str, Tensor]]:
    """A two-checkpoint trajectory of `layers` x `heads` heads and its token groups, and the
    truth: ``auroc`` and ``bias`` [L, H] (the kind effect), from `auroc` (one value, or one
    per head [L, H]) under equal noise.  Seeded: the same seed gives the same run.
    values_seed: where given, the values are drawn from it and the structure (queries,
    tokens, plan, groups) from `seed`: runs of one recipe on one evaluation text."""
    g = torch.Generator().manual_seed(seed)
    s = scenario
    Q = s.queries
    target = torch.as_tensor(auroc, dtype=torch.float64).expand(layers, heads)
    effect = torch.tensor(
        [effect_for_auroc(float(a)) for a in target.reshape(-1)], dtype=torch.float64
    ).reshape(layers, heads)

    q, t, is_d, count, query_ids, events, vocab = _design(s, g)

    # the values: one draw for every head and entry
    if values_seed is not None:
        g = torch.Generator().manual_seed(values_seed)
    H = layers * heads
    N = q.numel()
    tau = s.token_share
    b = torch.randn(H, vocab, generator=g, dtype=torch.float64) * math.sqrt(tau)
    noise = torch.randn(H, N, generator=g, dtype=torch.float64) * math.sqrt(1 - tau)
    noise = torch.where(is_d, noise * s.distinct_noise, noise)
    a = torch.randn(H, Q, generator=g, dtype=torch.float64)
    dz = a[:, q] + b[:, t] + noise + effect.reshape(H, 1) * is_d
    if s.frequency_slope:
        logc = count.double().log()
        dz = dz - s.frequency_slope * (logc - logc.mean()) / logc.std().clamp_min(1e-12)

    next_token = torch.full((Q,), vocab - 1, dtype=torch.long)
    plan = RecordPlan.from_counts(
        vocab,
        query_ids,
        next_token,
        events,
        torch.as_tensor(q),
        t,
        count,
    )
    slot = plan.pair_slot(query_ids[q], t)
    zbar = torch.zeros(2, H, plan.num_pairs, dtype=torch.float64)
    zbar[0, :, slot] = torch.randn(H, N, generator=g, dtype=torch.float64)
    zbar[1, :, slot] = zbar[0, :, slot] + dz
    c_hat = torch.full((2, H, plan.num_triples), 1.0 / max(1, plan.num_triples))
    traj = Trajectory(
        plan,
        torch.tensor([0, 1000]),
        list(range(layers)),
        list(range(heads)),
        zbar=zbar.reshape(2, layers, heads, -1).float(),
        c_hat=c_hat.reshape(2, layers, heads, -1).float(),
        entropy=torch.zeros(2, layers, heads, plan.num_classes),
        query_entropy=torch.zeros(2, layers, heads, plan.num_queries),
        meta={"source": "lab.calibration"},
    )
    distinct = [t[(q == m) & is_d] for m in range(Q)]
    distinct_p = [count[(q == m) & is_d].double() / count[q == m].sum() for m in range(Q)]
    common = {int(query_ids[m]): t[(q == m) & ~is_d] for m in range(Q)}
    groups = TokenGroups(
        query_ids.clone(), next_token, events, distinct, distinct_p, common, source="synthetic"
    )
    truth = {"auroc": target.clone(), "bias": effect}
    return traj, groups, truth


HEAD_TYPE_SCENARIOS = {  # per-row effects of real text: skewed, a few rows far out
    "skewed": {"base": (1.0, 9.0)},  # mean 0.1, long right tail
    "very_skewed": {"base": (0.3, 3.0)},  # mean 0.09, most rows near 0, some near 1
    "near_one": {"base": (9.0, 1.0)},  # a sink: mean 0.9, long left tail
}


def head_type_run(
    rows: int = 32,
    heads: int = 2,
    rise: tuple[float, ...] = (0.6, 0.0),
    formed: float = 40.0,
    steps: int = 11,
    spacing: float = 10.0,
    seed: int = 0,
    name: str = "induction",
    base: tuple[float, float] = (1.0, 9.0),
    noise: float = 0.03,
) -> Trajectory:
    """A trajectory whose head-type scores have a known truth (`head_type_truth`): per row r
    and head h,

        score[s, r, h] = clip(base[r, h] + rise[h] * sigmoid((step_s - formed) / (spacing / 2))
                              + noise[s, r, h], 0, 1)

    with row effects base ~ Beta(*base) (skewed; `HEAD_TYPE_SCENARIOS`) and noise of sd
    `noise`: head h rises by rise[h] at step `formed` (0: never).  Steps 0, spacing, ...; one
    layer.  The plan is a stub (one query): only the rows aggregate `name` is held."""
    return _head_type(rows, rise, formed, steps, spacing, seed, name, base, noise, heads)[0]


def head_type_truth(
    rise,
    formed: float = 40.0,
    steps: int = 11,
    spacing: float = 10.0,
    base=(1.0, 9.0),
    noise: float = 0.03,
    rows: int = 400_000,
) -> Tensor:
    """[S, H] the population mean score of `head_type_run` at each step (Monte Carlo over
    `rows` rows, its error about 1e-4)."""
    return _head_type(rows, rise, formed, steps, spacing, 12345, "x", base, noise)[1]


def _head_type(rows, rise, formed, steps, spacing, seed, name, base, noise, heads=None):
    import numpy as np

    H = len(rise)
    if heads is not None and heads != H:
        raise ValueError(f"heads {heads} and rise {rise} differ in length")
    rng = np.random.default_rng(seed)
    t = torch.arange(steps, dtype=torch.float64) * spacing
    step = torch.sigmoid((t - formed) / (spacing / 2))  # [S]
    b = torch.from_numpy(rng.beta(base[0], base[1], (rows, H)))
    e = torch.from_numpy(rng.normal(0.0, noise, (steps, rows, H)))
    lift = torch.tensor(rise, dtype=torch.float64)
    score = (b[None] + lift[None, None] * step[:, None, None] + e).clamp(0, 1)  # [S, N, H]
    if rows > 10_000:
        return None, score.mean(1)
    plan = RecordPlan.from_counts(
        2,
        torch.tensor([0]),
        torch.tensor([1]),
        torch.tensor([1]),
        torch.tensor([0]),
        torch.tensor([0]),
        torch.tensor([1]),
    )
    values = score.permute(0, 2, 1)[:, None].float()  # [S, 1, H, N]
    traj = Trajectory(
        plan,
        t.long(),
        [0],
        list(range(H)),
        meta={"source": "lab.calibration"},
        **{name: values},
    )
    return traj, None


@dataclass(frozen=True)
class CorpusScenario:
    """A corpus and a head whose truth is known, counted and classified by the real pipeline
    (`corpus_run`).

    The corpus: ``rows`` rows of ``seq_len`` tokens; each row has a topic of ``topics``; a
    position holds, with probability 0.1, one of ``queries`` query tokens followed by one of its
    4 next tokens, else with probability 0.2 one of the topic's 5 words, else a background
    word drawn Zipf-like from ``vocab`` (the frequent words are common for every query, a rare
    one is distinct for the query it happened to meet).  With ``tied`` the next token of a
    query is the one its row's topic gives it (the topic's words are truly distinct for it),
    else any of its 4 (nothing ties a word to a next token).  With ``topical`` > 0 a word's rate
    with a query varies: each row has a query of its own (7 in 10 of its queries), and its
    background words are drawn with the Zipf weights times exp(topical * N(0, 1)), one draw
    per (query, word) (lognormal association: the pair's count C(m, l) then varies apart from
    the word's).  The evaluation text is the first ``eval_rows`` rows, as a recording takes
    them (so it is ``eval_rows / rows`` of the corpus the kinds came from).

    The head: dz = a[m] + b[l] + rarity + count + effect * distinct(m, l) + noise, with a token
    effect of variance ``token_share``, ``rarity_share`` of the variance following the word's
    rarity in the corpus (standardised -log count as context; negative: following its
    frequency), ``count_share`` following the pair's rarity in the evaluation text
    (standardised -log count), ``rate_share`` following the rarity of the pair's true rate (its
    expected count near the query, -log), ``pair_share`` following the rarity of the pair's
    count C(m, l) in the corpus (negative: its frequency, a frequent-pair head), and the noise
    the rest."""

    vocab: int = 600
    rows: int = 400
    seq_len: int = 64
    eval_rows: int = 64
    window: int = 16
    queries: int = 12
    topics: int = 24
    tied: bool = False
    token_share: float = 0.2
    rarity_share: float = 0.0
    count_share: float = 0.0
    topical: float = 0.0
    rate_share: float = 0.0
    pair_share: float = 0.0


def corpus_text(scenario: CorpusScenario, seed: int = 0):
    """([rows, seq_len] token ids, query ids [Q]) of `CorpusScenario`'s corpus."""
    return _corpus(scenario, seed)[:2]


def _corpus(scenario: CorpusScenario, seed: int):
    """`corpus_text` and the true rate [Q, V] of each word near each query (up to a factor)."""
    import numpy as np

    s = scenario
    rng = np.random.default_rng(seed)
    Q, K = s.queries, s.topics
    queries = np.arange(Q)
    nexts = Q + np.arange(4 * Q).reshape(Q, 4)  # each query's 4 next tokens
    topic_words = Q + 4 * Q + np.arange(5 * K).reshape(K, 5)
    first = Q + 4 * Q + 5 * K
    if first >= s.vocab:
        raise ValueError(f"vocab {s.vocab} leaves no background words (vocab=)")
    zipf = 1.0 / np.arange(1, s.vocab - first + 1)
    zipf /= zipf.sum()
    tie = rng.integers(0, 4, (K, Q))  # the next token a topic gives each query
    topic = rng.integers(0, K, s.rows)
    draw = rng.random((s.rows, s.seq_len))
    text = first + rng.choice(s.vocab - first, (s.rows, s.seq_len), p=zipf)
    background = np.tile(zipf, (Q, 1))  # [Q, V - first] each query's background weights
    if s.topical:  # drawn after the plain text: the scenarios without it keep their corpus
        background = zipf * np.exp(s.topical * rng.standard_normal((Q, zipf.size)))
        background /= background.sum(1, keepdims=True)
        own = rng.integers(0, Q, s.rows)  # each row's own query
        for q in range(Q):
            rows = np.nonzero(own == q)[0]
            text[rows] = first + rng.choice(zipf.size, (rows.size, s.seq_len), p=background[q])
    words = topic_words[topic[:, None], rng.integers(0, 5, (s.rows, s.seq_len))]
    text = np.where(draw < 0.3, words, text)
    is_query = draw < 0.1
    is_query[:, -1] = False
    is_query[:, 1:] &= ~is_query[:, :-1]  # a query's next token is no query
    r, t = np.nonzero(is_query)
    m = rng.integers(0, Q, r.size)
    if s.topical:
        m = np.where(rng.random(r.size) < 0.7, own[r], m)
    k = tie[topic[r], m] if s.tied else rng.integers(0, 4, r.size)
    text[r, t] = queries[m]
    text[r, t + 1] = nexts[m, k]
    rate = np.zeros((Q, s.vocab))  # a position's chance to hold the word, near each query
    mixed = 0.7 * background + 0.3 * background.mean(0) if s.topical else background
    rate[:, first:] = 0.6 * mixed
    rate[:, topic_words.reshape(-1)] = 0.2 / (5 * K)
    rate[:, Q:first] = 0.1 / (4 * Q)
    return torch.from_numpy(text).long(), torch.from_numpy(queries).long(), rate


def corpus_run(
    scenario: CorpusScenario,
    classification=None,
    heads: int = 8,
    auroc: Tensor | float = 0.5,
    seed: int = 0,
    values_seed: int | None = None,
):
    """A two-checkpoint trajectory of one layer of `heads` heads on `CorpusScenario`'s
    evaluation text, its token groups from the corpus statistics under `classification`
    (`statistics.groups.Classification`, default the report's), and the truth ``auroc`` [1, H]
    of the planted kind effect (one value, or one per head).  The structure comes from `seed`,
    the values from `values_seed` (default `seed`)."""
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import Classification

    s = scenario
    text, queries, true_rate = _corpus(s, seed)
    stats = cooccurrence(text, s.vocab, window=s.window)
    groups = TokenGroups.from_statistics(
        stats, queries=queries, settings=classification or Classification()
    )
    plan = plan_recording(text[: s.eval_rows], s.vocab, queries=queries, window=s.window)
    q, t = plan.pair_query, plan.pair_token
    pair_rate = torch.from_numpy(true_rate)[torch.searchsorted(queries, q), t]
    covariates = {
        "word": (s.rarity_share, groups.token_count[t].double().clamp_min(1)),
        "count": (s.count_share, plan.pair_count.double().clamp_min(1)),
        "rate": (s.rate_share, pair_rate),
        "pair": (s.pair_share, groups.pair_count_of(q, t).clamp_min(1)),
    }
    seed = seed if values_seed is None else values_seed
    traj, truth = _planted(plan, groups, 1, heads, auroc, s.token_share, covariates, seed)
    return traj, groups, truth


@dataclass
class TextLayout:
    """A real text's structure for `text_run`: its evaluation rows `tokens` [R, T] (word
    level), the statistics of its corpus and their `groups` (the report's classification
    unless given); `plan(rows)` the recording of the first rows, made for the scan's power
    as ``record --stats`` makes it (or of the given `queries`)."""

    tokens: Tensor
    vocab_size: int
    stats: object
    groups: TokenGroups
    tokenizer: object = None  # the word-level `tokenizers.Tokenizer`

    @classmethod
    def wikitext(cls, folder, seq_len: int = 64, window: int = 64, settings=None) -> TextLayout:
        """WikiText-2 as a user's first day has it: statistics of ``valid.txt`` (a context
        `window`), evaluation rows of `seq_len` words cut from ``test.txt``'s articles, one
        word-level vocabulary over both (`folder`: the one holding them)."""
        from pathlib import Path

        from scansnap_lens.inputs.text import (
            encode_documents,
            wikitext_documents,
            word_level_tokenizer,
        )
        from scansnap_lens.inputs.tokens import rows_of
        from scansnap_lens.statistics.corpus import cooccurrence

        valid = wikitext_documents(Path(folder) / "valid.txt")
        test = wikitext_documents(Path(folder) / "test.txt")
        tokenizer = word_level_tokenizer(valid + test)
        vocab = tokenizer.get_vocab_size()
        stats = cooccurrence(encode_documents(tokenizer, valid), vocab, window=window)
        groups = TokenGroups.from_statistics(stats, settings=settings)
        tokens = rows_of(encode_documents(tokenizer, test), seq_len)
        return cls(tokens, vocab, stats, groups, tokenizer)

    def plan(self, rows: int, queries: Tensor | None = None):
        """The `RecordPlan` of the first `rows` evaluation rows: for the scan's power (the
        groups' queries with both kinds, as ``record --stats``), or of `queries` whole."""
        from scansnap_lens.recording.plan import plan_recording

        groups = self.groups if queries is None else None
        return plan_recording(
            self.tokens[:rows],
            self.vocab_size,
            queries=queries,
            groups=groups,
            context=self.stats.context,
        )

    def ranked_queries(self, first: int, last: int) -> Tensor:
        """The query ids of frequency ranks [first, last) in the evaluation rows."""
        counts = torch.bincount(self.tokens.reshape(-1), minlength=self.vocab_size)
        return torch.sort(torch.argsort(counts, descending=True)[first:last]).values


@dataclass(frozen=True)
class TextHead:
    """A head on a real text's units (`text_run`): its token effect's share of the variance,
    and the shares that follow the word's rarity in the corpus (``word_share``; negative: its
    frequency) and the pair's, C(m, l) (``pair_share``; negative: a frequent-pair head).
    With ``top`` > 0 they follow a step instead of the log count: whether the count is among
    the ``top`` share of the recorded pairs' most frequent (a head that prefers the frequent
    words, no straight line in the log count)."""

    token_share: float = 0.2
    word_share: float = 0.0
    pair_share: float = 0.0
    top: float = 0.0


def text_run(
    plan,
    groups: TokenGroups,
    head: TextHead = TextHead(),
    layers: int = 6,
    heads: int = 8,
    auroc: Tensor | float = 0.5,
    seed: int = 0,
) -> tuple[Trajectory, dict[str, Tensor]]:
    """A two-checkpoint trajectory of `layers` x `heads` heads on a real text's pairs (`plan`,
    a `RecordPlan` of its evaluation rows) under its corpus's `groups`, every head a `head`
    with a planted kind effect of `auroc` (one value or [L, H]), and the truth ``auroc`` and
    ``bias`` [L, H].  Seeded: the text gives the structure, `seed` the values."""
    q, t = plan.pair_query, plan.pair_token
    counts = {
        "word": groups.token_count[t].double().clamp_min(1),
        "pair": groups.pair_count_of(q, t).clamp_min(1),
    }
    if head.top:  # the step as a count whose rarity (-log) is it
        counts = {
            k: torch.exp(-(x > torch.quantile(x, 1 - head.top)).double()) for k, x in counts.items()
        }
    covariates = {
        "word": (head.word_share, counts["word"]),
        "pair": (head.pair_share, counts["pair"]),
    }
    return _planted(plan, groups, layers, heads, auroc, head.token_share, covariates, seed)


def _planted(plan, groups, layers, heads, auroc, token_share, covariates, seed):
    """A two-checkpoint trajectory of `layers` x `heads` heads on the pairs of `plan`, each
    head's logit change dz = a[m] + b[l] + sum of frequency terms + effect * distinct(m, l) +
    noise (`groups`' kinds; a token effect of variance `token_share`; `covariates`: name ->
    (share, count [P]), the head following the count's rarity (-log) standardised at that
    share of the variance, its frequency where the share is negative), and the truth
    ``auroc`` and ``bias`` [L, H] of the planted kind effect (`auroc`: one value or [L, H])."""
    g = torch.Generator().manual_seed(seed)
    H = layers * heads
    V = plan.vocab_size
    target = torch.as_tensor(auroc, dtype=torch.float64).expand(layers, heads)
    effect = torch.tensor(
        [effect_for_auroc(float(a)) for a in target.reshape(-1)], dtype=torch.float64
    )
    q, t = plan.pair_query, plan.pair_token
    sizes = torch.tensor([d.numel() for d in groups.distinct])
    keys = torch.repeat_interleave(groups.query, sizes) * V + torch.cat(groups.distinct)
    distinct = torch.isin(q * V + t, keys)

    def standard(x: Tensor) -> Tensor:
        return (x - x.mean()) / x.std().clamp_min(1e-12)

    rest = 1 - token_share - sum(abs(share) for share, _ in covariates.values())
    if rest <= 0:
        raise ValueError("the token's share and the frequency shares must stay below 1 in all")
    N = q.numel()
    a = torch.randn(H, V, generator=g, dtype=torch.float64)[:, q]
    b = torch.randn(H, V, generator=g, dtype=torch.float64)[:, t] * math.sqrt(token_share)
    noise = torch.randn(H, N, generator=g, dtype=torch.float64) * math.sqrt(rest)
    dz = a + b + noise + effect[:, None] * distinct
    for share, count in covariates.values():
        if share:
            rarity = standard(-count.double().clamp_min(1e-12).log())
            dz = dz + math.copysign(math.sqrt(abs(share)), share) * rarity
    z0 = torch.randn(H, N, generator=g, dtype=torch.float64)
    zbar = torch.stack([z0, z0 + dz]).reshape(2, layers, heads, N)
    c_hat = torch.full((2, layers, heads, plan.num_triples), 1.0 / max(1, plan.num_triples))
    traj = Trajectory(
        plan,
        torch.tensor([0, 1000]),
        list(range(layers)),
        list(range(heads)),
        zbar=zbar.float(),
        c_hat=c_hat.float(),
        entropy=torch.zeros(2, layers, heads, plan.num_classes),
        meta={"source": "lab.calibration"},
    )
    return traj, {"auroc": target.clone(), "bias": effect.reshape(layers, heads)}
