"""The snapping time as a property of the dynamics: the same at horizons of 3, 30 and 300
times the theory's t0, on regular and log-spaced checkpoints, within a stated factor of t0;
"not yet snapped" and "no scan" where there is no snap to give; effective rates."""

from __future__ import annotations

import math

import pytest
import torch
from _hand import hand_trajectory

from scansnap_lens import measures
from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.models.steps import select_steps

SETTINGS = {  # population Y/Z runs (T -> infinity), eta_Y = 10 eta_Z (Assumption 1)
    "sgd": dict(lr_z=0.1, ratio=10, optimizer="sgd", momentum=0.0, init="zero"),
    "sgd-uniform-init": dict(lr_z=0.1, ratio=10, optimizer="sgd", momentum=0.0, init="uniform"),
    "momentum": dict(lr_z=0.02, ratio=10, optimizer="sgd", momentum=0.9, init="zero"),
}


def snap_of(classes, steps, every=1, **setting):
    run = train_yz(classes, num_steps=steps, population=True, snapshot_every=every, **setting)
    return run.to_trajectory()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_snap_step_does_not_depend_on_the_horizon(name):
    setting = SETTINGS[name]
    classes = syn_medium(1)
    traj = snap_of(classes, 10, **setting)
    t0 = measures.predicted_snap(traj)[0]  # at the effective rates
    snaps = {}
    for horizon in (3, 30, 300):
        steps = int(horizon * t0) + 1
        traj = snap_of(classes, steps, every=max(1, round(steps / 2000)), **setting)
        row = measures.snapping(traj).table.iloc[0]
        snaps[horizon] = row["snap_step"]
        if math.isnan(row["snap_step"]):
            assert row["snap_reason"] == measures.NOT_YET_SNAPPED
            assert horizon == 3  # only a run that ends first may not have snapped
        log_steps = select_steps(traj.steps.tolist(), "log:30")
        on_log_grid = measures.snapping(traj.select(steps=log_steps)).table.iloc[0]["snap_step"]
        if not math.isnan(on_log_grid):
            assert on_log_grid == pytest.approx(row["snap_step"], rel=0.05)
    defined = [s for s in snaps.values() if not math.isnan(s)]
    assert len(defined) >= 2
    assert max(defined) / min(defined) < 1.10  # the bound; measured: under 1.03
    # the stated factor: 1.5 to 5 times t0 (the rate falls to half its peak after t0)
    assert 1.5 * t0 <= defined[-1] <= 5 * t0, (defined, t0)


def test_adam_snaps_the_same_at_every_horizon_and_has_no_prediction():
    classes = syn_medium(1)
    setting = dict(lr_z=0.01, ratio=10, optimizer="adam", init="zero")
    assert measures.predicted_snap(snap_of(classes, 10, **setting)) == [
        pytest.approx(math.nan, nan_ok=True)
    ]
    snaps = [
        measures.snapping(snap_of(classes, h, every=max(1, h // 2000), **setting)).table.iloc[0]
        for h in (80, 800)
    ]
    assert snaps[0]["snap_step"] == pytest.approx(snaps[1]["snap_step"], rel=0.05)


def test_a_frozen_map_has_no_scan_and_a_short_run_has_not_snapped():
    classes = syn_medium(1)
    frozen = snap_of(classes, 50, lr_z=0.1, ratio=10, momentum=0.0)
    frozen.c_hat[:] = frozen.c_hat[:1].clone()  # an attention map that never moves
    row = measures.snapping(frozen).table.iloc[0]
    assert math.isnan(row["snap_step"]) and row["snap_reason"] == measures.NO_SCAN
    short = snap_of(classes, 20, lr_z=0.1, ratio=10, momentum=0.0)  # ends near t0
    row = measures.snapping(short).table.iloc[0]
    assert math.isnan(row["snap_step"]) and row["snap_reason"] == measures.NOT_YET_SNAPPED


def test_snap_steps_frozen_settling_and_never_settling():
    steps = torch.tensor([0, 1, 3, 7, 15, 31])
    frozen = torch.zeros(5)
    path, rate = measures.secondary_snap_steps(steps, frozen)
    assert math.isnan(path) and math.isnan(rate)
    # equal movement per unit of log-step: the rate never falls, so it never settles
    steady = torch.full((5,), 0.1)
    path, rate = measures.secondary_snap_steps(steps, steady)
    assert path.item() == 31.0 and math.isnan(rate)
    settling = torch.tensor([0.4, 0.4, 0.1, 0.01, 0.0])
    path, rate = measures.secondary_snap_steps(steps, settling, fraction=0.9)
    assert path.item() == 7.0  # cumulative share 0.44, 0.88, 0.99 -> third interval ends at 7
    assert rate.item() == 7.0  # 0.01 and 0 are below a tenth of the peak rate 0.4 / ln 2

    traj = hand_trajectory(
        [0, 1, 3, 7],
        {(0, 1): [0, 0, 0, 0], (0, 2): [0, 0, 0, 0]},
        {
            (0, 5): {1: [0.5, 0.7, 0.8, 0.8], 2: [0.5, 0.3, 0.2, 0.2]},
            (0, 6): {1: [0.5] * 4, 2: [0.5] * 4},
        },
    )
    result = measures.snapping(traj)
    detail = result.detail.set_index("next")
    assert detail.loc[5, "snap_path"] == 3.0 and detail.loc[5, "snap_rate"] == 3.0
    assert math.isnan(detail.loc[6, "snap_path"])  # frozen class
    assert result.table["snap_path"].item() == 3.0  # the frozen class adds no movement


def _snap_step_reference(steps, rate_row, mid, x, fraction):
    """`snap_step` for one row, written as a loop (the definition)."""
    p = int(torch.argmax(rate_row))
    if not bool(rate_row[p] > 0):
        return math.nan, measures.NO_SCAN
    level = float(rate_row[p]) * fraction
    for i in range(p + 1, rate_row.numel()):
        if float(rate_row[i]) <= level:
            share = (float(rate_row[i - 1]) - level) / (float(rate_row[i - 1]) - float(rate_row[i]))
            return float(torch.expm1(x[i - 1] + share * (x[i] - x[i - 1]))), ""
    return math.nan, measures.NOT_YET_SNAPPED


def test_snap_step_of_many_rows_at_once_equals_the_loop():
    gen = torch.Generator().manual_seed(3)
    steps = torch.tensor([0, 1, 2, 4, 8, 16, 32, 64, 100, 200])
    moves = torch.rand(300, 9, generator=gen) * torch.rand(300, 1, generator=gen)
    moves[:5] = 0  # no scan
    moves[5:40] = torch.sort(moves[5:40]).values * torch.diff(steps)  # rising: not yet snapped
    snap, _, why = measures.snap_step(steps, moves, 0.5)
    t = steps.double()
    lo, hi = torch.log1p(t[:-1]), torch.log1p(t[1:])
    mid = (torch.expm1(hi) - torch.expm1(lo)) / (hi - lo) - 1
    rate = moves.double() / torch.diff(t)
    for k in range(moves.shape[0]):
        want, reason = _snap_step_reference(steps, rate[k], mid, torch.log1p(mid), 0.5)
        assert why[k] == reason
        assert math.isnan(want) == math.isnan(float(snap[k]))
        if not math.isnan(want):
            assert float(snap[k]) == pytest.approx(want, rel=1e-12)
    assert {"", measures.NO_SCAN, measures.NOT_YET_SNAPPED} == set(why)


def test_class_movement_is_the_total_variation_of_each_class():
    steps = [0, 10, 20]
    traj = hand_trajectory(
        steps,
        zbar={(1, 2): [0, 0, 0]},
        c_hat={(1, 3): {2: [0.2, 0.5, 0.5], 4: [0.8, 0.5, 0.4]}, (1, 5): {2: [1.0, 0.0, 0.0]}},
    )
    move = measures.class_movement(traj)  # [S - 1, L, H, K]
    expected = [0.3, 0.5, 0.05, 0.0]  # c_hat is float32
    assert move[:, 0, 0].reshape(-1).tolist() == pytest.approx(expected, abs=1e-7)


def test_step_intervals_hold_what_the_checkpoints_allow():
    """A population Y/Z run kept at every step, seen at Pythia's schedule (0, 1, 2, ..., 512,
    then every 250) as a hub model is: the snap step's interval held the truth with zero
    width before ([345.8, 345.8] against 309.6); now it spans the checkpoints around the
    crossing, holds the truth and its own value.  A planted head type seen every 20 steps
    likewise: its formation step's interval reaches the checkpoints that bracket it."""
    from scansnap_lens.lab.calibration import head_type_run
    from scansnap_lens.lab.synthetic import sequence_classes
    from scansnap_lens.lab.yz import train_yz
    from scansnap_lens.measures.head_types import formation_step, head_type
    from scansnap_lens.measures.snap import snap_step_interval, snapping

    classes = sequence_classes(num_queries=3, next_per_query=2)
    run = train_yz(classes, lr_z=[2.0, 6.0], lr_y=[0.2, 0.6], seeds=[0, 1], momentum=0.0,
                   num_steps=1000, snapshot_every=1, population=True)  # fmt: skip
    dense = run.to_trajectory()
    truth = snapping(dense).table["snap_step"].to_numpy()
    pythia = sorted({0, *(2**k for k in range(10)), *range(750, 1001, 250)})
    seen = dense.select(steps=pythia)
    value = snapping(seen).table
    interval = snap_step_interval(seen, generator=torch.Generator().manual_seed(0))
    lo, hi = (interval[f"snap_step_{e}"].reshape(-1).numpy() for e in ("lo", "hi"))
    assert ((lo <= truth) & (truth <= hi)).all(), (lo, truth, hi)
    assert ((lo <= value["snap_step"]) & (value["snap_step"] <= hi)).all()
    assert (hi - lo > 0).all()
    assert ((value["snap_step_grid_lo"] >= lo) & (value["snap_step_grid_hi"] <= hi)).all()
    assert set(value["snap_step_grid_lo"]) | set(value["snap_step_grid_hi"]) <= set(pythia)

    traj = head_type_run(rows=32, heads=1, rise=(0.6,), formed=181.5, steps=11, spacing=20.0)
    final = head_type(traj, "induction").final()
    every = torch.arange(2001, dtype=torch.float64) * 0.1  # the rows' mean every 0.1 steps
    mean = 0.1 + 0.6 * torch.sigmoid((every - 181.5) / 10.0)  # E Beta(1, 9) = 0.1
    true_step = float(formation_step(every, mean))
    value, lo, hi = (final[f"induction_step{e}"].iloc[0] for e in ("", "_lo", "_hi"))
    assert lo <= 20 * math.floor(value / 20) and hi >= 20 * math.ceil(value / 20)
    assert lo <= true_step <= hi


def test_a_noisy_run_at_pythias_schedule_does_not_peak_in_its_short_intervals():
    """Movement between checkpoints of a stochastic run: the drift's integral plus
    step-to-step noise growing as the square root of the interval (per step, the larger the
    shorter the interval).  At Pythia's schedule (..., 128, 250, 256, 500, 512, 750, ...) the
    6- and 12-step intervals then carry a rate several times their neighbours' and took the
    peak; merged with their neighbours, the rate peaks and snaps where the drift's does on a
    grid of equal log-width intervals, and the grid's bracket holds it."""
    from scansnap_lens.measures.snap import comparable_intervals, snap_step

    def drift(t):  # a rate rising to a peak near 300 and falling like 1 / t
        return t / (1 + (t / 300.0) ** 2)

    def moves(steps, noise):
        t = torch.as_tensor(steps, dtype=torch.float64)
        fine = torch.linspace(0, 1, 201, dtype=torch.float64)
        a, b = t[:-1, None], t[1:, None]
        integral = (drift(a + (b - a) * fine).mean(-1, keepdim=True) * (b - a))[:, 0]
        return integral + noise * torch.sqrt(b - a)[:, 0]

    pythia = [0, 1, 2, 4, 8, 16, 32, 64, 128, 250, 256, 500, 512, 750, 1000, 1250, 1500, 2000]
    assert comparable_intervals(torch.tensor(pythia)).sum() == len(pythia) - 2
    even = torch.unique(torch.logspace(0, math.log10(2000), 60).round()).long().tolist()
    truth = float(snap_step(torch.tensor([0, *even]), moves([0, *even], 0.0))[0])
    noisy = moves(pythia, noise=60.0)
    rate = noisy / torch.diff(torch.tensor(pythia, dtype=torch.float64))
    assert int(rate.argmax()) in (9, 11)  # the short intervals: the artifact merged away
    snap, peak, _, lo, hi, _, _ = snap_step(torch.tensor(pythia), noisy, grid=True)
    assert float(lo) <= truth <= float(hi), (float(lo), truth, float(hi))
    assert 256 < float(peak) < 1000 and abs(float(snap) - truth) < 0.35 * truth


def test_straightness_tells_a_drift_from_step_to_step_noise():
    """1 where every class's c_hat drifts one way; about 1 / sqrt 2 where it walks at random
    between equally spaced checkpoints; in between for a drift under noise.  The findings
    say a noisy layer's snap steps depend on the checkpoints' spacing."""
    import pandas as pd

    from scansnap_lens.reading.findings import findings_of

    steps = list(range(0, 400, 10))
    g = torch.Generator().manual_seed(0)
    walk = torch.randn(len(steps), 300, generator=g, dtype=torch.float64).cumsum(0) * 0.01
    drift = torch.linspace(0, 1, len(steps), dtype=torch.float64)[:, None] * torch.rand(
        1, 300, generator=g, dtype=torch.float64
    )

    def straightness_of(values):
        c_hat = {(1, 2): {l: values[:, l - 3].tolist() for l in range(3, 303)}}
        traj = hand_trajectory(steps, zbar={(1, 3): [0.0] * len(steps)}, c_hat=c_hat, vocab=400)
        return float(measures.straightness(traj)), measures.snapping(traj).table

    straight, _ = straightness_of(drift)
    noise, table = straightness_of(walk)
    mixed, _ = straightness_of(drift * 0.1 + walk)
    assert straight == pytest.approx(1.0, abs=1e-6)
    assert noise == pytest.approx(1 / math.sqrt(2), abs=0.03)  # E|a + b| / (E|a| + E|b|)
    assert noise < mixed < straight
    assert table["straightness"][0] == pytest.approx(noise)
    summary = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "snap_step": [300.0, 320.0],
                            "straightness": [noise, noise]})  # fmt: skip
    said = " ".join(findings_of(summary))
    assert "moved mostly by step-to-step noise" in said and "0.71" in said
    assert "step-to-step noise" not in " ".join(findings_of(summary.assign(straightness=1.0)))


def test_a_noisy_run_recorded_at_every_step_snaps_where_its_drift_does():
    """The expected trajectory (a population Y/Z run) plus noise on c_hat at every checkpoint,
    recorded at every step: read from the rate between consecutive checkpoints the snap step
    was 1.62x the drift's (the largest of 400 noisy rates took the peak); read over the
    checkpoints between which the movement is a drift it lands within 0.8-1.25x, its interval
    holds the truth, and the findings say the noise and what to do.  Without noise every
    checkpoint is kept and the values are the consecutive rates' as before."""
    import pandas as pd

    from scansnap_lens.lab.synthetic import sequence_classes
    from scansnap_lens.lab.yz import train_yz
    from scansnap_lens.measures.snap import class_movement, snap_step, snap_step_interval
    from scansnap_lens.reading.findings import findings_of

    classes = sequence_classes(num_queries=3, next_per_query=2)
    run = train_yz(classes, lr_z=6.0, lr_y=0.6, seeds=[1], momentum=0.0, num_steps=400,
                   snapshot_every=1, population=True)  # fmt: skip
    clean = run.to_trajectory()
    table = measures.snapping(clean).table
    truth = float(table["snap_step"][0])
    assert int(table["drift_checkpoints"][0]) == clean.num_steps == int(table["checkpoints"][0])
    w = clean.plan.class_events.double()
    consecutive = torch.einsum("slhk,k->lhs", class_movement(clean), w) / w.sum()
    assert truth == float(snap_step(clean.steps, consecutive)[0])

    g = torch.Generator().manual_seed(0)
    c = clean.c_hat[:].double()
    noisy = clean.replace(c_hat=(c + 3e-4 * torch.randn(c.shape, generator=g,
                                                         dtype=torch.float64)).float())  # fmt: skip
    rate_read = float(snap_step(noisy.steps, torch.einsum(
        "slhk,k->lhs", class_movement(noisy), w) / w.sum())[0])  # fmt: skip
    assert not 0.8 * truth <= rate_read <= 1.25 * truth  # what it read before
    table = measures.snapping(noisy).table
    value = float(table["snap_step"][0])
    interval = snap_step_interval(noisy, generator=torch.Generator().manual_seed(0))
    lo, hi = float(interval["snap_step_lo"][0, 0]), float(interval["snap_step_hi"][0, 0])
    assert 0.8 * truth <= value <= 1.25 * truth, (value, truth)
    assert lo <= truth <= hi, (lo, truth, hi)
    assert int(table["drift_checkpoints"][0]) < noisy.num_steps // 4
    for name in ("half_distance_step", "half_displacement_step"):
        assert 0.3 * truth < float(table[name][0]) < 3 * truth
    said = " ".join(findings_of(pd.concat([table] * 2).assign(head=[0, 1])))
    assert "moved mostly by step-to-step noise" in said and "more seeds" in said
    # the snap in a few words, the noise's caveat a finding of its own, said once for the
    # page however many layers it concerns
    two = pd.concat([table, table.assign(layer=1)])
    found = findings_of(two, steps=noisy.steps.tolist())
    snaps = [line for line in found if line.startswith("Layer ") and "snapped near" in line]
    assert len(snaps) == 2 and all(len(line.split()) <= 15 for line in snaps), snaps
    noise = [line for line in found if "step-to-step noise" in line]
    assert len(noise) == 1 and noise[0].startswith("Layers 0 and 1 moved"), found
