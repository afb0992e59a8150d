"""What a recording tracks: queries chosen by coverage, and the one constructor of plans."""

from __future__ import annotations

import torch

from scansnap_lens.recording.plan import RecordPlan, plan_recording


def test_coverage_selects_frequent_queries():
    tokens = torch.tensor([[0, 1, 1, 1, 1, 2, 1, 3, 1, 4]])
    plan = plan_recording(tokens, 5, queries=0.5)
    assert plan.queries.tolist() == [1]


def test_from_counts_sorts_sums_and_keeps_only_the_asked_classes():
    """Classes (m, n) given out of order, two of them sharing a context token of query 2:
    zbar pairs and query events count every class; c_hat keeps only the kept classes."""
    plan = RecordPlan.from_counts(
        vocab_size=10,
        class_query=torch.tensor([2, 1, 2]),
        class_next=torch.tensor([7, 5, 6]),
        class_events=torch.tensor([3, 4, 5]),
        triple_class=torch.tensor([0, 0, 1, 2, 2]),
        triple_token=torch.tensor([4, 3, 3, 4, 9]),
        triple_count=torch.tensor([1, 2, 6, 7, 8]),
        keep=torch.tensor([True, False, True]),
    )
    assert plan.queries.tolist() == [1, 2] and plan.query_events.tolist() == [4, 8]
    pairs = list(zip(plan.pair_query.tolist(), plan.pair_token.tolist(), plan.pair_count.tolist()))
    assert pairs == [(1, 3, 6), (2, 3, 2), (2, 4, 8), (2, 9, 8)]
    assert plan.class_keys.tolist() == [26, 27]  # (2, 6), (2, 7); (1, 5) not kept
    triples = list(zip(plan.triple_class.tolist(), plan.triple_token.tolist(),
                       plan.triple_count.tolist()))  # fmt: skip
    assert triples == [(0, 4, 7), (0, 9, 8), (1, 3, 2), (1, 4, 1)]
    assert plan.problems() == []


def test_a_budget_takes_the_queries_in_order_while_they_fit():
    """The slots `budget_queries` counts per query are exactly those of the plan it gives
    (each query planned alone holds its own slots; a plan's slots add over its queries), and
    it takes the queries in order of preference, passing over one too large for what is left."""
    from scansnap_lens.recording.plan import budget_queries
    from scansnap_lens.statistics.corpus import cooccurrence

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 30, (12, 40), generator=gen) % torch.randint(3, 30, (12, 40))
    stats = cooccurrence(rows, 30)
    order, _ = stats.query_counts()
    size = {int(q): plan_recording(rows, 30, queries=[int(q)]).num_slots for q in order}
    for budget in (1, size[int(order[0])], size[int(order[0])] - 1, 2 * size[int(order[1])],
                   sum(size.values()) // 2, sum(size.values())):  # fmt: skip
        want, left = [], budget
        for q in order.tolist():  # the reference: a plain loop
            if size[q] <= left:
                want.append(q)
                left -= size[q]
        want = want or [int(order[0])]
        chosen = budget_queries(stats, max_slots=budget)
        assert chosen.tolist() == sorted(want), budget
        plan = plan_recording(rows, 30, max_slots=budget)
        assert plan.num_slots == sum(size[q] for q in want)
    half = sum(size.values()) // 2  # the query's own position is counted as at most one slot
    assert plan_recording(rows, 30, max_slots=half, include_self=True).num_slots <= half
    rare_first = torch.cat([torch.tensor([99]), order.flip(0)])  # 99 is never a query
    chosen = budget_queries(stats, max_slots=size[int(order[0])], priority=rare_first)
    assert 1 < chosen.numel() < order.numel()
    assert int(order[-1]) in chosen.tolist()  # priority, not frequency


def test_a_plan_made_for_power_keeps_distinct_tokens_and_samples_common_ones():
    """Real-text-like evaluation rows: every query whose distinct and common tokens (by the
    groups) both occur is tracked, with all its distinct tokens and a uniform sample of at
    most `common_per_query` common ones; the sample is the same whatever else the plan holds,
    it is saved with the plan, and the budget holds."""
    from scansnap_lens.recording.plan import RecordPlan, _hash_uniform
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import TokenGroups

    g = torch.Generator().manual_seed(0)
    V = 60
    tokens = torch.randint(0, V, (40, 30), generator=g)
    stats = cooccurrence(tokens, V, window=8)
    groups = TokenGroups.from_statistics(stats, guard=False, purity=0.6)
    plan = plan_recording(tokens, V, window=8, groups=groups, max_slots=10**7,
                          common_per_query=5)  # fmt: skip
    assert plan.common_per_query == 5
    held = set(zip(plan.pair_query.tolist(), plan.pair_token.tolist()))
    everything = plan_recording(tokens, V, window=8)
    all_pairs = set(zip(everything.pair_query.tolist(), everything.pair_token.tolist()))
    measured = 0
    for m in plan.queries.tolist():
        distinct = set(groups.distinct_of_query(m).tolist())
        common = set(groups.common.get(m, torch.empty(0)).tolist())
        mine = {l for q, l in held if q == m}
        seen = {l for q, l in all_pairs if q == m}
        if distinct & seen and common & seen:
            measured += 1
            assert distinct & seen <= mine  # every distinct token the text holds
            assert len(mine & common) == min(5, len(common & seen))
    assert measured >= 10
    budget = plan.for_queries(plan.queries[:4])[0].num_slots
    small = plan_recording(tokens, V, window=8, groups=groups, max_slots=budget,
                           common_per_query=5)  # fmt: skip
    assert small.num_slots <= budget and small.num_queries >= 4
    # the sample of a pair does not depend on the other pairs
    keys = torch.tensor([3, 99, 12345])
    assert torch.equal(_hash_uniform(keys, 7)[1:], _hash_uniform(keys[1:], 7))
    again = RecordPlan.from_parts(plan.metadata(), plan.tensors())
    assert again.same_as(plan) and again.common_per_query == 5
