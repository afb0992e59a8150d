"""Training with the paper's two rates: global steps, separate rates, clipping, bptt
batches, rates by parameter name, the rates written beside the checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from _backends import BACKENDS
from _runs import V, native, syn_data
from _tiny import QUIET

from scansnap_lens import measures
from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.models import checkpoints
from scansnap_lens.models.formats import load_state_dict
from scansnap_lens.models.training import attention_only_model, train
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


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
    train(model, syn_data, num_steps=3, lr_y=0.5, lr_z=0.0, save_steps=[], progress=False)
    after = native(model.state_dict())
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.k.weight", "blocks.0.attn.q.bias"):
        assert torch.equal(before[name], after[name]), name
    for name in ("blocks.0.attn.v.weight", "embed.weight", "unembed.weight"):
        assert not torch.equal(before[name], after[name]), name


def test_train_on_a_datasets_dataset(tmp_path):
    import datasets

    rows = syn_data(64, torch.Generator().manual_seed(3))
    ds = datasets.Dataset.from_dict({"input_ids": rows.tolist()})
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=2)
    result = train(
        model,
        ds,
        num_steps=20,
        out=tmp_path,
        lr_y=0.5,
        save_steps=10,
        loss_on="last",
        progress=False,
    )
    assert sorted(result.checkpoints) == [0, 10, 20]
    assert result.to_dataframe()["loss"].iloc[-1] < result.loss[0]
    with pytest.raises(ValueError, match="non-empty"):
        train(model, torch.empty(0, 5, dtype=torch.long), num_steps=1, progress=False)


def test_gradient_clipping_bounds_each_step():
    """One SGD step with clipping moves the weights by exactly lr * clip (global norm), when
    the unclipped gradient is larger."""
    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    train(model, syn_data, num_steps=1, lr_y=0.5, clip_grad_norm=1e-3, save_steps=[],
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
    train(model, syn_data, num_steps=3, lr_y=0.5, lr_by_name={"unembed": 0.0}, save_steps=[],
          progress=False)  # fmt: skip
    after = native(model.state_dict())
    assert torch.equal(before["unembed.weight"], after["unembed.weight"])  # its own rate: 0
    assert not torch.equal(before["embed.weight"], after["embed.weight"])
    with pytest.raises(ValueError, match=r"no parameter name matches \['mlp\\\\.W_in'\]"):
        train(model, syn_data, num_steps=1, lr_by_name={r"mlp\.W_in": 10.0}, progress=False)


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
    result = train(model, torch.randint(0, V, (500,)), num_steps=8, bptt=10, batch_size=4,
                   out=tmp_path, save_steps=[], progress=False)  # fmt: skip
    assert len(result.loss) == 8
    assert json.loads((tmp_path / "training.json").read_text())["bptt"] == 10
    with pytest.raises(ValueError, match="fewer than bptt"):
        train(model, torch.arange(20), num_steps=1, bptt=10, batch_size=4, progress=False)


def test_training_writes_its_rates_into_the_trajectory(tmp_path):
    from scansnap_lens.lab.synthetic import sequence_sampler
    from scansnap_lens.models.training import attention_only_model, train

    sample = sequence_sampler(classes := syn_medium(1), seq_len=16)
    tokens = sample(8, torch.Generator().manual_seed(1))
    plan = plan_recording(tokens, classes.vocab_size)
    recorder = Recorder(tmp_path / "loop", tokens, QUIET, plan=plan)
    model = attention_only_model(classes.vocab_size, d_model=16, n_ctx=32)
    train(model, sample, num_steps=4, lr_y=0.2, lr_z=2.0, momentum=0.5, save_steps=[0, 4],
          out=tmp_path / "ckpt", on_checkpoint=recorder.on_checkpoint, progress=False)  # fmt: skip
    want = {"lr_y": 0.2, "lr_z": 2.0, "optimizer": "sgd", "momentum": 0.5}
    in_loop = recorder.trajectory()
    assert {k: in_loop.meta[k] for k in want} == want
    from_folder = Recorder(tmp_path / "folder", tokens, QUIET, plan=plan).record(
        checkpoints.folder(tmp_path / "ckpt")
    )
    assert {k: from_folder.meta[k] for k in want} == want
    assert measures.known_rates(from_folder) == [(0.4, 4.0)]  # lr / (1 - momentum)


def test_one_typed_value_for_the_rates(tmp_path):
    """`Rates` is what train writes, what a checkpoint folder's training.json must hold and
    what the report reads back: a malformed file is refused by file and field at once."""
    from scansnap_lens.models import checkpoints
    from scansnap_lens.models.formats import CheckpointError
    from scansnap_lens.models.training import Rates

    model = attention_only_model(V, d_model=16, n_heads=1, n_ctx=32, seed=1)
    train(model, syn_data, num_steps=2, lr_y=0.5, lr_z=2.0, optimizer="adam", momentum=0.9,
          out=tmp_path / "run", save_steps=[0, 2], progress=False)  # fmt: skip
    written = json.loads((tmp_path / "run" / "training.json").read_text())
    assert Rates.of_meta(written) == Rates(0.5, 2.0, "adam", 0.0)  # momentum: SGD's only
    with pytest.raises(ValueError, match=r"unknown Rates fields .*'loss_on'"):
        Rates.from_dict(written)  # a Rates value's own dict: nothing else in it
    assert checkpoints.folder(tmp_path / "run").meta["lr_z"] == 2.0
    for field, value, message in (("lr_y", "fast", "lr_y must be a finite number >= 0, got 'fast'"),
                                  ("lr_z", -3, "lr_z must be a finite number >= 0, got -3"),
                                  ("optimizer", "lion", "optimizer must be one of"),
                                  ("momentum", 1.5, "momentum must lie in")):  # fmt: skip
        (tmp_path / "run" / "training.json").write_text(json.dumps({**written, field: value}))
        with pytest.raises(CheckpointError, match=f"training.json: {message}"):
            checkpoints.folder(tmp_path / "run")
    with pytest.raises(ValueError, match="needs lr_z"):
        Rates.of_meta({"lr_y": 1.0})
