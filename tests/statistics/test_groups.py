"""Token groups from statistics equal a per-class, per-query reference loop (the definition
written plainly), in one pass over the kinds and triples."""

from __future__ import annotations

import pytest
import torch

from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import Classification, TokenGroups
from scansnap_lens.statistics.kinds import COMMON, DISTINCT, token_kinds


def reference_groups(kinds, stats, queries, min_events):
    """The definition, one class and one query at a time."""
    local = kinds.scope == "local"
    frame = stats.classes()
    frame = frame[frame["events"] >= min_events]
    if queries is not None:
        frame = frame[frame["query"].isin(queries)]
    distinct, distinct_p = [], []
    for m, n in zip(frame["query"].tolist(), frame["next"].tolist()):
        keep = (kinds.kind == DISTINCT) & (kinds.next_token == n)
        if local:
            keep &= kinds.query == m
        tokens, (ctx, counts) = kinds.token[keep], stats.context_counts(m, n)
        p = {int(l): int(c) / int(counts.sum()) for l, c in zip(ctx, counts)}
        tokens = [int(t) for t in tokens if int(t) in p]
        distinct.append(tokens)
        distinct_p.append([p[t] for t in tokens])
    common = {}
    for m in frame["query"].unique().tolist():
        keep = kinds.kind == COMMON
        if local:
            keep &= kinds.query == m
        common[m] = kinds.token[keep].tolist()
    return frame, distinct, distinct_p, common


@pytest.mark.parametrize("scope", ["local", "global"])
@pytest.mark.parametrize("seed", range(4))
def test_groups_equal_the_reference_loop(seed, scope):
    gen = torch.Generator().manual_seed(seed)
    V = 40
    rows = torch.randint(0, V, (30, 25), generator=gen)
    rows = torch.where(torch.rand(rows.shape, generator=gen) < 0.7, rows % 6, rows)
    stats = cooccurrence(rows, V, window=6)
    kinds = token_kinds(stats, scope=scope, guard=False, purity=0.5 if scope == "local" else 0.2)
    queries = None if seed % 2 else [0, 1, 2, 3, 39]
    groups = TokenGroups.from_kinds(kinds, stats, queries, min_events=2, min_distinct=0)
    frame, distinct, distinct_p, common = reference_groups(kinds, stats, queries, 2)
    assert groups.query.tolist() == frame["query"].tolist()
    assert groups.next_token.tolist() == frame["next"].tolist()
    assert [d.tolist() for d in groups.distinct] == distinct
    assert [p.tolist() for p in groups.distinct_p] == distinct_p  # the same division
    assert all(p.dtype == torch.float64 for p in groups.distinct_p)
    assert sum(map(len, distinct)) >= 3  # the case has distinct tokens to place
    if scope == "local":
        assert {m: c.tolist() for m, c in groups.common.items()} == common
    for m in set(groups.query.tolist()):
        union = sorted({t for d, q in zip(distinct, groups.query.tolist()) if q == m for t in d})
        assert groups.distinct_of_query(m).tolist() == union
    # C(m, l) = sum over n of C(m, n, l), class by class, for tracked queries
    for m in sorted(groups.common)[:3]:
        brute = torch.zeros(V)
        for n in stats.next_token[stats.query == m].tolist():
            ctx, counts = stats.context_counts(m, n)
            brute.index_add_(0, ctx, counts.double().float())
        got = groups.pair_count_of(torch.full((V,), m), torch.arange(V))
        assert got.tolist() == brute.double().tolist()


@pytest.mark.parametrize("scope", ["local", "global"])
@pytest.mark.parametrize("limit", [1])
def test_tokens_distinct_for_many_queries_leave_every_class_and_query(scope, limit):
    """`max_shared`, written plainly: count the queries each token is distinct for (each
    (query, token) once), leave out those above `limit` times the median count, as distinct
    and as common; a class left without distinct tokens goes."""
    gen = torch.Generator().manual_seed(3)
    V = 40
    rows = torch.randint(0, V, (40, 25), generator=gen)
    rows = torch.where(torch.rand(rows.shape, generator=gen) < 0.7, rows % 6, rows)
    stats = cooccurrence(rows, V, window=6)
    kinds = token_kinds(stats, scope=scope, guard=False, purity=0.5 if scope == "local" else 0.2)
    whole = TokenGroups.from_kinds(kinds, stats, min_distinct=1)
    served: dict[int, set] = {}
    for m, tokens in zip(whole.query.tolist(), whole.distinct):
        for t in tokens.tolist():
            served.setdefault(t, set()).add(m)
    counts = torch.tensor([len(v) for v in served.values()])
    shared = sorted(t for t, v in served.items() if len(v) > limit * counts.median().item())
    assert shared  # the case has tokens to leave out
    groups = TokenGroups.from_kinds(kinds, stats, min_distinct=1, max_shared=limit)
    assert groups.shared.tolist() == shared
    kept = [
        (m, n, [t for t in d.tolist() if t not in shared])
        for m, n, d in zip(whole.query.tolist(), whole.next_token.tolist(), whole.distinct)
    ]
    kept = [k for k in kept if k[2]]
    assert [
        (m, n, d.tolist())
        for m, n, d in zip(groups.query.tolist(), groups.next_token.tolist(), groups.distinct)
    ] == kept
    for m, tokens in whole.common.items():
        assert groups.common[m].tolist() == [t for t in tokens.tolist() if t not in shared]
    # decided by the corpus, not by the queries a recording tracks: its report's groups agree
    some = sorted(set(whole.query.tolist()))[:3]
    tracked = TokenGroups.from_kinds(kinds, stats, some, min_distinct=1, max_shared=limit)
    assert tracked.shared.tolist() == shared
    assert set(tracked.query.tolist()) <= set(some)


def test_one_classification_with_its_defaults_refusing_bad_settings():
    """The settings are one typed value: the report's defaults are the library's, a keyword
    replaces a field, and bad or unknown ones are refused naming the option."""
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import Classification

    rows = torch.tensor([[5, 0, 1, 2], [6, 0, 1, 3], [5, 6, 1, 2], [5, 4, 1, 2]])
    stats = cooccurrence(rows, vocab_size=7)
    groups = TokenGroups.from_statistics(stats, guard=False)
    assert groups.settings == Classification(guard=False)
    assert Classification.from_dict(groups.settings.to_dict()) == groups.settings
    for bad, match in [({"purity": 0.0}, "purity="), ({"scope": "both"}, "scope="),
                       ({"min_support": 0}, "min_support"), ({"min_distinct": -1}, "min_distinct="),
                       ({"max_shared": -1}, "max_shared="), ({"max_shared": True}, "max_shared="),
                       ({"pureness": 1.0}, "unknown Classification field 'pureness'")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            Classification().replace(**bad)
    with pytest.raises(TypeError, match="needs CooccurrenceStats"):
        TokenGroups.from_statistics(None)
    assert len(repr(groups)) < 200 and "classes" in repr(groups)


def test_groups_save_and_load_every_field(tmp_path):
    """`TokenGroups.save` / `load` (what a saved analysis reloads instead of classifying the
    statistics again): every field back, ragged lists and the classification included."""
    from dataclasses import fields

    from scansnap_lens.statistics.groups import Classification

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 40, (30, 25), generator=gen)
    rows = torch.where(torch.rand(rows.shape, generator=gen) < 0.7, rows % 6, rows)
    stats = cooccurrence(rows, 40, window=6)
    groups = TokenGroups.from_statistics(stats, settings=Classification(purity=0.5, guard=False))
    assert groups.num_classes and groups.settings.purity == 0.5
    back = TokenGroups.load(groups.save(tmp_path / "groups.safetensors"))
    for field in fields(TokenGroups):
        mine, theirs = getattr(groups, field.name), getattr(back, field.name)
        if isinstance(mine, dict):
            assert mine.keys() == theirs.keys()
            mine, theirs = list(mine.values()), list(theirs.values())
        if isinstance(mine, list):
            assert len(mine) == len(theirs)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(mine, theirs))
        elif isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs), field.name
        else:
            assert mine == theirs, field.name
    (tmp_path / "bad.safetensors").write_bytes(b"nope")
    with pytest.raises(ValueError, match="token groups file"):
        TokenGroups.load(tmp_path / "bad.safetensors")


def test_the_groups_of_one_statistics_value_and_settings_are_made_once():
    """The recorder's plan and the command line's power ask for the same groups: made once
    per statistics value and settings, anew for other settings, queries, or statistics."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 40, (30, 25), generator=gen)
    rows = torch.where(torch.rand(rows.shape, generator=gen) < 0.7, rows % 6, rows)
    stats = cooccurrence(rows, 40, window=6)
    kw = dict(scope="local", guard=False, purity=0.5, min_distinct=0, min_events=2)
    first = TokenGroups.from_statistics(stats, **kw)
    assert TokenGroups.from_statistics(stats, **kw) is first
    other = TokenGroups.from_statistics(stats, **{**kw, "purity": 0.6})
    assert other is not first and other.settings.purity == 0.6
    assert TokenGroups.from_statistics(stats, [0, 1], **kw) is not first
    canonical = stats.canonical()  # another value: its own groups, equal to the first's
    again = TokenGroups.from_statistics(canonical, **kw)
    assert again is not first and again.query.tolist() == first.query.tolist()
    assert [d.sort().values.tolist() for d in again.distinct] == [
        d.sort().values.tolist() for d in first.distinct
    ]


def test_groups_made_in_the_background_are_waited_for_and_made_once(monkeypatch):
    """`TokenGroups.ahead` classifies in a thread (the recorder, while its first model
    loads): a call meanwhile waits for those groups instead of making its own, and an error
    there is raised by the caller's call, in its thread."""
    import threading

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 40, (30, 25), generator=gen)
    rows = torch.where(torch.rand(rows.shape, generator=gen) < 0.7, rows % 6, rows)
    stats = cooccurrence(rows, 40, window=6)
    settings = Classification(scope="local", guard=False, purity=0.5, min_distinct=0,
                              min_events=2)  # fmt: skip
    made, go = [], threading.Event()
    original = TokenGroups._classified.__func__

    def slow(cls, *args):
        made.append(threading.current_thread().name)
        go.wait(10)  # the caller's call below comes while this one is under way
        return original(cls, *args)

    monkeypatch.setattr(TokenGroups, "_classified", classmethod(slow))
    thread = TokenGroups.ahead(stats, settings)
    while not made:  # the background call holds the statistics' lock
        thread.join(0.01)
    threading.Timer(0.2, go.set).start()
    groups = TokenGroups.from_statistics(stats, settings=settings)
    assert made == ["scansnap-groups"] and groups is stats._groups[settings]
    thread.join()
    empty = cooccurrence(torch.zeros((3, 10), dtype=torch.long), 40, window=6)
    TokenGroups.ahead(empty).join()  # nothing distinct: its thread ends quietly
    with pytest.raises(ValueError):
        TokenGroups.from_statistics(empty)


def test_a_classification_says_its_cost_before_it_starts_where_it_may_pass_ten_seconds(
    capsys, monkeypatch
):
    """Seconds a triple of the statistics times their count: said above 10 s, not below."""
    from scansnap_lens.statistics import groups as module

    rows = torch.tensor([[5, 0, 1, 2], [6, 0, 1, 3], [5, 6, 1, 2], [5, 4, 1, 2]])
    stats = cooccurrence(rows, vocab_size=7)
    TokenGroups.from_statistics(stats, guard=False)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(module, "CLASSIFY_SECONDS_PER_TRIPLE", 20.0 / stats.num_triples)
    TokenGroups.from_statistics(stats, guard=False, purity=0.9)  # another: made anew
    said = f"classifying the context tokens of {stats.num_triples:,} co-occurrences: about 20 s"
    assert capsys.readouterr().out.strip() == said
