"""Intervals, permutation nulls and the scan verdict (`measures.uncertainty`) against what they
claim: coverage at the stated rate, uniform p-values without an effect, small ones with one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from scansnap_lens.lab.synthetic import syn_medium, syn_small
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.measures import discriminative_bias, frequency_bias
from scansnap_lens.measures.uncertainty import bootstrap_interval, scan_uncertainty
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups


def test_bootstrap_intervals_cover_the_true_mean_at_their_level():
    """95 % intervals of a weighted mean over 40 units drawn around a known mean cover it in
    90-99 % of 200 seeded repeats (the percentile bootstrap is a little narrow at 40)."""
    g = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        values = 1.5 + torch.randn(40, 1, 1, generator=g, dtype=torch.float64) * 2.0
        weights = 1 + 4 * torch.rand(40, generator=g, dtype=torch.float64)
        lo, hi = bootstrap_interval(values, weights, num=1000, generator=g)
        covered += bool(lo.item() <= 1.5 <= hi.item())
    assert 0.90 * 200 <= covered <= 0.99 * 200, covered


def test_one_unit_gives_no_interval():
    lo, hi = bootstrap_interval(torch.ones(1, 2, 3), torch.ones(1))
    assert torch.isnan(lo).all() and torch.isnan(hi).all()


def _random_kinds(groups: TokenGroups, traj: Trajectory, g: torch.Generator) -> TokenGroups:
    """The groups' tokens of each query with their kinds drawn at random (same counts): no
    effect by construction, so the observed bias is a draw from the permutation null."""
    query = int(groups.query[0])
    pool = torch.cat([groups.distinct_of_query(query), groups.common[query]])
    pool = pool[traj.plan.pair_slot(query, pool) >= 0]
    nd = groups.distinct_of_query(query).numel()
    order = pool[torch.randperm(pool.numel(), generator=g)]
    return TokenGroups(
        groups.query[:1], groups.next_token[:1], groups.events[:1], [order[:nd]],
        [torch.ones(nd, dtype=torch.float64)], {query: order[nd:]}, source="synthetic",
    )  # fmt: skip


@pytest.fixture(scope="module")
def lab_run():
    """Two Y/Z runs on Syn-Medium (one query, two next tokens) that scan and snap."""
    classes = syn_medium(1)
    run = train_yz(classes, lr_z=1.0, ratio=10.0, num_steps=60, seeds=[0, 1], snapshot_every=5)
    return run.to_trajectory(), TokenGroups.from_synthetic(classes)


def test_the_null_gives_uniform_p_values_without_an_effect(lab_run):
    traj, groups = lab_run
    g = torch.Generator().manual_seed(1)
    p = np.array([
        scan_uncertainty(traj, _random_kinds(groups, traj, g), num_resamples=99, seed=s)
        .table["bias_p"].to_numpy()
        for s in range(200)
    ]).reshape(-1)  # fmt: skip
    assert 0.01 <= (p <= 0.05).mean() <= 0.10, (p <= 0.05).mean()
    assert abs(p.mean() - 0.5) < 0.06, p.mean()


def test_the_lab_runs_scan_with_small_p_values(lab_run):
    traj, groups = lab_run
    table = scan_uncertainty(traj, groups, num_resamples=999).table
    assert (table["bias_p"] <= 0.002).all() and (table["auroc_p"] <= 0.002).all()
    assert table["scans"].all() and (table["bias"] > table["bias_baseline"]).all()


def test_the_figures_are_those_the_measurements_give(lab_run):
    traj, groups = lab_run
    table = scan_uncertainty(traj, groups, num_resamples=200).table
    bias = discriminative_bias(traj, groups).final()
    np.testing.assert_allclose(table["bias"], bias["bias"], rtol=1e-12)
    np.testing.assert_allclose(table["auroc"], bias["auroc"], rtol=1e-12)
    again = scan_uncertainty(traj, groups, num_resamples=200).table
    pd.testing.assert_frame_equal(table, again)  # seeded


def test_spearman_interval_holds_the_measured_value_and_its_null_is_calibrated():
    """Syn-Small's classes each have several distinct tokens with different P(l|n): the
    measured frequency bias lies in its interval; with P shuffled within each class the
    p-values average one half, as a uniform null does."""
    classes = syn_small()
    run = train_yz(classes, lr_z=1.0, ratio=10.0, num_steps=40, seeds=[0], snapshot_every=10)
    traj, groups = run.to_trajectory(), TokenGroups.from_synthetic(classes)
    table = scan_uncertainty(traj, groups, num_resamples=500).table
    rho = frequency_bias(traj, groups).final()["spearman"].to_numpy()
    assert ((table["spearman_lo"] <= rho) & (rho <= table["spearman_hi"])).all()
    g = torch.Generator().manual_seed(3)
    p_null = []
    for seed in range(100):  # P(l|n) shuffled within each class: no frequency bias left
        shuffled = [p[torch.randperm(p.numel(), generator=g)] for p in groups.distinct_p]
        null_groups = TokenGroups(groups.query, groups.next_token, groups.events,
                                  groups.distinct, shuffled, groups.common)  # fmt: skip
        table = scan_uncertainty(traj, null_groups, num_resamples=99, seed=seed).table
        p_null.append(float(table["spearman_p"].iloc[0]))
    assert abs(np.mean(p_null) - 0.5) < 0.1, np.mean(p_null)


def test_the_demo_head_scans(demo_out):
    """The demo's head scans, at the same verdict on either TransformerLens major (CI runs
    this on both)."""
    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    table = scan_uncertainty(traj, TokenGroups.from_synthetic(syn_medium(1))).table
    assert table["scans"].all() and (table["bias_p"] == 1 / 1001).all()
    assert (table["snap_step_lo"] < table["snap_step_hi"]).all()


def test_spearman_p_is_the_exact_permutation_p_when_the_recording_misses_tokens():
    """A class's distinct tokens the recording does not hold (pairs absent from the evaluation
    text) sit between held ones; the null shuffles P(l|m, n) among the held tokens only, and
    its p-value is the one that enumerating every shuffle gives."""
    import itertools

    from scipy.stats import spearmanr

    from tests._hand import groups as hand_groups
    from tests._hand import hand_trajectory

    steps = [0, 1, 2, 3]
    final = {(0, 4): 1.0, (0, 6): 3.0, (0, 7): 2.0, (0, 8): 0.5, (0, 9): 1.0, (0, 1): -1.0}
    zbar = {pair: [v * t / 3 for t in steps] for pair, v in final.items()}
    c_hat = {
        (0, 1): {4: [0.1] * 4, 6: [0.1] * 4, 7: [0.1] * 4},
        (0, 2): {8: [0.1] * 4, 9: [0.1] * 4},
    }
    traj = hand_trajectory(steps, zbar, c_hat)
    distinct = {(0, 1): {3: 0.1, 4: 0.2, 5: 0.3, 6: 0.4, 7: 0.5},  # 3 and 5 not recorded
                (0, 2): {3: 0.4, 8: 0.1, 9: 0.3}}  # fmt: skip
    groups = hand_groups(distinct, {0: [1]}, events=[1, 2])

    held = [[4, 6, 7], [8, 9]]  # each class's recorded tokens, in token order
    dz = [[final[(0, t)] for t in tokens] for tokens in held]
    p = [[distinct[key][t] for t in tokens] for key, tokens in zip(sorted(distinct), held)]
    weights = np.array([1.0, 2.0])

    def mean_rho(ps):
        return np.dot(weights, [spearmanr(x, y)[0] for x, y in zip(dz, ps)]) / weights.sum()

    observed = mean_rho(p)
    null = [mean_rho(ps) for ps in itertools.product(*map(itertools.permutations, p))]
    exact = np.mean(np.array(null) >= observed - 1e-12)  # 3 of 12 arrangements

    table = scan_uncertainty(traj, groups, num_resamples=4000).table
    assert frequency_bias(traj, groups).final()["spearman"].item() == pytest.approx(observed)
    # Monte Carlo with 4000 shuffles: standard error sqrt(p (1 - p) / 4000) = 0.007
    assert table["spearman_p"].item() == pytest.approx(exact, abs=0.03), (exact, table)


@pytest.mark.parametrize("n, k", [(6, 2), (9, 3), (5, 3)])  # drawn again / permuted
def test_the_shuffles_draw_every_subset_of_kinds_equally_often(n, k):
    """The null's draws of which tokens are distinct are uniform over the k-subsets."""
    import itertools
    import math

    from scansnap_lens.measures.uncertainty import _shuffled_first

    num = 40_000
    rows = _shuffled_first(n, k, num, torch.Generator().manual_seed(0))
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(n), k))}
    counts = np.bincount([subsets[tuple(r)] for r in rows.sort(-1).values.tolist()],
                         minlength=len(subsets))  # fmt: skip
    expected = num / math.comb(n, k)
    # each count is binomial: within 5 standard deviations of its mean
    assert np.abs(counts - expected).max() < 5 * math.sqrt(expected), counts
