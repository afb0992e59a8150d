"""Checkpoint sources: corrupt, truncated and pickled files in a folder; pretrained labels
through the hub cache offline, on both backends."""

from __future__ import annotations

import pytest
import torch
from _reference import assert_matches, brute_force
from _runs import V, native
from _tiny import QUIET

from scansnap_lens.lab.synthetic import syn_small
from scansnap_lens.models import checkpoints
from scansnap_lens.models.formats import CheckpointError, load_state_dict
from scansnap_lens.recording.aggregates import CheckpointRecord
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.trajectory import Trajectory

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


def test_corrupt_truncated_and_pickled_checkpoints(trained, tmp_path):
    out, _, tokens = trained
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "config.json").write_text((out / "config.json").read_text())
    good = load_state_dict(out / "step_000000030.safetensors")
    data = (out / "step_000000005.safetensors").read_bytes()
    (folder / "step_000000005.safetensors").write_bytes(data[: len(data) // 2])
    torch.save(good, folder / "model_10.pt")
    (folder / "checkpoint-20").mkdir()
    (folder / "checkpoint-20" / "model.safetensors").write_bytes(
        (out / "step_000000020.safetensors").read_bytes()
    )
    torch.save({"state_dict": good, "note": object()}, folder / "model_30.pt")
    source = checkpoints.folder(folder)
    assert source.steps == [5, 10, 20, 30]

    with pytest.raises(CheckpointError, match=r"step_000000005\.safetensors.*corrupt or truncated"):
        source.checkpoints[0].load()
    with pytest.raises(CheckpointError, match=r"model_30\.pt.*pickled Python objects"):
        source.checkpoints[3].load()
    trusted = checkpoints.folder(folder, trust_pickle=True).checkpoints[3].load()
    torch.testing.assert_close(
        native(trusted.state_dict())["blocks.0.attn.q.weight"],
        native(good)["blocks.0.attn.q.weight"],
    )

    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    with pytest.raises(CheckpointError, match="step_000000005"):
        Recorder(tmp_path / "t1", tokens, QUIET, plan=plan).record(source)
    skip = QUIET.replace(on_error="skip")
    traj = Recorder(tmp_path / "t2", tokens, skip, plan=plan).record(source)
    assert traj.steps.tolist() == [10, 20]
    assert [s["step"] for s in traj.skipped] == [5, 30]
    assert "model_30.pt" in traj.skipped[1]["source"]
    assert Trajectory.load(tmp_path / "t2").skipped == traj.skipped


def test_pretrained_labels_offline_hooked_and_bridge_agree(fake_hub, tmp_path):
    tokens = torch.randint(1, 64, (4, 12), generator=torch.Generator().manual_seed(0))
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 1000, 2000])
    assert source.step_unit == "steps" and source.steps == [0, 1000, 2000]
    plan = plan_recording(tokens, 64)
    hooked = Recorder(tmp_path / "h", tokens, QUIET, plan=plan).record(source)
    bridge = Recorder(tmp_path / "b", tokens, QUIET, plan=plan).record(
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 1000, 2000], backend="bridge")
    )
    torch.testing.assert_close(hooked.zbar.full(), bridge.zbar.full(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(hooked.c_hat.full(), bridge.c_hat.full(), atol=1e-5, rtol=1e-4)
    # distinct revisions really are different weights
    assert not torch.allclose(hooked.zbar[0], hooked.zbar[1])
    with pytest.raises(ValueError, match="not available"):
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[1500])


def test_pythia_labels_through_the_bridge(fake_hub, tmp_path):
    tokens = torch.randint(1, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    plan = plan_recording(tokens, 64, queries=0.5)
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps="log:2", backend="bridge")
    assert source.steps == [0, 143000]
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 2000], backend="bridge")
    traj = Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(source)
    assert traj.steps.tolist() == [0, 2000]
    model = source.checkpoints[-1].load()
    ref = brute_force(model, tokens, queries=set(plan.queries.tolist()))
    last = traj.select(steps=[2000])
    rec = CheckpointRecord(2000, {k: torch.as_tensor(v[0]) for k, v in last.values.items()})
    assert_matches(rec, plan, ref, range(2), range(4))


def test_a_nanogpt_checkpoint_that_weights_only_refuses_is_named(tmp_path):
    """A ckpt.pt holding pickled objects beyond tensors is refused by name (was: passed over,
    then "no checkpoint files in ...")."""
    torch.save({"model": {}, "iter_num": 5, "config": object()}, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"ckpt\.pt: holds pickled Python objects"):
        checkpoints.folder(tmp_path)
