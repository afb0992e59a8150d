"""population: the Y/Z population dynamics on corpus statistics, against brute force."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scansnap_lens.lab.synthetic import sequence_classes, syn_medium, syn_small
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.theory.population import Population, predict

EPS32 = torch.finfo(torch.float32).eps


def _full_vocabulary_run(pop: Population, lr_y: float, lr_z: float, steps: int) -> torch.Tensor:
    """Brute force: dense M x M Y and Z over the whole vocabulary, float64, plain SGD, the
    population loss sum_k weight_k CE(Y f_k, n_k).  Returns Z [M, M] after `steps`."""
    M = pop.vocab_size
    probs = torch.zeros(pop.num_classes, M, dtype=torch.float64)
    probs[:, pop.tokens] = pop.probs
    Y = torch.zeros(M, M, dtype=torch.float64, requires_grad=True)
    Z = torch.zeros(M, M, dtype=torch.float64, requires_grad=True)
    for _ in range(steps):
        c = torch.softmax(Z[pop.query] + probs.log(), -1)
        f = c / c.norm(dim=-1, keepdim=True)
        loss = (F.cross_entropy(f @ Y.T, pop.next_token, reduction="none") * pop.weight).sum()
        gy, gz = torch.autograd.grad(loss, (Y, Z))
        with torch.no_grad():
            Y -= lr_y * gy
            Z -= lr_z * gz
    return Z.detach()


def test_compressed_vocabulary_equals_the_full_one():
    """Unused tokens, shared outputs and unequal class weights: the compressed run (context
    tokens of the supports only, the non-target outputs as one row with a multiplicity) gives
    the full-vocabulary Z to float64 rounding."""
    g = torch.Generator().manual_seed(0)
    M, C = 40, 12
    tokens = torch.sort(torch.randperm(30, generator=g)[:C]).values  # ids 30..39 never context
    probs = torch.rand(5, C, generator=g, dtype=torch.float64)
    probs[probs < 0.3] = 0  # sparse supports
    probs[:, 0] += 0.1  # every class has a context token
    probs /= probs.sum(1, keepdim=True)
    pop = Population.from_dense(
        query=torch.tensor([31, 31, 33, 33, 33]),
        next_token=torch.tensor([35, 36, 35, 37, 38]),  # 35 is the next token of two classes
        weight=torch.tensor([0.1, 0.3, 0.05, 0.2, 0.15], dtype=torch.float64),
        probs=probs,
        tokens=tokens,
        vocab_size=M,
    )
    run = predict(pop, lr_y=0.7, lr_z=2.0, steps=[0, 60])
    full = _full_vocabulary_run(pop, 0.7, 2.0, 60)
    expected = full[pop.queries][:, tokens]
    assert run.Z[-1].abs().max() > 0.05  # the logits did move
    torch.testing.assert_close(run.Z[-1], expected, rtol=0, atol=1e-12)
    untouched = torch.ones(M, dtype=torch.bool)
    untouched[tokens] = False
    assert full[pop.queries][:, untouched].abs().max() == 0  # what the compression leaves out


@pytest.mark.parametrize(
    "classes, optimizer, momentum",
    [
        (syn_small(), "sgd", 0.0),
        (syn_medium(1), "sgd", 0.9),
        (sequence_classes(2, 3, num_common_per_query=4), "adam", 0.0),
    ],
    ids=["syn-small-sgd", "syn-medium-momentum", "two-queries-adam"],
)
def test_prediction_equals_the_lab_population_run(classes, optimizer, momentum):
    """`predict` on `Population.from_classes` is the lab's `train_yz(population=True)` from
    zero: the same dynamics written twice, once dense (float32) and once compressed."""
    steps = 150
    lab = train_yz(
        classes, lr_z=0.5, ratio=4.0, num_steps=steps, population=True, init="zero",
        optimizer=optimizer, momentum=momentum, snapshot_every=50,
    )  # fmt: skip
    pop = Population.from_classes(classes)
    run = predict(pop, 2.0, 0.5, lab.steps, optimizer=optimizer, momentum=momentum)
    expected = lab.Z[:, 0][:, pop.queries][:, :, pop.tokens].double()
    # float32 rounding of the lab run, compounded over its steps
    tol = 4 * steps * EPS32 * max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(run.Z, expected, rtol=0, atol=tol)
    before = lab.steps < steps  # lab.loss[i]: the loss after i updates
    torch.testing.assert_close(
        run.loss[before], lab.loss[lab.steps[before], 0].double(), rtol=0, atol=tol
    )


def test_from_stats_counts_and_weights():
    rows = torch.tensor([[5, 1, 2, 1, 3], [2, 4, 2, 1, 3], [4, 4, 1, 0, 0]])
    stats = cooccurrence(rows, vocab_size=6)
    pop = Population.from_stats(stats, classes=[(1, 3), (4, 2), (9, 9)])  # (9, 9) never occurs
    assert list(zip(pop.query.tolist(), pop.next_token.tolist())) == [(1, 3), (4, 2)]
    # (1, 3): contexts [5, 1, 2] and [2, 4, 2]; (4, 2): context [2]
    by_token = dict(zip(pop.tokens.tolist(), pop.probs[0].tolist()))
    assert by_token == pytest.approx({1: 1 / 6, 2: 3 / 6, 4: 1 / 6, 5: 1 / 6})
    assert pop.probs[1, pop.tokens.tolist().index(2)] == 1.0
    positions = 3 * 4  # every next-token prediction of three rows of five
    assert pop.weight.tolist() == pytest.approx([2 / positions, 1 / positions])
    last_only = Population.from_stats(stats, classes=[(1, 3)], loss_positions=3)
    assert last_only.weight.tolist() == pytest.approx([2 / 3])
    with pytest.raises(ValueError, match="none of the classes"):
        Population.from_stats(stats, classes=[(9, 9)])


def test_prediction_on_a_plan():
    """zbar of a pair the statistics never hold stays 0; c_hat of a class they lack is NaN;
    c_hat of each class sums to 1 over its tokens."""
    rows = torch.tensor([[0, 1, 2, 1, 3], [0, 2, 2, 1, 3], [0, 4, 0, 1, 5]])
    stats = cooccurrence(rows[:2], vocab_size=6)  # the class (1, 5) is only in the third row
    plan = plan_recording(rows, 6, queries=[1], exclude_bos=False)
    run = predict(Population.from_stats(stats, [(1, 3), (1, 5)]), 1.0, 5.0, steps=[0, 5, 20])
    traj = run.to_trajectory(plan)
    pairs = dict(zip(plan.pair_token.tolist(), range(plan.num_pairs)))
    assert traj.zbar[:, 0, 0, pairs[4]].abs().max() == 0  # 4 is never a context of 1 in stats
    assert traj.zbar[-1, 0, 0, pairs[2]] != 0
    c5 = traj.class_slot(1, 5)
    assert torch.isnan(traj.c_hat[:, 0, 0, plan.triple_class == c5]).all()
    c3 = traj.class_slot(1, 3)
    totals = traj.c_hat[:, 0, 0, plan.triple_class == c3].sum(-1)
    torch.testing.assert_close(totals, torch.ones_like(totals), rtol=0, atol=8 * EPS32)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr_y": 0.0, "lr_z": 1.0, "steps": [0, 1]}, "rates must be positive"),
        ({"lr_y": 1.0, "lr_z": math.nan, "steps": [0, 1]}, "rates must be positive"),
        ({"lr_y": 1.0, "lr_z": 1.0, "steps": [3, 1]}, "strictly ascending"),
        ({"lr_y": 1.0, "lr_z": 1.0, "steps": [0], "optimizer": "lion"}, "optimizer"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        predict(Population.from_classes(syn_small()), **kwargs)


@pytest.mark.parametrize(
    "optimizer, momentum, rates",
    [("sgd", 0.0, (1.0, 1.0)), ("sgd", 0.9, (0.1, 0.1)), ("adam", 0.0, (0.01, 0.01))],
    ids=["sgd", "momentum", "adam"],
)
def test_merged_steps_follow_the_step_by_step_model(optimizer, momentum, rates):
    """Past `EXACT_STEPS`, runs of steps merge into one where the attention moves slowly: at
    every checkpoint it is the step-by-step model's within 3e-4 (a probability) over 3000
    steps, at a tenth of the gradients."""
    pop = Population.from_classes(syn_medium(1))
    steps = [0, 10, 300, 1000, 3000]
    exact = predict(pop, *rates, steps, optimizer=optimizer, momentum=momentum, exact=True)
    merged = predict(pop, *rates, steps, optimizer=optimizer, momentum=momentum)
    assert merged.Z.abs().max() > 0.3  # the logits did move
    torch.testing.assert_close(merged.attention(), exact.attention(), rtol=0, atol=3e-4)


def test_the_work_grows_with_the_log_of_the_last_step(monkeypatch):
    """A checkpoint at step 10^12 (tests/data/trajectory_v1 has one; Pythia's last is
    143,000) takes a few thousand gradients, not 10^12: no hang."""
    from scansnap_lens.theory import population

    calls = []
    loss = population._loss
    monkeypatch.setattr(population, "_loss", lambda *a: calls.append(1) or loss(*a))
    pop = Population.from_classes(syn_medium(1))
    run = predict(pop, 0.1, 3.0, [0, 10, 143_000, 10**12])
    assert len(run.steps) == 4 and len(calls) < 5000, len(calls)
    assert torch.isfinite(run.Z).all()
