"""Sparsity: entropy over distinct tokens, mass and recall by hand; Fig. 10's attention
entropy against a brute-force mean over a full cache."""

from __future__ import annotations

import math

import pytest
import torch
from _hand import groups, hand_trajectory
from _tiny import QUIET, V, tiny_model

from scansnap_lens import measures
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import record_trajectory


def test_sparsity_entropy_mass_and_recall():
    traj = hand_trajectory(
        [0, 1],
        {(0, 1): [0, 0], (0, 2): [0, 0], (0, 3): [0, 0]},
        {(0, 5): {1: [0.25, 0.4], 2: [0.25, 0.1], 3: [0.5, 0.5]}},
    )
    g = groups({(0, 5): {1: 0.5, 2: 0.5, 4: 0.0}}, {0: [3]})
    table = measures.sparsity(traj, g, thresholds=torch.tensor([0.2])).table
    first, last = table.iloc[0], table.iloc[1]
    # distinct tokens 1, 2 and 4 (4 never seen: attention 0)
    assert first["distinct_mass"] == pytest.approx(0.5)
    assert first["entropy"] == pytest.approx(math.log(2))
    assert first["top_share"] == pytest.approx(0.5)
    assert first["recall@0.2"] == pytest.approx(2 / 3)
    assert last["entropy"] == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))
    assert last["recall@0.2"] == pytest.approx(1 / 3)


def test_sparsity_of_single_distinct_tokens_is_not_measured(tmp_path):
    """One distinct token per class: entropy 0 and top share 1 would say nothing; NaN, with
    the reason in the report, while the mass on distinct tokens is still measured."""
    traj = hand_trajectory(
        [0, 1],
        {(0, 1): [0, 0], (0, 2): [0, 0]},
        {(0, 5): {1: [0.25, 0.4], 2: [0.75, 0.6]}},
    )
    g = groups({(0, 5): {1: 1.0}}, {0: [2]})
    last = measures.sparsity(traj, g).table.iloc[1]
    assert math.isnan(last["entropy"]) and math.isnan(last["top_share"])
    assert last["distinct_mass"] == pytest.approx(0.4)
    assert last["sparsity_classes"] == 0
    from scansnap_lens.reading.analysis import Analysis
    from scansnap_lens.report import write_report

    report = write_report(Analysis.of(traj, g), tmp_path / "r", views=False)
    assert report.not_measured["entropy, top_share"] == measures.SINGLE_DISTINCT


@pytest.mark.tl
def test_attention_entropy_is_the_mean_row_entropy_with_the_query_included(tmp_path):
    """The authors' Fig. 10 metric: every position's full causal row, its own position in."""
    model = tiny_model()
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(6))
    plan = plan_recording(tokens, V, include_self=True, exclude_bos=False)
    traj = record_trajectory(in_memory({0: model}), tokens, tmp_path / "t", QUIET, plan=plan)
    got = measures.attention_entropy(traj).values[0]  # [L, H]
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        A = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [B, H, T, T]
        rows = A[:, :, 1:-1]  # positions with a context token before and a next token after
        ent = -torch.special.xlogy(rows, rows).sum(-1)  # [B, H, T-2]
        want = ent.mean((0, 2))
        torch.testing.assert_close(got[layer], want, atol=1e-5, rtol=0)
