"""The paper's claims, measured: scan and snap on the Y/Z lab and on a trained
TransformerLens model; every measurement as [step, layer, head] tensors."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import QUIET

from scansnap_lens import measures
from scansnap_lens.statistics.groups import TokenGroups


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
        num_steps=100,
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
        num_steps=60,
        progress=False,
    )
    traj, g = run.to_trajectory(), TokenGroups.from_synthetic(classes)
    assert (measures.discriminative_bias(traj, g).final()["bias"] > 0).all()
    assert (measures.frequency_bias(traj, g).final()["spearman"] > 0.5).all()
    entropy = measures.sparsity(traj, g).final().set_index("head")["entropy"]
    assert entropy[1] < entropy[0]  # larger eta_Z, sparser


# ------------------------------------------------------------------ a real model (item 3)
@pytest.mark.tl
def test_trained_transformer_scans_and_snaps(tmp_path):
    from scansnap_lens.lab.synthetic import syn_medium
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.kinds import token_kinds

    classes = syn_medium(1)
    M = classes.vocab_size

    def data(batch_size, generator, seq_len=32):
        tokens, labels, _ = classes.sample(batch_size, seq_len, generator)
        return torch.cat([tokens, labels[:, None]], 1)

    # classes from the training corpus, not from the synthetic truth
    corpus = data(512, torch.Generator().manual_seed(123))
    stats = cooccurrence(corpus, M, queries=classes.query.tolist())
    found = TokenGroups.from_kinds(token_kinds(stats, scope="global"), stats)
    assert (
        TokenGroups.from_kinds(
            token_kinds(stats, scope="global"), stats, min_distinct=1
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
        tmp_path / "traj", eval_tokens, QUIET, plan=plan, meta={"lr_y": 0.1, "lr_z": 3.0}
    )
    train(
        model,
        data,
        num_steps=250,
        lr_y=0.1,
        lr_z=3.0,
        batch_size=64,
        save_steps="log:15",
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
