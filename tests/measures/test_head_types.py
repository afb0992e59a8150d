"""Head types over training (`measures.head_types`): scores with intervals over rows, the
rise and the formation step, checked against synthetic runs whose truth is known
(`lab.calibration.head_type_run`) and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scansnap_lens.lab.calibration import HEAD_TYPE_SCENARIOS, head_type_run, head_type_truth
from scansnap_lens.measures.head_types import MIN_RISE, formation_step, head_type


def test_formation_step_is_the_half_rise_crossing_on_the_log_axis():
    steps = torch.tensor([0, 10, 100, 1000])
    score = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.2, 0.2, 0.2, 0.1], [0.0, 0.5, 1.0, 1.0]])
    got = formation_step(steps, score)
    # half of 1.0 is reached halfway between log(11) and log(101)
    assert got[0].item() == pytest.approx(math.exp((math.log(11) + math.log(101)) / 2) - 1)
    assert math.isnan(got[1].item())  # never rises
    assert got[2].item() == pytest.approx(10.0)  # reached exactly at a checkpoint


def test_a_rising_head_forms_where_its_truth_says_and_a_flat_one_does_not():
    rise = (0.4, 0.0, 0.2)
    traj = head_type_run(rows=64, heads=3, rise=rise, formed=60.0, steps=13, seed=3)
    t = head_type(traj, "induction").final()
    truth = head_type_truth(rise, formed=60.0, steps=13)
    true_step = formation_step(traj.steps, truth.T)
    assert t["induction_reason"].tolist() == ["", "no rise", ""]
    for h in (0, 2):
        assert t["induction_step_lo"][h] <= true_step[h] <= t["induction_step_hi"][h]
        assert abs(t["induction_step"][h] - 60.0) < 5
        assert t["induction_lo"][h] <= truth[-1, h] <= t["induction_hi"][h]
    assert t["induction_rise_p"][1] > 0.05 and math.isnan(t["induction_step"][1])


def test_a_small_rise_is_real_but_does_not_make_a_head_of_the_type():
    """A significant rise of 0.04 (the Pythia-like run's induction scores move by 0.005) is
    reported with its interval, and no formation step: under `MIN_RISE` of the attention."""
    traj = head_type_run(rows=256, heads=2, rise=(0.04, 0.3), seed=1)
    t = head_type(traj, "induction").final()
    assert t["induction_rise_p"][0] < 1e-6 and math.isnan(t["induction_step"][0])
    assert t["induction_reason"][0].startswith("rise 0.0")
    assert t["induction_reason"][0].endswith(f"below {MIN_RISE:g}")
    assert t["induction_reason"][1] == "" and abs(t["induction_step"][1] - 40) < 5


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_rows_all_alike_get_the_rule_of_three_not_a_point(value):
    """Every row at exactly 1 (a saturated head) or 0 (never there): no spread to estimate
    from, so the interval reaches -log(0.05) / N towards the other end, not [v, v]."""
    traj = head_type_run(rows=20, heads=1, rise=(0.0,), seed=0)
    traj = traj.replace(induction=torch.full_like(traj.induction, value))
    t = head_type(traj, "induction").final()
    share = -math.log(0.05) / 20
    lo, hi = (value * (1 - share), value + (1 - value) * share)
    assert (t["induction_lo"][0], t["induction_hi"][0]) == pytest.approx((lo, hi))
    assert t["induction_reason"][0] == "no rise"


def test_too_few_rows_give_no_interval_and_say_so():
    traj = head_type_run(rows=4, heads=2, rise=(0.5, 0.0), seed=0)
    t = head_type(traj, "induction").final()
    assert t["induction_lo"].isna().all() and t["induction_step"].isna().all()
    assert all(r.startswith("too few units (n_eff = 4") for r in t["induction_reason"])
    one = head_type(traj.select(steps=[0]), "induction").final()
    assert one["induction_reason"].tolist() == ["one checkpoint"] * 2


@pytest.mark.parametrize("scenario", list(HEAD_TYPE_SCENARIOS))
def test_the_intervals_cover_and_flat_heads_are_not_called_formed(scenario):
    """A small version of bench_calibration.py's head types: 16 rows of skewed row effects,
    40 runs of 8 heads (half rise by 0.3, half never)."""
    settings = HEAD_TYPE_SCENARIOS[scenario]
    rise = (0.3,) * 4 + (0.0,) * 4
    truth = head_type_truth(rise, **settings)
    true_step = formation_step(torch.arange(11) * 10, truth.T).numpy()
    score, rises, steps, false = [], [], [], []
    for seed in range(40):
        t = head_type(head_type_run(16, 8, rise, seed=seed, **settings), "induction").final()
        lo, hi = t["induction_lo"].to_numpy(), t["induction_hi"].to_numpy()
        given = ~np.isnan(lo)
        score += list(((lo <= truth[-1].numpy()) & (truth[-1].numpy() <= hi))[given])
        d = (truth[-1] - truth[0]).numpy()
        rises += list((t["induction_rise_lo"] <= d) & (d <= t["induction_rise_hi"]))
        formed = (t["induction_reason"] == "").to_numpy()
        false.append(formed[4:].any())
        ok = formed[:4]
        s_lo, s_hi = t["induction_step_lo"].to_numpy()[:4], t["induction_step_hi"].to_numpy()[:4]
        steps += list(((s_lo <= true_step[:4]) & (true_step[:4] <= s_hi))[ok])
    # 40 runs: a true 0.95 lies within these bounds but for 1 in 1000 draws or so
    assert 0.88 <= np.mean(score) <= 1.0 and 0.88 <= np.mean(rises) <= 1.0
    assert 0.85 <= np.mean(steps) and len(steps) >= 60
    assert np.mean(false) <= 0.12  # family-wise (Holm over the heads) at 0.05
