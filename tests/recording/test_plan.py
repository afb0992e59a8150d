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


def test_a_budget_keeps_the_longest_prefix_of_queries_that_fits():
    """The slots `budget_queries` counts per query are exactly those of the plan it gives:
    every prefix of the frequency order, planned on its own, holds the counted values."""
    from scansnap_lens.recording.plan import budget_queries
    from scansnap_lens.statistics.corpus import cooccurrence

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 30, (12, 40), generator=gen) % torch.randint(3, 30, (12, 40))
    stats = cooccurrence(rows, 30)
    order, _ = stats.query_counts()
    sizes = [plan_recording(rows, 30, queries=order[: k + 1]).num_slots for k in range(8)]
    for k, size in enumerate(sizes):
        chosen = budget_queries(stats, max_slots=size)
        assert chosen.tolist() == sorted(order[: k + 1].tolist())
        assert budget_queries(stats, max_slots=size - 1).numel() == max(k, 1)
        plan = plan_recording(rows, 30, max_slots=size)
        assert plan.num_slots == size and plan.checkpoint_bytes(2, 3) == 4 * 6 * size
    with_self = plan_recording(rows, 30, max_slots=sizes[3], include_self=True)
    assert with_self.num_slots <= sizes[3]  # the query's own position: counted as at most
    rare_first = torch.cat([torch.tensor([99]), order.flip(0)])  # 99 is never a query
    chosen = budget_queries(stats, max_slots=sizes[0], priority=rare_first)
    assert 1 < chosen.numel() < order.numel()
    assert set(chosen.tolist()) == set(rare_first[1 : chosen.numel() + 1].tolist())
