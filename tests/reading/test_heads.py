"""Every head ranked by scan, and summary columns as [layer, head] grids."""

from __future__ import annotations

import pytest
import torch
from _tiny import QUIET, V, tiny_model

from scansnap_lens import measures
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.reading import heads
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import record_trajectory


@pytest.mark.tl
def test_summary_ranks_heads_and_maps_them(tmp_path):
    from scansnap_lens.statistics.groups import TokenGroups

    model = tiny_model()
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(7))
    plan = plan_recording(tokens, V)
    traj = record_trajectory(
        in_memory({0: model, 1: tiny_model(seed=1)}), tokens, tmp_path / "t", QUIET, plan=plan
    )
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


def test_the_atlas_gives_every_head_its_verdict_interval_and_snap():
    """Three Y/Z runs on Syn-Medium (6 queries) as three heads of one layer; the second head's
    logit changes are reversed (common tokens gain, distinct ones lose), so it must not scan
    while the others gain on distinct tokens and scan: Syn-Medium's distinct tokens are all
    rarer than its common ones, and the frequency bias among them (the more frequent gain
    more) tells scanning from a preference for rare tokens.  The atlas holds
    every head once, in order, with the summary's
    values; with 3 queries there are too few units for a verdict."""
    from scansnap_lens.lab.synthetic import syn_medium
    from scansnap_lens.lab.yz import train_yz
    from scansnap_lens.statistics.groups import TokenGroups

    def runs(num_queries):
        classes = syn_medium(num_queries)
        run = train_yz(classes, lr_z=1.0, ratio=10.0, num_steps=60, seeds=[0, 1, 2],
                       snapshot_every=5)  # fmt: skip
        traj, groups = run.to_trajectory(), TokenGroups.from_synthetic(classes)
        z = traj.zbar[:, :, 1]
        traj.zbar[:, :, 1] = 2 * z[:1] - z  # dz -> -dz, levels at the first checkpoint kept
        return traj, groups, classes

    traj, groups, classes = runs(6)
    summary = measures.summarize(traj, groups)
    table = heads.atlas(summary)
    assert table[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [0, 2]]
    assert table["scans"].tolist() == [True, False, True]
    assert table["verdict"][1].startswith("no scan")
    assert table["frequency_control"][::2].str.startswith("frequency bias").all()
    assert (table["bias"] < 0).tolist() == [False, True, False]
    assert ((table["bias_lo"] <= table["bias"]) & (table["bias"] <= table["bias_hi"])).all()
    assert (table["bias_hi"][1] < 0) and (table["bias_lo"][::2] > 0).all()
    assert "attention_entropy" not in table  # the lab's runs have no attention over positions
    for column in ["bias", "auroc", "auroc_mde", "spearman", "spearman_p", "snap_step"]:
        assert table[column].equals(summary[column]), column
    assert (table["spearman_classes"] == classes.num_classes).all()
    assert table["snap"].tolist() == [  # the value, and the checkpoints that bracket it
        f"{v:.4g} (checkpoints {a:.4g} to {b:.4g})"
        for v, a, b in summary[["snap_step", "snap_step_grid_lo", "snap_step_grid_hi"]].values
    ]
    assert (summary["snap_step_grid_lo"] <= summary["snap_step"]).all()
    assert (summary["snap_step"] <= summary["snap_step_grid_hi"]).all()

    traj, groups, _ = runs(3)
    verdicts = heads.atlas(measures.summarize(traj, groups))["verdict"]
    assert verdicts.str.startswith("too few units (n_eff = 3 < 5)").all()


@pytest.mark.tl
def test_a_measure_with_a_bug_raises_and_one_that_cannot_be_made_says_why(tmp_path, monkeypatch):
    """A defect in a measure (a TypeError deep inside it) used to become a line under "Not
    measured"; only a ValueError, the measures' own "cannot be made", is a reason."""
    from scansnap_lens.measures import summary
    from scansnap_lens.measures.catalog import Measure

    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(7))
    traj = record_trajectory(
        in_memory({0: tiny_model(), 1: tiny_model(seed=1)}), tokens, tmp_path / "t", QUIET
    )

    def cannot(x):
        raise ValueError("needs what this run lacks")

    def defect(x):
        return None + 1

    only = (Measure("a", cannot, needs_groups=False),)
    monkeypatch.setattr(summary, "measures_of", lambda traj: only)
    assert summary.measure_all(traj) == ({}, {"a": "needs what this run lacks"})
    bug = (Measure("b", defect, needs_groups=False),)
    monkeypatch.setattr(summary, "measures_of", lambda traj: bug)
    with pytest.raises(TypeError):
        summary.measure_all(traj)
