"""Fig. 10's attention entropy per head against a brute-force mean over a full cache, and the
ranking of heads."""

from __future__ import annotations

import torch
from test_record import V, tiny_model

from scansnap_lens import measures
from scansnap_lens.measures import heads
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import record_trajectory


def test_attention_entropy_is_the_mean_row_entropy_with_the_query_included(tmp_path):
    """The authors' Fig. 10 metric: every position's full causal row, its own position in."""
    model = tiny_model()
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(6))
    plan = plan_recording(tokens, V, include_self=True, exclude_bos=False)
    traj = record_trajectory(in_memory({0: model}), tokens, tmp_path / "t", plan=plan,
                             progress=False)  # fmt: skip
    got = measures.attention_entropy(traj).values[0]  # [L, H]
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        A = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [B, H, T, T]
        rows = A[:, :, 1:-1]  # positions with a context token before and a next token after
        ent = -torch.special.xlogy(rows, rows).sum(-1)  # [B, H, T-2]
        want = ent.mean((0, 2))
        torch.testing.assert_close(got[layer], want, atol=1e-5, rtol=0)


def test_summary_ranks_heads_and_maps_them(tmp_path):
    from scansnap_lens.statistics.groups import TokenGroups

    model = tiny_model()
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(7))
    plan = plan_recording(tokens, V)
    traj = record_trajectory(in_memory({0: model, 1: tiny_model(seed=1)}), tokens,
                             tmp_path / "t", plan=plan, progress=False)  # fmt: skip
    m = int(plan.class_query[0])
    groups = TokenGroups(
        query=plan.class_query[:1],
        next_token=plan.class_next[:1],
        events=plan.class_events[:1],
        distinct=[torch.tensor([int(plan.pair_token[plan.pair_query == m][0])])],
        distinct_p=[torch.tensor([1.0], dtype=torch.float64)],
        common={m: plan.pair_token[plan.pair_query == m][1:]},
    )
    summary = measures.summarize(traj, groups)
    assert "attention_entropy" in summary and len(summary) == 6
    ranked = heads.rank_heads(summary)
    assert ranked["rank"].tolist() == list(range(1, 7))
    aurocs = ranked["auroc"].dropna().tolist()
    assert aurocs == sorted(aurocs, reverse=True)
    grid = heads.head_grid(summary, "auroc", traj.layers, traj.heads)
    row = summary.iloc[4]
    assert grid[int(row["layer"]), int(row["head"])].item() == row["auroc"] or (
        torch.isnan(grid[int(row["layer"]), int(row["head"])]) and row["auroc"] != row["auroc"]
    )
