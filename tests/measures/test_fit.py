"""fit: Theorem 3's bounds with rho0 from data, and heads scored against the prediction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from scansnap_lens import measures
from scansnap_lens.lab.synthetic import syn_medium, syn_small
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.measures.settings import AnalysisSettings as Settings
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.theory import PhaseTransition, rho0

RATES = {"lr_z": [0.5, 1.0], "ratio": [4.0, 2.0]}  # two heads: eta_Y = 2 and 2, eta_Z = .5, 1


@pytest.fixture(scope="module")
def lab():
    classes = syn_medium(1)
    run = train_yz(
        classes,
        **RATES,
        seeds=[0, 1],
        num_steps=400,
        population=True,
        momentum=0.0,
        snapshot_every=10,
    )
    return classes, TokenGroups.from_synthetic(classes), run.to_trajectory()


def test_rho0_is_the_initial_overlap():
    g = np.random.default_rng(0)
    probs = g.random((4, 9)) * (g.random((4, 9)) > 0.4)
    probs /= probs.sum(1, keepdims=True)
    f = probs / np.linalg.norm(probs, axis=1, keepdims=True)
    overlaps = [f[i] @ f[j] for i in range(4) for j in range(4) if i != j]
    assert rho0(probs) == pytest.approx(np.mean(overlaps) ** -0.5, rel=1e-12)
    assert rho0(np.eye(3)) == math.inf  # no shared context token
    assert math.isnan(rho0(probs[:1]))


def test_population_lab_fits_its_own_prediction(lab):
    """The population lab is the theory's own dynamics: every score is perfect, per head at
    that head's rates."""
    classes, groups, traj = lab
    fit = measures.theory_fit(traj, classes, groups)
    final = fit.final()
    assert final["rank_agreement"].tolist() == pytest.approx([1.0, 1.0], abs=1e-12)
    # the lab runs in float32, the prediction in float64
    assert final["dz_corr"].tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    assert final["snap_ratio"].tolist() == pytest.approx([1.0, 1.0], abs=1e-3)
    assert fit.values.shape == (traj.num_steps, 1, 2)
    assert final["population_snap"].iloc[0] != final["population_snap"].iloc[1]  # own rates


def test_sampled_lab_fits_closely():
    """Finite sequences (T = 128) instead of the T -> infinity limit: close, not exact."""
    classes = syn_small()
    run = train_yz(classes, **RATES, seeds=[0, 1], num_steps=400, snapshot_every=10)
    fit = measures.theory_fit(run.to_trajectory(), classes, TokenGroups.from_synthetic(classes))
    final = fit.final()
    assert (final["rank_agreement"] > 0.9).all()
    assert (final["dz_corr"] > 0.95).all()
    assert final["snap_ratio"].between(0.8, 1.25).all()


def test_a_head_against_the_theory_scores_badly(lab):
    """The same trajectory with every logit change and attention order reversed: -1."""
    classes, groups, traj = lab
    reversed_ = traj.replace(zbar=2 * traj.zbar[:1] - traj.zbar, c_hat=-traj.c_hat)
    final = measures.theory_fit(reversed_, classes, groups).final()
    assert final["dz_corr"].tolist() == pytest.approx([-1.0, -1.0], abs=1e-5)
    assert final["rank_agreement"].tolist() == pytest.approx([-1.0, -1.0], abs=1e-12)


def test_growth_bounds_use_theorem_4_with_data_rho0(lab):
    classes, groups, traj = lab
    bounds = measures.growth_bounds(traj, groups, classes)
    detail = bounds.detail
    r0 = rho0(classes.probs.double().numpy())
    assert detail["rho0"].tolist() == pytest.approx([r0] * len(detail))
    assert (detail["K"] == classes.num_classes).all()
    t = float(traj.steps[-1])
    for head, (lr_z, ratio) in enumerate(zip(RATES["lr_z"], RATES["ratio"])):
        theory = PhaseTransition(classes.num_classes, classes.vocab_size, lr_z * ratio, lr_z, r0)
        B = detail.loc[detail["head"] == head, "B"]
        assert B.tolist() == pytest.approx([float(theory.B_integral(t))] * len(B), rel=1e-12)
    # the measured dz is the logit change of the most frequent distinct token
    k = 0
    l0 = int(groups.distinct[k][torch.argmax(groups.distinct_p[k])])
    m = int(groups.query[k])
    slot = int(((traj.plan.pair_query == m) & (traj.plan.pair_token == l0)).nonzero())
    dz = float(traj.zbar[-1, 0, 0, slot] - traj.zbar[0, 0, 0, slot])
    assert detail["dz"].iloc[0] == pytest.approx(dz, rel=1e-6)
    # rho0 = 1 (the paper's default) makes C0 smaller and the bound larger
    ones = measures.growth_bounds(traj, groups, classes, rho0_value=1.0).detail
    assert r0 > 1 and (ones["B"] > detail["B"]).all()
    assert bounds.values.shape == (traj.num_steps, 1, 2)
    # without the corpus, P(l|m, n) comes from the recording's own evaluation text
    own = measures.growth_bounds(traj, groups).detail
    assert own["dz"].tolist() == pytest.approx(detail["dz"].tolist())
    assert own["B"].notna().all() and (own["B"] > 0).all()


def test_adam_has_no_bound_and_missing_rates_are_named(lab):
    classes, groups, traj = lab
    adam = traj.replace(meta={**traj.meta, "optimizer": "adam"})
    with pytest.raises(ValueError, match=r"plain-SGD rates.*Adam"):  # not a column of NaN
        measures.growth_bounds(adam, groups, classes)
    bare = traj.replace(meta={"source": "yz"})
    with pytest.raises(ValueError, match="does not say how the model was trained"):
        measures.theory_fit(bare, classes, groups)
    fit = measures.theory_fit(bare, classes, groups, Settings(training={"lr_y": 2.0, "lr_z": 0.5}))
    assert fit.final()["dz_corr"].iloc[0] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.tl
def test_growth_bounds_count_next_tokens_not_classes(tmp_path):
    """On text, the classes (m, n) outnumber the vocabulary (every query meets many next
    tokens); Theorem 4's K counts next tokens (it was the classes: "K=297 next tokens exceed
    the vocabulary M=33")."""
    from _tiny import QUIET, V, tiny_model

    from scansnap_lens.models.checkpoints import in_memory
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.recording.recorder import record_trajectory
    from scansnap_lens.statistics.corpus import cooccurrence

    tokens = torch.randint(0, V, (8, 24), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    assert plan.num_classes > V
    models = in_memory({0: tiny_model(seed=0), 5: tiny_model(seed=1)})
    traj = record_trajectory(models, tokens, tmp_path / "t", QUIET, plan=plan)
    stats = cooccurrence(tokens, V)
    groups = TokenGroups.from_statistics(stats, guard=False, purity=0.5)
    rates = Settings(training={"lr_y": 1.0, "lr_z": 1.0})
    bounds = measures.growth_bounds(traj, groups, stats, settings=rates)
    assert (bounds.detail["K"] == plan.class_next.unique().numel()).all()
    assert bounds.final()["bound_ratio"].notna().all()


@pytest.mark.tl
def test_the_fit_ends_on_a_trajectory_at_step_ten_to_the_twelve(tmp_path, monkeypatch):
    """A model trained by `train` at rates 0.5 / 1.0 (2 layers x 2 heads, vocabulary 29),
    recorded at steps 0 and 10^12: uniform tokens never let the population settle, so the
    merged steps stay short unless bounded (it ran for hours); now a few thousand gradients
    (counted, not timed: a busy machine's clock says nothing about the work)."""
    from _tiny import QUIET

    from scansnap_lens.models.checkpoints import in_memory
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording.recorder import record_trajectory
    from scansnap_lens.statistics.context import Context
    from scansnap_lens.statistics.corpus import count_corpus
    from scansnap_lens.theory import population

    rows = torch.randint(0, 29, (128, 16), generator=torch.Generator().manual_seed(0))
    first = attention_only_model(29, d_model=16, n_heads=2, n_layers=2, n_ctx=16)
    last = attention_only_model(29, d_model=16, n_heads=2, n_layers=2, n_ctx=16)
    train(last, rows, 20, lr_y=0.5, lr_z=1.0, save_steps=[], progress=False)
    models = in_memory({0: first, 10**12: last})
    traj = record_trajectory(models, rows[:16], tmp_path / "t", QUIET)
    stats = count_corpus(rows, Context(window=16))
    calls = []
    loss = population._loss
    monkeypatch.setattr(population, "_loss", lambda *a: calls.append(1) or loss(*a))
    fit = measures.theory_fit(traj, stats, settings=Settings(training={"lr_y": 0.5, "lr_z": 1.0}),
                               progress=False)  # fmt: skip
    assert len(calls) < population.EXACT_STEPS + population.RESOLUTION * 42, len(calls)
    assert fit.table["step"].max() == 10**12


@pytest.mark.tl
def test_the_fit_integrates_the_most_frequent_classes_and_says_its_cost(tmp_path, capsys):
    """A user's run tracks thousands of classes and a gradient of the population dynamics costs
    triples x next tokens (hours): the fit takes the `theory_classes` most frequent, says so in its
    table, and says its cost before it starts; a cap above the count changes nothing."""
    from _tiny import QUIET, V, tiny_model

    from scansnap_lens.measures.fit import fit_classes
    from scansnap_lens.models.checkpoints import in_memory
    from scansnap_lens.recording.recorder import record_trajectory
    from scansnap_lens.statistics.corpus import cooccurrence

    tokens = torch.randint(0, V, (8, 24), generator=torch.Generator().manual_seed(0))
    models = in_memory({0: tiny_model(seed=0), 5: tiny_model(seed=1), 40: tiny_model(seed=2)})
    traj = record_trajectory(models, tokens, tmp_path / "t", QUIET)
    stats = cooccurrence(tokens, V)
    training = Settings(training={"lr_y": 1.0, "lr_z": 1.0})
    plan = traj.plan
    top = fit_classes(traj, 12)
    events = dict(zip(zip(plan.class_query.tolist(), plan.class_next.tolist()),
                      plan.class_events.tolist()))  # fmt: skip
    assert len(top) == 12 and min(events[c] for c in top) >= sorted(events.values())[-12]
    capped = measures.theory_fit(traj, stats, settings=training.replace(theory_classes=12))
    said = capsys.readouterr().out
    assert "theory fit: 12 classes (the most frequent)" in said and "to step 40: about" in said
    assert (capped.table["fit_classes"] == 12).all()
    every = measures.theory_fit(traj, stats, settings=training.replace(theory_classes=None),
                                progress=False)  # fmt: skip
    above = measures.theory_fit(traj, stats, settings=training.replace(theory_classes=10**6),
                                progress=False)  # fmt: skip
    assert (every.table["fit_classes"] == plan.num_classes).all()
    pd.testing.assert_frame_equal(every.table, above.table)


@pytest.mark.tl
def test_the_fit_takes_fewer_classes_where_its_time_would_pass_the_limit(tmp_path, capsys,
                                                                        monkeypatch):  # fmt: skip
    """theory_seconds: the classes are cut until the estimate (a gradient's time, here made
    to grow with the square of the classes as triples x next tokens does, times the gradients
    at most) fits, and the cut is said with the setting that made it; no limit keeps them."""
    from _tiny import QUIET, V, tiny_model

    from scansnap_lens.measures import fit
    from scansnap_lens.models.checkpoints import in_memory
    from scansnap_lens.recording.recorder import record_trajectory
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.theory.population import gradients_at_most

    tokens = torch.randint(0, V, (8, 24), generator=torch.Generator().manual_seed(0))
    models = in_memory({0: tiny_model(seed=0), 5: tiny_model(seed=1), 40: tiny_model(seed=2)})
    traj = record_trajectory(models, tokens, tmp_path / "t", QUIET)
    stats = cooccurrence(tokens, V)
    training = Settings(training={"lr_y": 1.0, "lr_z": 1.0}, theory_classes=None)
    per_class = 1e-5
    monkeypatch.setattr(fit, "_gradient_seconds", lambda pop, s: per_class * pop.num_classes**2)
    most = gradients_at_most(40, 3)
    limit = per_class * 16**2 * most  # 16 classes fit, more do not
    cut = fit.theory_fit(traj, stats, settings=training.replace(theory_seconds=limit))
    said = capsys.readouterr().out
    n = int(cut.table["fit_classes"].iloc[0])
    assert fit.MIN_FIT_CLASSES <= n <= 16, n
    assert f" of {traj.plan.num_classes:,} classes (theory_seconds=" in said
    assert cut.table.attrs["fit_seconds"]["estimate"] <= limit
    every = fit.theory_fit(traj, stats, settings=training.replace(theory_seconds=None),
                           progress=False)  # fmt: skip
    assert (every.table["fit_classes"] == traj.plan.num_classes).all()
    assert every.table.attrs["fit_seconds"]["estimate"] is None
    zero = fit.theory_fit(traj, stats, settings=training.replace(theory_seconds=0),
                          progress=False)  # fmt: skip
    assert zero.table.attrs["fit_seconds"]["estimate"] is None  # 0: no limit, as the CLI's
    with pytest.raises(ValueError, match="theory_seconds must be >= 0"):
        training.replace(theory_seconds=-1)


def test_the_fit_takes_first_the_classes_it_can_rank():
    """With token groups, the most frequent classes with two or more tracked distinct tokens
    come first (a class without them only feeds the population): the lab's groups with the
    most frequent classes cut to one distinct token, against a brute-force count."""
    import dataclasses

    from scansnap_lens.lab.synthetic import sequence_classes
    from scansnap_lens.measures.fit import fit_classes

    classes = sequence_classes(num_queries=3, next_per_query=4)
    traj = train_yz(classes, lr_z=[1.0], ratio=[2.0], seeds=[0], num_steps=20,
                    population=True, snapshot_every=10).to_trajectory()  # fmt: skip
    groups = TokenGroups.from_synthetic(classes)
    plan = traj.plan
    frequent = torch.argsort(groups.events, descending=True)[: groups.num_classes // 3].tolist()
    cut = dataclasses.replace(
        groups,
        distinct=[d[:1] if k in frequent else d for k, d in enumerate(groups.distinct)],
        distinct_p=[p[:1] if k in frequent else p for k, p in enumerate(groups.distinct_p)],
    )  # fmt: skip
    ranked = []
    for c in range(plan.num_classes):
        m, n = int(plan.class_query[c]), int(plan.class_next[c])
        tracked = plan.triple_token[plan.triple_class == c]
        k = [i for i in range(cut.num_classes)
             if int(cut.query[i]) == m and int(cut.next_token[i]) == n]  # fmt: skip
        if k and torch.isin(tracked, cut.distinct[k[0]]).sum() >= 2:
            ranked.append((m, n))
    assert 2 <= len(ranked) < plan.num_classes, len(ranked)
    chosen = fit_classes(traj, len(ranked), cut)
    assert sorted(chosen) == sorted(ranked)
    assert set(ranked) < set(fit_classes(traj, len(ranked) + 1, cut))
    assert sorted(fit_classes(traj, len(ranked))) != sorted(ranked)  # by events alone: others
