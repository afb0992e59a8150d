"""Recordings placed where they resolve the snap and formation steps (`planning.placement`):
against the truth at every step of the lab's population runs and of a real training loop."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from scansnap_lens.measures.snap import head_movement, snap_step, snapping
from scansnap_lens.models.steps import select_steps
from scansnap_lens.planning.placement import (
    PLACEMENT_FILE,
    AdaptiveSchedule,
    coarse_steps,
    next_steps,
    step_brackets,
)

LAST = 1000


@pytest.fixture(scope="module")
def dense():
    """Three population Y/Z runs (one "head" each) kept at every step, and their snap steps."""
    from scansnap_lens.lab.synthetic import sequence_classes
    from scansnap_lens.lab.yz import train_yz

    classes = sequence_classes(num_queries=3, next_per_query=2)
    run = train_yz(classes, lr_z=[1.5, 4.0, 9.0], lr_y=[0.15, 0.4, 0.9], seeds=[0, 1, 2],
                   momentum=0.0, num_steps=LAST, snapshot_every=1, population=True)  # fmt: skip
    traj = run.to_trajectory()
    traj = traj.select(steps=[s for s in traj.steps.tolist() if s <= LAST])
    return traj, snapping(traj).table["snap_step"].to_numpy()


def _placed(one, budget):
    available = one.steps.tolist()
    chosen = set(coarse_steps(available, budget))
    while picks := next_steps(step_brackets(one.select(steps=sorted(chosen))), available,
                              chosen, budget - len(chosen)):  # fmt: skip
        chosen |= {s for s, _ in picks}
    return sorted(chosen)


def _within(table, share=0.1):
    value = table["snap_step"][0]
    lo, hi = table["snap_step_grid_lo"][0], table["snap_step_grid_hi"][0]
    return value - lo <= share * value and hi - value <= share * value


def test_placed_checkpoints_resolve_each_snap_where_the_log_grid_does_not(dense):
    """Checkpoints at every step exist (as hub revisions do): the coarse pass and the
    bracket-splitting rounds place each run's snap step within 10 % of itself, its bracket
    holding the truth at every step, with at most 40 recordings; the log grid of 40 places
    none so well."""
    traj, truth = dense
    for h, head in enumerate(traj.heads):
        one = traj.select(heads=[head])
        steps = _placed(one, 40)
        assert len(steps) <= 40 and steps[0] == 0 and steps[-1] == LAST
        table = snapping(one.select(steps=steps)).table
        assert _within(table), table.iloc[0].to_dict()
        assert table["snap_step_grid_lo"][0] <= truth[h] <= table["snap_step_grid_hi"][0]
        log = snapping(one.select(steps=select_steps(one.steps.tolist(), "log:40"))).table
        assert not _within(log), log.iloc[0].to_dict()
        assert log["snap_step_grid_lo"][0] <= truth[h] <= log["snap_step_grid_hi"][0]


def test_the_online_schedule_keeps_its_budget_and_brackets_the_truth(dense):
    """A training run cannot go back: the schedule's choices from what it saw stay within the
    budget, end at the last step, bracket every run's true snap step, and bracket it tighter
    than the log grid of the same budget."""
    traj, truth = dense
    for h, head in enumerate(traj.heads):
        one = traj.select(heads=[head])
        schedule = AdaptiveSchedule(recorder=None, budget=40, last_step=LAST)
        steps, moves = [0], []
        while steps[-1] < LAST:
            step, why = schedule.choose(steps, moves)
            assert step > steps[-1] and why
            moves.append(head_movement(one.plan, one.c_hat[steps[-1]], one.c_hat[step]))
            steps.append(step)
        assert len(steps) <= 40
        table = snapping(one.select(steps=steps)).table.iloc[0]
        log = snapping(one.select(steps=select_steps(one.steps.tolist(), "log:40"))).table
        assert table["snap_step_grid_lo"] <= truth[h] <= table["snap_step_grid_hi"]
        width = table["snap_step_grid_hi"] - table["snap_step_grid_lo"]
        assert width < (log["snap_step_grid_hi"] - log["snap_step_grid_lo"])[0]


def test_next_steps_split_the_widest_bracket_first_and_leave_what_the_grid_cannot():
    brackets = pd.DataFrame({
        "layer": [0, 0, 1], "head": [0, 1, 0],
        "quantity": ["snap_step", "snap_step", "induction_step"],
        "step": [100.0, 300.0, 50.0], "lo": [60.0, 256.0, 40.0], "hi": [160.0, 500.0, 60.0],
        "resolved": [False, False, False],
    })  # fmt: skip
    available = [0, 40, 60, 64, 90, 100, 128, 160, 256, 500]  # nothing inside (256, 500)
    picks = next_steps(brackets, available, done={0, 40, 60, 160, 256, 500}, room=5)
    middle = math.expm1((math.log1p(60) + math.log1p(160)) / 2)  # 98.2
    assert [s for s, _ in picks] == [100]  # nearest the log-middle of (60, 160); 50's bracket
    assert "L0H0 snap_step 100 between checkpoints 60 and 160" in picks[0][1]  # has no room
    assert abs(100 - middle) < abs(90 - middle)
    assert next_steps(brackets, available, done={0}, room=1) == next_steps(
        brackets, available, done={0}, room=5)[:1]  # fmt: skip
    assert not next_steps(brackets.assign(resolved=True), available, done={0}, room=5)


def test_step_brackets_say_where_the_checkpoints_allow_the_peak():
    """The rate's peak: brute force over unimodal rates seen at a coarse grid, the grid's
    bracket always holds the true peak."""
    t = torch.arange(0, 2001, dtype=torch.float64)
    grid = torch.tensor([0, 3, 10, 40, 90, 160, 300, 520, 900, 1400, 2000])
    for peak in (5.0, 37.0, 95.0, 161.0, 700.0):
        for width in (0.3, 0.8):
            rate = torch.exp(-((torch.log1p(t) - math.log1p(peak)) ** 2) / (2 * width**2))
            cum = torch.cat([torch.zeros(1), torch.cumsum(rate[:-1], 0)])  # movement to t
            moves = torch.diff(cum[grid])
            _, _, _, _, _, lo, hi = snap_step(grid, moves, grid=True)
            assert float(lo) <= peak <= float(hi), (peak, width, float(lo), float(hi))


@pytest.mark.tl
def test_a_training_loop_records_where_the_schedule_says_and_why(tmp_path):
    """The demo's Syn-Medium model trained 300 steps with `train(save_steps=schedule,
    on_checkpoint=schedule)`: at most 40 recordings, from step 0 to the last, each with why
    in placement.json; their snap bracket holds the snap step of the same training recorded
    at every step, and is narrower than the log grid's of 40."""
    from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording import Recorder, RecordingSettings, plan_recording

    classes = syn_medium()
    sample = sequence_sampler(classes)
    tokens = sample(64, torch.Generator().manual_seed(2))
    plan = plan_recording(tokens, classes.vocab_size, queries=classes.query.unique().tolist(),
                          exclude_bos=False)  # fmt: skip
    trajs = {}
    for name in ("every", "placed"):
        model = attention_only_model(classes.vocab_size, d_model=32, n_heads=1, n_ctx=64,
                                     seed=0, normalization_type=None)  # fmt: skip
        recorder = Recorder(tmp_path / name, tokens, RecordingSettings(progress=False), plan)
        schedule = AdaptiveSchedule(recorder, budget=40, last_step=300)
        steps = 1 if name == "every" else schedule
        callback = recorder.on_checkpoint if name == "every" else schedule
        train(model, sample, 300, lr_y=0.1, lr_z=3.0, batch_size=64, save_steps=steps,
              loss_on="last", progress=False, on_checkpoint=callback)  # fmt: skip
        trajs[name] = recorder.trajectory()
    placed = trajs["placed"]
    assert len(placed.steps) <= 40 and placed.steps[0] == 0 and placed.steps[-1] == 300
    why = json.loads((tmp_path / "placed" / PLACEMENT_FILE).read_text())["steps"]
    assert sorted(map(int, why)) == placed.steps.tolist() and all(why.values())
    truth = snapping(trajs["every"]).table["snap_step"][0]
    table = snapping(placed).table
    assert table["snap_step_grid_lo"][0] <= truth <= table["snap_step_grid_hi"][0]
    log = snapping(trajs["every"].select(steps=select_steps(range(301), "log:40"))).table
    width = (table["snap_step_grid_hi"] - table["snap_step_grid_lo"])[0]
    assert width < (log["snap_step_grid_hi"] - log["snap_step_grid_lo"])[0]


def test_placement_stops_refining_where_the_noise_not_the_drift_sets_the_bracket(tmp_path):
    """The expected trajectory (a population Y/Z run) recorded at every step, and the same
    with noise on c_hat at each checkpoint: `--steps auto` brackets the clean run's snap
    step, but adds no recording to the noisy one's (closer checkpoints there measure noise,
    not the drift); the training loop's schedule flags the noisy head as it goes (its latest
    splits' straightness, as `snap.drift_knots` pools it) and not the clean one."""
    from types import SimpleNamespace

    from scansnap_lens.lab.synthetic import sequence_classes
    from scansnap_lens.lab.yz import train_yz

    classes = sequence_classes(num_queries=3, next_per_query=2)
    run = train_yz(classes, lr_z=6.0, lr_y=0.6, seeds=[1], momentum=0.0, num_steps=400,
                   snapshot_every=1, population=True)  # fmt: skip
    clean = run.to_trajectory()
    g = torch.Generator().manual_seed(0)
    c = clean.c_hat[:].double()
    noisy = clean.replace(c_hat=(c + 3e-4 * torch.randn(c.shape, generator=g,
                                                         dtype=torch.float64)).float())  # fmt: skip
    assert "snap_step" in set(step_brackets(clean)["quantity"])
    assert "snap_step" not in set(step_brackets(noisy)["quantity"])
    for traj, expected in ((clean, False), (noisy, True)):
        recorder = SimpleNamespace(run=SimpleNamespace(plan=traj.plan), out=tmp_path)
        schedule = AdaptiveSchedule(recorder, budget=40, last_step=400)
        for step in range(0, 401, 5):  # the latest splits: after the snap, where little drifts
            schedule.observe(step, traj.c_hat[step][0])
        assert bool(schedule.noisy.reshape(-1)[0]) is expected
