"""Several runs compared (`measures.runs`): a planted difference between runs that the interval
over runs shows and the within-run intervals do not, its coverage by simulation, refusals of
runs that do not share a plan, and the CLI over three trained seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from scansnap_lens.lab.calibration import Scenario, crossed_run
from scansnap_lens.measures.runs import RunComparison, check_same_runs, compare_runs, measure_runs

PLANTED = [0.62, 0.76, 0.9]  # head 0's AUROC in each run: the runs differ
SHARED = 0.8  # head 1's AUROC in every run


@pytest.fixture(scope="module")
def three_runs():
    """Three runs of one recipe on one evaluation text (one plan, the same groups): head 0's
    scan differs between them, head 1 scans alike, heads 2-3 do not scan."""
    runs, groups = {}, None
    for r, planted in enumerate(PLANTED):
        auroc = torch.tensor([[planted, SHARED, 0.5, 0.5]])
        traj, groups, _ = crossed_run(Scenario(queries=150), heads=4, auroc=auroc, seed=0,
                                      values_seed=10 + r)  # fmt: skip
        runs[f"seed{r}"] = traj
    return runs, groups


def test_the_interval_over_runs_shows_a_difference_the_within_run_ones_do_not(three_runs):
    runs, groups = three_runs
    comparison = measure_runs(runs, groups)
    per = comparison.per_run.set_index(["run", "head"])
    table = comparison.table.set_index("head")
    # within each run, head 0's interval holds its own truth and excludes the other runs'
    for r, planted in enumerate(PLANTED):
        lo, hi = per.loc[(f"seed{r}", 0), ["auroc_lo", "auroc_hi"]]
        assert lo < planted < hi
        others = [p for i, p in enumerate(PLANTED) if i != r]
        assert not any(lo < p < hi for p in others)
    # over runs, the interval holds the recipe's mean and is far wider than a run's own
    head0 = table.loc[0]
    assert head0["auroc_lo"] < np.mean(PLANTED) < head0["auroc_hi"]
    assert head0["auroc_hi"] - head0["auroc_lo"] > 4 * 2 * head0["auroc_within"]
    # where the runs agree the two are alike
    head1 = table.loc[1]
    assert head1["auroc_lo"] < SHARED < head1["auroc_hi"]
    assert head1["auroc_hi"] - head1["auroc_lo"] < 4 * 2 * head1["auroc_within"]
    # the share of runs scanning counts each run's own verdict
    for head in range(4):
        scans = [bool(per.loc[(f"seed{r}", head), "scans"]) for r in range(3)]
        assert table.loc[head, "scans_runs"] == sum(scans)
        lo, hi = table.loc[head, ["scans_share_lo", "scans_share_hi"]]
        assert lo <= sum(scans) / 3 <= hi
        assert [table.loc[head, f"verdict_seed{r}"] for r in range(3)] == [
            per.loc[(f"seed{r}", head), "verdict"] for r in range(3)
        ]
    assert table.loc[1, "scans_runs"] == 3 and table.loc[2, "scans_runs"] == 0
    # per layer, whichever heads they are: each run's count of scanning heads
    layer = comparison.layers.iloc[0]
    for r in range(3):
        assert layer[f"scanning_heads_seed{r}"] == per.loc[f"seed{r}", "scans"].sum()
    counts = [layer[f"scanning_heads_seed{r}"] for r in range(3)]
    assert layer["scanning_heads_mean"] == pytest.approx(np.mean(counts))
    assert layer["scanning_heads_lo"] >= 0  # a count
    assert comparison.tensor("auroc").shape == (3, 1, 4)


def test_runs_that_differ_in_plan_or_heads_are_refused_by_name(three_runs):
    runs, _ = three_runs
    other, _, _ = crossed_run(Scenario(queries=150), heads=4, seed=1)  # another text
    differ = r"runs 'seed0' and 'other' differ in their vocabulary \(804 and 806\)"
    with pytest.raises(ValueError, match=differ):
        check_same_runs({"seed0": runs["seed0"], "other": other})
    fewer = runs["seed1"].replace(heads=[0, 1, 2])
    with pytest.raises(ValueError, match=r"differ in their heads \(\[0, 1, 2, 3\] and \[0, 1, 2\]"):
        check_same_runs({"seed0": runs["seed0"], "seed1": fewer})


def _coverage(runs: int, draw, trials: int, seed: int) -> float:
    """Share of simulated recipes whose interval over `runs` runs holds the recipe's mean:
    each run's estimate = a run effect (drawn by `draw`) + within-run noise."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        effects = draw(rng, runs)
        estimates = effects + rng.normal(0.0, 0.05, runs)
        summaries = {
            f"r{i}": pd.DataFrame({"layer": [0], "head": [0], "bias": [e]})
            for i, e in enumerate(estimates)
        }
        row = compare_runs(summaries).table.iloc[0]
        hits += row["bias_lo"] <= 1.0 <= row["bias_hi"]
    return hits / trials


@pytest.mark.parametrize("runs", [2, 3, 5])
def test_the_interval_over_runs_covers_the_recipe_mean(runs):
    """Normal run effects around the recipe's mean 1.0: coverage 0.95 within the binomial
    spread of 600 trials (a normal interval in place of Student's t covers 0.82 at 3 runs)."""
    coverage = _coverage(runs, lambda rng, n: rng.normal(1.0, 0.3, n), 600, seed=runs)
    assert abs(coverage - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 600)


def test_one_run_is_too_few():
    table = compare_runs({"a": pd.DataFrame({"layer": [0], "head": [0], "bias": [1.0],
                                             "snap_step": [math.nan]})}).table  # fmt: skip
    assert math.isnan(table["bias_lo"].iloc[0])
    assert table["reason"].iloc[0] == "too few runs for bias (1 has one); no run has a snap_step"


def test_saves_and_loads(three_runs, tmp_path):
    runs, groups = three_runs
    comparison = measure_runs(runs, groups)
    loaded = RunComparison.load(comparison.save(tmp_path / "c"))
    assert loaded.runs == comparison.runs
    pd.testing.assert_frame_equal(loaded.table, comparison.table, check_dtype=False)
    assert "3 runs, 4 heads" in repr(loaded)
