"""Checkpoint sources, training with two rates, and resumable trajectories."""

from __future__ import annotations

import json

import pytest
import torch
from _backends import BACKENDS

from scansnap_lens.lab.synthetic import syn_small
from scansnap_lens.models import checkpoints
from scansnap_lens.models.backend import state_layout, tl_to_native
from scansnap_lens.models.checkpoints import CheckpointError, load_state_dict
from scansnap_lens.models.training import attention_only_model, train
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder, record_trajectory
from scansnap_lens.recording.trajectory import Trajectory

V = 34


def native(state):
    """Weights in the native bridge's names, whichever backend wrote them."""
    return tl_to_native(state) if state_layout(state) == "tl" else dict(state)


def syn_data(batch_size, generator, seq_len=16):
    """Syn-Small sequences with the next token appended: context..., query, next."""
    classes = syn_small()
    tokens, labels, _ = classes.sample(batch_size, seq_len, generator)
    return torch.cat([tokens, labels[:, None]], 1)


def train_run(**kwargs):
    """The run every test here shares: 30 SGD steps, checkpoints at 0, 5, 10, 20, 30."""
    model = attention_only_model(V, d_model=32, n_heads=2, n_ctx=32, seed=0)
    result = train(
        model,
        syn_data,
        steps=30,
        lr_y=0.5,
        lr_z=0.5,
        momentum=0.9,
        batch_size=32,
        checkpoints=[0, 5, 10, 20, 30],
        loss_on="last",
        progress=False,
        **kwargs,
    )
    return model, result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    _, result = train_run(out=out)
    eval_tokens = syn_data(8, torch.Generator().manual_seed(7))
    return out, result, eval_tokens


def test_train_saves_global_steps_and_learns(trained):
    out, result, _ = trained
    names = sorted(p.name for p in out.glob("step_*.safetensors"))
    assert names == [f"step_{s:09d}.safetensors" for s in (0, 5, 10, 20, 30)]
    assert json.loads((out / "config.json").read_text())["config"]["d_vocab"] == V
    assert result.loss[0] > 0.5 and sum(result.loss[-5:]) / 5 < 0.5 * result.loss[0]
    first = native(load_state_dict(out / names[0]))
    last = native(load_state_dict(out / names[-1]))
    assert torch.count_nonzero(last["pos_embed.weight"]) == 0  # no positional information
    assert not torch.equal(first["blocks.0.attn.q.weight"], last["blocks.0.attn.q.weight"])


def test_two_learning_rates_are_separate():
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
    before = native({k: v.clone() for k, v in model.state_dict().items()})
    train(model, syn_data, steps=3, lr_y=0.5, lr_z=0.0, checkpoints=[], progress=False)
    after = native(model.state_dict())
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.k.weight", "blocks.0.attn.q.bias"):
        assert torch.equal(before[name], after[name]), name
    for name in ("blocks.0.attn.v.weight", "embed.weight", "unembed.weight"):
        assert not torch.equal(before[name], after[name]), name


def test_former_rate_names_train_the_same_with_a_warning(tmp_path):
    """lr= / lr_attention= (before lr_y / lr_z) still work, warn, and write the new names."""
    runs = []
    for i, names in enumerate(({"lr_y": 0.5, "lr_z": 2.0}, {"lr": 0.5, "lr_attention": 2.0})):
        model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
        if "lr" in names:
            with pytest.warns(DeprecationWarning) as caught:
                train(model, syn_data, steps=3, out=tmp_path / str(i), checkpoints=[],
                      progress=False, **names)  # fmt: skip
            said = {str(w.message) for w in caught}
            assert {"lr= is now lr_y=", "lr_attention= is now lr_z="} <= said
        else:
            train(model, syn_data, steps=3, out=tmp_path / str(i), checkpoints=[],
                  progress=False, **names)  # fmt: skip
        runs.append((native(model.state_dict()), (tmp_path / str(i) / "training.json").read_text()))
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])
    assert runs[0][1] == runs[1][1] and '"lr_z": 2.0' in runs[0][1]
    with pytest.raises(TypeError, match="not both lr_y and lr"):
        train(attention_only_model(V, d_model=16, n_ctx=32), syn_data, steps=1, lr_y=1, lr=1)


def test_folder_source_records_and_resumes(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    source = checkpoints.folder(out)
    assert source.steps == [0, 5, 10, 20, 30]
    full = Recorder(tmp_path / "full", tokens, plan, progress=False).record(source)
    assert full.steps.tolist() == [0, 5, 10, 20, 30]
    assert full.zbar.shape == (5, 1, 2, plan.num_pairs)

    # Interrupt after two checkpoints, then resume: finished steps are not loaded again.
    loads = []

    class Interrupt(Exception):
        pass

    def wrapped(source, stop_after=None):
        for c in source.checkpoints:

            def load(c=c, inner=c.loader):
                if stop_after is not None and len(loads) == stop_after:
                    raise Interrupt
                loads.append(c.step)
                return inner()

            c.loader = load
        return source

    with pytest.raises(Interrupt):
        Recorder(tmp_path / "resumed", tokens, plan, progress=False).record(
            wrapped(checkpoints.folder(out), stop_after=2)
        )
    assert Trajectory.load(tmp_path / "resumed").steps.tolist() == [0, 5]
    loads.clear()
    resumed = Recorder(tmp_path / "resumed", tokens, plan, progress=False).record(
        wrapped(checkpoints.folder(out))
    )
    assert loads == [10, 20, 30]
    for name in ("zbar", "chat", "entropy", "query_entropy"):
        assert torch.equal(getattr(resumed, name), getattr(full, name))

    other = plan_recording(tokens, V)
    with pytest.raises(ValueError, match="another plan"):
        Recorder(tmp_path / "full", tokens, other, progress=False).record(source)


def test_callback_and_memory_sources_match_folder(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    folder_traj = Recorder(tmp_path / "a", tokens, plan, progress=False).record(
        checkpoints.folder(out)
    )
    # Recording inside the training loop, without saving weights, sees the same models.
    recorder = Recorder(tmp_path / "b", tokens, plan, progress=False)
    model, _ = train_run(on_checkpoint=recorder.on_checkpoint)
    callback_traj = recorder.trajectory()
    torch.testing.assert_close(callback_traj.zbar, folder_traj.zbar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(callback_traj.chat, folder_traj.chat, atol=1e-6, rtol=1e-5)
    mem = record_trajectory(
        checkpoints.in_memory({30: model}), tokens, tmp_path / "c", plan=plan, progress=False
    )
    torch.testing.assert_close(mem.zbar[0], folder_traj.zbar[-1], atol=1e-5, rtol=1e-5)


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
    with pytest.raises(CheckpointError, match=r"model_30\.pt.*pickled payload"):
        source.checkpoints[3].load()
    trusted = checkpoints.folder(folder, trust_pickle=True).checkpoints[3].load()
    torch.testing.assert_close(
        native(trusted.state_dict())["blocks.0.attn.q.weight"],
        native(good)["blocks.0.attn.q.weight"],
    )

    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    with pytest.raises(CheckpointError, match="step_000000005"):
        Recorder(tmp_path / "t1", tokens, plan, progress=False).record(source)
    traj = Recorder(tmp_path / "t2", tokens, plan, progress=False).record(source, on_error="skip")
    assert traj.steps.tolist() == [10, 20]
    assert [s["step"] for s in traj.skipped] == [5, 30]
    assert "model_30.pt" in traj.skipped[1]["source"]
    assert Trajectory.load(tmp_path / "t2").skipped == traj.skipped


def test_trajectory_save_load_select_dataframe(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    traj = Recorder(tmp_path / "t", tokens, plan, progress=False).record(checkpoints.folder(out))
    copy = Trajectory.load(traj.save(tmp_path / "copy"))
    assert torch.equal(copy.chat, traj.chat) and copy.plan.same_as(traj.plan)
    q = int(plan.queries[0])
    sub = traj.select(steps=[5, 30], heads=[1], queries=[q])
    assert sub.steps.tolist() == [5, 30] and sub.heads == [1]
    assert set(sub.plan.class_query.tolist()) == {q}
    frame = sub.to_dataframe()
    assert set(frame["query"]) == {q}
    row = frame[(frame.step == 30)].iloc[0]
    j = int(
        (
            (traj.plan.class_query[traj.plan.triple_class] == row["query"])
            & (traj.plan.class_next[traj.plan.triple_class] == row["next"])
            & (traj.plan.triple_token == row["token"])
        ).nonzero()[0]
    )
    assert row["chat"] == pytest.approx(float(traj.chat[-1, 0, 1, j]))
    # chat of each (step, class) sums to one
    sums = frame.groupby(["step", "query", "next"])["chat"].sum()
    assert sums.to_numpy() == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(KeyError, match="steps"):
        traj.select(steps=[7])


def test_prompt_attention_kept_per_checkpoint(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    source = checkpoints.folder(out)
    traj = Recorder(tmp_path / "t", tokens, plan, prompt_length=10, progress=False).record(source)
    assert torch.equal(traj.prompt, tokens[0, :10])
    assert traj.prompt_pattern.shape == (5, 1, 2, 10, 10)
    # the kept weights are the model's own hook_pattern, checkpoint by checkpoint
    model = source.checkpoints[3].load()
    _, cache = model.run_with_cache(tokens[:1, :10])
    torch.testing.assert_close(traj.prompt_pattern[3, 0], cache["pattern", 0][0])
    # they survive save, load and select, and a resume with another prompt is refused
    copy = Trajectory.load(traj.save(tmp_path / "copy"))
    assert torch.equal(copy.prompt_pattern, traj.prompt_pattern)
    sub = copy.select(steps=[10, 30], heads=[1])
    assert torch.equal(sub.prompt_pattern, traj.prompt_pattern[[2, 4]][:, :, [1]])
    with pytest.raises(ValueError, match="another example prompt"):
        Recorder(tmp_path / "t", tokens, plan, prompt=tokens[1, :10], progress=False)
    # a plain resume keeps the recorded prompt
    assert torch.equal(Recorder(tmp_path / "t", tokens, plan, progress=False).prompt, traj.prompt)


def test_pretrained_labels_offline_hooked_and_bridge_agree(fake_hub, tmp_path):
    tokens = torch.randint(1, 64, (4, 12), generator=torch.Generator().manual_seed(0))
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 1000, 2000])
    assert source.step_unit == "steps" and source.steps == [0, 1000, 2000]
    plan = plan_recording(tokens, 64)
    hooked = Recorder(tmp_path / "h", tokens, plan, progress=False).record(source)
    bridge = Recorder(tmp_path / "b", tokens, plan, progress=False).record(
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 1000, 2000], backend="bridge")
    )
    torch.testing.assert_close(hooked.zbar, bridge.zbar, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(hooked.chat, bridge.chat, atol=1e-5, rtol=1e-4)
    # distinct revisions really are different weights
    assert not torch.allclose(hooked.zbar[0], hooked.zbar[1])
    with pytest.raises(ValueError, match="not available"):
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[1500])


def test_train_on_a_datasets_dataset(tmp_path):
    import datasets

    rows = syn_data(64, torch.Generator().manual_seed(3))
    ds = datasets.Dataset.from_dict({"input_ids": rows.tolist()})
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=2)
    result = train(
        model, ds, steps=20, out=tmp_path, lr_y=0.5, checkpoints=10, loss_on="last", progress=False
    )
    assert sorted(result.checkpoints) == [0, 10, 20]
    assert result.to_dataframe()["loss"].iloc[-1] < result.loss[0]
    with pytest.raises(ValueError, match="non-empty"):
        train(model, torch.empty(0, 5, dtype=torch.long), steps=1, progress=False)


def test_trajectory_files_that_cannot_be_read(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    with pytest.raises(FileNotFoundError, match=r"manifest\.json is missing"):
        Trajectory.load(tmp_path)
    Recorder(tmp_path / "t", tokens, plan, progress=False).record(checkpoints.folder(out))
    first = sorted((tmp_path / "t" / "checkpoints").iterdir())[0]
    first.write_bytes(first.read_bytes()[:40])
    with pytest.raises(ValueError, match=f"{first.name}.*corrupt or truncated"):
        Trajectory.load(tmp_path / "t")
    (tmp_path / "t" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt manifest"):
        Trajectory.load(tmp_path / "t")


def test_gradient_clipping_bounds_each_step():
    """One SGD step with clipping moves the weights by exactly lr * clip (global norm), when
    the unclipped gradient is larger."""
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    train(model, syn_data, steps=1, lr_y=0.5, clip_grad_norm=1e-3, checkpoints=[],
          progress=False)  # fmt: skip
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    moved = torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in zip(after, before)))
    # float32 weights of size ~1 hold the step to ~1e-7 absolute per entry: rtol 1e-3
    assert moved.item() == pytest.approx(0.5 * 1e-3, rel=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rates_by_parameter_name(backend):
    """Patterns match the state-dict keys (the names checkpoints are saved under)."""
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1, backend=backend)
    before = native({k: v.clone() for k, v in model.state_dict().items()})
    train(model, syn_data, steps=3, lr_y=0.5, lr_by_name={"unembed": 0.0}, checkpoints=[],
          progress=False)  # fmt: skip
    after = native(model.state_dict())
    assert torch.equal(before["unembed.weight"], after["unembed.weight"])  # its own rate: 0
    assert not torch.equal(before["embed.weight"], after["embed.weight"])
    with pytest.raises(ValueError, match=r"no parameter name matches \['mlp\\\\.W_in'\]"):
        train(model, syn_data, steps=1, lr_by_name={r"mlp\.W_in": 10.0}, progress=False)


def test_bptt_reads_a_stream_in_contiguous_columns(tmp_path):
    """The tutorial's batchify + get_batch: column i is the i-th contiguous part of the
    stream; each step the next bptt positions (windows share their boundary token); an epoch
    ends and the reading starts again."""
    from scansnap_lens.models.training import _stream_batches

    stream = torch.arange(103)
    sample = _stream_batches(stream, batch_size=4, bptt=5)  # 25 positions per column
    batches = [sample() for _ in range(6)]
    assert batches[0].tolist() == [list(range(c * 25, c * 25 + 6)) for c in range(4)]
    assert batches[1][:, 0].tolist() == batches[0][:, -1].tolist()  # contiguous
    assert [b[0, 0].item() for b in batches] == [0, 5, 10, 15, 0, 5]  # 4 windows an epoch
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
    result = train(model, torch.randint(0, V, (500,)), steps=8, bptt=10, batch_size=4,
                   out=tmp_path, checkpoints=[], progress=False)  # fmt: skip
    assert len(result.loss) == 8
    assert json.loads((tmp_path / "training.json").read_text())["bptt"] == 10
    with pytest.raises(ValueError, match="fewer than bptt"):
        train(model, torch.arange(20), steps=1, bptt=10, batch_size=4, progress=False)
