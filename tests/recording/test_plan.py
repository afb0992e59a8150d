"""What a recording tracks: queries chosen by coverage."""

from __future__ import annotations

import torch

from scansnap_lens.recording.plan import plan_recording


def test_coverage_selects_frequent_queries():
    tokens = torch.tensor([[0, 1, 1, 1, 1, 2, 1, 3, 1, 4]])
    plan = plan_recording(tokens, 5, queries=0.5)
    assert plan.queries.tolist() == [1]
