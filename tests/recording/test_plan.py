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
