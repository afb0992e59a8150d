"""Measurements on hand-built trajectories with answers known by hand, and the paper's claims
on the Y/Z lab and on a trained TransformerLens model."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from scansnap_lens import measures
from scansnap_lens.recording.plan import RecordPlan
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

V = 10


def hand_trajectory(steps, zbar: dict, chat: dict, heads=1) -> Trajectory:
    """zbar {(m, l): [value per step]}, chat {(m, n): {l: [value per step]}}; one layer."""
    pairs = sorted(zbar)
    classes = sorted(chat)
    triples = [(c, l) for c, key in enumerate(classes) for l in sorted(chat[key])]
    queries = sorted({m for m, _ in pairs} | {m for m, _ in classes})
    plan = RecordPlan(
        vocab_size=V,
        exclude_bos=False,
        include_self=False,
        fingerprint=0,
        queries=torch.tensor(queries),
        query_events=torch.ones(len(queries), dtype=torch.long),
        class_query=torch.tensor([m for m, _ in classes]),
        class_next=torch.tensor([n for _, n in classes]),
        class_events=torch.ones(len(classes), dtype=torch.long),
        pair_query=torch.tensor([m for m, _ in pairs]),
        pair_token=torch.tensor([l for _, l in pairs]),
        pair_count=torch.ones(len(pairs), dtype=torch.long),
        triple_class=torch.tensor([c for c, _ in triples], dtype=torch.long),
        triple_token=torch.tensor([l for _, l in triples], dtype=torch.long),
        triple_count=torch.ones(len(triples), dtype=torch.long),
    )
    S = len(steps)
    z = torch.tensor([zbar[p] for p in pairs], dtype=torch.float32).T  # [S, Pz]
    c = torch.tensor([chat[classes[ci]][l] for ci, l in triples], dtype=torch.float32).T
    return Trajectory(
        plan,
        torch.tensor(steps),
        [0],
        list(range(heads)),
        zbar=z[:, None, None].expand(S, 1, heads, -1).clone(),
        chat=c[:, None, None].expand(S, 1, heads, -1).clone(),
        entropy=torch.zeros(S, 1, heads, len(classes)),
        query_entropy=torch.zeros(S, 1, heads, len(queries)),
    )


def groups(distinct: dict, common: dict, events=None) -> TokenGroups:
    """distinct {(m, n): {l: P(l|m,n)}}, common {m: [l]}."""
    keys = sorted(distinct)
    return TokenGroups(
        query=torch.tensor([m for m, _ in keys]),
        next_token=torch.tensor([n for _, n in keys]),
        events=torch.tensor(events or [1] * len(keys)),
        distinct=[torch.tensor(sorted(distinct[k]), dtype=torch.long) for k in keys],
        distinct_p=[
            torch.tensor([distinct[k][l] for l in sorted(distinct[k])], dtype=torch.float64)
            for k in keys
        ],
        common={m: torch.tensor(v, dtype=torch.long) for m, v in common.items()},
    )


def test_trajectory_logits_and_attention_of_given_tokens():
    """The public accessors read the slots the plan holds: values where held, NaN (logits) or
    0 (attention) where a token never met the query, KeyError for an untracked class."""
    traj = hand_trajectory(
        [0, 10],
        {(0, 1): [0.5, 1.5], (0, 3): [1.0, 0.0], (2, 1): [7.0, 8.0]},
        {(0, 5): {1: [0.25, 0.75], 3: [0.75, 0.25]}},
        heads=2,
    )
    z = traj.logits(0, [3, 2, 1])
    assert z.shape == (2, 1, 2, 3) and z.dtype == torch.float64
    assert z[:, 0, 1, 0].tolist() == [1.0, 0.0] and z[:, 0, 0, 2].tolist() == [0.5, 1.5]
    assert z[..., 1].isnan().all()
    assert traj.logits(2, torch.tensor([1]))[:, 0, 0, 0].tolist() == [7.0, 8.0]
    a = traj.attention(0, 5, [1, 4, 3])
    assert a[:, 0, 0].tolist() == [[0.25, 0.0, 0.75], [0.75, 0.0, 0.25]]
    with pytest.raises(KeyError, match="query 0, next token 6"):
        traj.attention(0, 6, [1])
    assert traj.plan.pair_slot(0, [1, 2, 3]).tolist() == [0, -1, 1]
    assert traj.plan.class_slot(0, 5) == 0 and traj.plan.class_slot(2, 5) is None


def test_rates_under_other_names_warn_instead_of_predicting_nothing_silently():
    traj = hand_trajectory([0, 10], {(0, 1): [0.0, 1.0]}, {(0, 5): {1: [1.0, 1.0]}})
    traj.meta = {"eta_y": 0.1, "eta_z": 3.0}
    with pytest.warns(UserWarning, match=r"\['eta_y', 'eta_z'\] but not lr_y and lr_z"):
        assert measures.predicted_snap(traj) is None
    traj.meta = {"lr_y": 0.1, "lr_z": 3.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measures.predicted_snap(traj)[0] > 0
    traj.meta = {"model": "pythia"}  # a pretrained model: no rates, nothing to warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measures.predicted_snap(traj) is None


def test_discriminative_bias_by_hand_with_ties():
    traj = hand_trajectory(
        [0, 10],
        {(0, 1): [0.5, 1.5], (0, 2): [0.0, 3.0], (0, 3): [1.0, 0.0], (0, 4): [2.0, 2.0]},
        {(0, 5): {1: [0.25, 0.25], 2: [0.25, 0.25], 3: [0.25, 0.25], 4: [0.25, 0.25]}},
    )
    g = groups({(0, 5): {1: 0.5, 2: 0.5}}, {0: [3, 4]})
    table = measures.discriminative_bias(traj, g).table
    # dz distinct = {1, 3}, common = {-1, 0}: bias = 2 - (-0.5) = 2.5, every pair ordered
    assert table["bias"].tolist() == pytest.approx([0.0, 2.5])
    assert table["auroc"].tolist() == pytest.approx([0.5, 1.0])
    # a tie: distinct dz {0, 1} against common dz {0} -> (0.5 + 1) / 2
    traj.zbar[1, 0, 0, 1] = traj.zbar[0, 0, 0, 1]  # pair (0, 2) frozen
    traj.zbar[1, 0, 0, 0] = traj.zbar[0, 0, 0, 0] + 1
    g_tie = groups({(0, 5): {1: 0.5, 2: 0.5}}, {0: [4]})
    assert measures.discriminative_bias(traj, g_tie).final()["auroc"].item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="both distinct and common"):
        measures.discriminative_bias(traj, groups({(0, 5): {1: 0.5}}, {}))


def test_frequency_bias_spearman_weighting_and_single_token_class():
    traj = hand_trajectory(
        [0, 5],
        {
            (0, 1): [0, 1],
            (0, 2): [0, 3],
            (0, 3): [0, 2],
            (1, 4): [0, 2],
            (1, 5): [0, 1],
            (2, 6): [0, 4],
        },
        {
            (0, 7): {1: [1 / 3] * 2, 2: [1 / 3] * 2, 3: [1 / 3] * 2},
            (1, 8): {4: [0.5] * 2, 5: [0.5] * 2},
            (2, 9): {6: [1.0] * 2},
        },
    )
    g = groups(
        {(0, 7): {1: 0.1, 2: 0.2, 3: 0.7}, (1, 8): {4: 0.3, 5: 0.7}, (2, 9): {6: 1.0}},
        {},
        events=[1, 3, 5],
    )
    result = measures.frequency_bias(traj, g)
    final = result.final()
    # class (0, 7): ranks dz (1, 3, 2) vs P (1, 2, 3) -> rho = 0.5; class (1, 8): rho = -1;
    # class (2, 9) has one distinct token and is left out; weights N = 1 and 3.
    assert final["spearman"].item() == pytest.approx((0.5 * 1 - 1.0 * 3) / 4)
    assert final["spearman_classes"].item() == 2
    assert math.isnan(result.table["spearman"].iloc[0])  # dz is flat at the first step


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
    from scansnap_lens.report import write_report

    report = write_report(traj, g, tmp_path / "r", views=False)
    assert report.not_measured["entropy, top_share"] == measures.SINGLE_DISTINCT


def test_growth_deviation_by_hand():
    # P = (0.6, 0.3); z_l0 rises by ln 2, z_l stays: r(1) = (0.6*2/0.3)^2 - 1 = 15,
    # r(0) chi = ((0.6/0.3)^2 - 1) * 4 = 12 -> deviation 3/12.
    traj = hand_trajectory(
        [0, 1],
        {(0, 1): [0.0, math.log(2)], (0, 2): [0.0, 0.0]},
        {(0, 5): {1: [0.6, 0.75], 2: [0.4, 0.25]}},
    )
    g = groups({(0, 5): {1: 0.6, 2: 0.3}}, {})
    table = measures.growth_factor(traj, g).table
    assert table["chi_l0"].tolist() == pytest.approx([1.0, 4.0])
    assert table["max_deviation"].tolist() == pytest.approx([0.0, 0.25], abs=1e-6)


def test_snap_steps_frozen_settling_and_never_settling():
    steps = torch.tensor([0, 1, 3, 7, 15, 31])
    frozen = torch.zeros(5)
    path, rate = measures.snap_steps(steps, frozen)
    assert math.isnan(path) and math.isnan(rate)
    # equal movement per unit of log-step: the rate never falls, so it never settles
    steady = torch.full((5,), 0.1)
    path, rate = measures.snap_steps(steps, steady)
    assert path.item() == 31.0 and math.isnan(rate)
    settling = torch.tensor([0.4, 0.4, 0.1, 0.01, 0.0])
    path, rate = measures.snap_steps(steps, settling, fraction=0.9)
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


# ------------------------------------------------------------------ the lab (Sec. 8 claims)
@pytest.fixture(scope="module")
def lab():
    from scansnap_lens.lab.synthetic import syn_small
    from scansnap_lens.lab.yz import train_yz

    classes = syn_small()
    # heads: (eta_Z, eta_Y / eta_Z) = (1, 1), (1, 10), (2, 1)
    run = train_yz(
        classes,
        torch.tensor([1.0, 1.0, 2.0]),
        torch.tensor([1.0, 10.0, 1.0]),
        seeds=[0, 0, 0],
        steps=100,
        progress=False,
    )
    return run.to_trajectory(), TokenGroups.from_synthetic(classes)


def test_lab_scan_claims(lab):
    traj, g = lab
    bias = measures.discriminative_bias(traj, g).table
    base = bias[bias["head"] == 0]["bias"].to_numpy()
    assert base[10] > 0 and base[-1] > base[10] > base[2] >= 0  # positive and growing
    assert (measures.discriminative_bias(traj, g).final()["auroc"] > 0.95).all()
    assert (measures.frequency_bias(traj, g).final()["spearman"] > 0.8).all()
    final = measures.sparsity(traj, g).final().set_index("head")
    assert (final["top_share"] < 0.9).all()  # never winner-takes-all


def test_measurements_as_step_layer_head_tensors(lab):
    """`Measurement.tensor` puts every table row at [step, layer, head] (snap steps at
    [layer, head]), the layout a notebook indexes."""
    traj, g = lab
    for result in (measures.discriminative_bias(traj, g), measures.sparsity(traj, g)):
        tensors = result.tensors()
        steps = traj.steps.tolist()
        for _, row in result.table.iterrows():
            for column, values in tensors.items():
                assert values.shape == (traj.num_steps, 1, 3)
                got = values[steps.index(row["step"]), int(row["layer"]), int(row["head"])].item()
                want = row[column]
                assert got == want or (math.isnan(got) and math.isnan(want)), column
    snaps = measures.snapping(traj)
    assert torch.equal(snaps.tensor("snap_step")[0], torch.tensor(snaps.table["snap_step"]))
    assert torch.equal(result.tensor(), result.tensor(result.table.columns[3]))
    with pytest.raises(KeyError, match="no column 'bais'"):
        result.tensor("bais")


def test_lab_snap_claims(lab):
    traj, g = lab
    summary = measures.summarize(traj, g).set_index("head")
    # larger eta_Y: earlier snap and denser attention; larger eta_Z: sparser attention
    assert summary.loc[1, "snap_path"] < summary.loc[0, "snap_path"]
    assert summary.loc[1, "entropy"] > summary.loc[0, "entropy"]
    assert summary.loc[2, "entropy"] < summary.loc[0, "entropy"]
    # the theory's t0 scales as 1 / eta_Y
    assert summary.loc[0, "predicted_snap"] == pytest.approx(10 * summary.loc[1, "predicted_snap"])


def test_lab_syn_medium_bias_and_entropy():
    from scansnap_lens.lab.synthetic import syn_medium
    from scansnap_lens.lab.yz import train_yz

    classes = syn_medium(3)
    run = train_yz(
        classes,
        torch.tensor([1.0, 3.0]),
        torch.tensor([2.0, 2.0]),
        seeds=[1, 1],
        steps=60,
        progress=False,
    )
    traj, g = run.to_trajectory(), TokenGroups.from_synthetic(classes)
    assert (measures.discriminative_bias(traj, g).final()["bias"] > 0).all()
    assert (measures.frequency_bias(traj, g).final()["spearman"] > 0.5).all()
    entropy = measures.sparsity(traj, g).final().set_index("head")["entropy"]
    assert entropy[1] < entropy[0]  # larger eta_Z, sparser


# ------------------------------------------------------------------ a real model (item 3)
def test_trained_transformer_scans_and_snaps(tmp_path):
    from scansnap_lens.lab.synthetic import syn_medium
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.statistics.classification import classify
    from scansnap_lens.statistics.corpus import cooccurrence

    classes = syn_medium(1)
    M = classes.vocab_size

    def data(batch_size, generator, seq_len=32):
        tokens, labels, _ = classes.sample(batch_size, seq_len, generator)
        return torch.cat([tokens, labels[:, None]], 1)

    # classes from the training corpus, not from the synthetic truth
    corpus = data(512, torch.Generator().manual_seed(123))
    stats = cooccurrence(corpus, M, queries=classes.query.tolist())
    found = TokenGroups.from_classification(classify(stats, scope="global"), stats)
    assert (
        TokenGroups.from_classification(
            classify(stats, scope="global"), stats, min_distinct=1
        ).num_classes
        == classes.num_classes
    )
    truth = TokenGroups.from_synthetic(classes)
    one_call = TokenGroups.from_statistics(stats, scope="global")  # the same, in one call
    assert torch.equal(one_call.query, found.query) and one_call.context == found.context
    for k in range(classes.num_classes):
        assert found.distinct[k].tolist() == truth.distinct[k].tolist()
        assert torch.equal(one_call.distinct_p[k], found.distinct_p[k])
    assert (
        found.common[int(classes.query[0])].tolist() == truth.common[int(classes.query[0])].tolist()
    )

    eval_tokens = data(64, torch.Generator().manual_seed(7))
    plan = plan_recording(eval_tokens, M, queries=classes.query.tolist(), exclude_bos=False)
    model = attention_only_model(
        M, d_model=32, n_heads=1, n_ctx=64, seed=0, normalization_type=None
    )
    recorder = Recorder(
        tmp_path / "traj", eval_tokens, plan, progress=False, meta={"lr": 0.1, "lr_attention": 3.0}
    )
    train(
        model,
        data,
        steps=250,
        lr_y=0.1,
        lr_z=3.0,
        batch_size=64,
        checkpoints="log:15",
        loss_on="last",
        progress=False,
        on_checkpoint=recorder.on_checkpoint,
    )
    traj = recorder.trajectory()
    summary = measures.summarize(traj, found).iloc[0]
    assert summary["bias"] > 0.5 and summary["auroc"] > 0.8
    assert summary["spearman"] > 0.2
    assert summary["snap_path"] <= 250 and summary["snap_path"] > 0
    sparsity = measures.sparsity(traj, found).table
    assert sparsity["distinct_mass"].iloc[-1] > 0.8 > sparsity["distinct_mass"].iloc[0]
