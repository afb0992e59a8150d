"""Checkpoints as users have them: Hugging Face Trainer folders, nanoGPT dicts, TL state dicts
with the configs people write, trusted pickles; under whichever TransformerLens is installed."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import transformers
from _nanogpt import GPT
from _reference import assert_matches, brute_force
from _tiny import QUIET

from scansnap_lens.models import checkpoints, formats
from scansnap_lens.models.backend import default_backend, make_config
from scansnap_lens.models.checkpoints import CheckpointError
from scansnap_lens.models.training import attention_only_model, initial_weights
from scansnap_lens.recording.aggregates import CheckpointRecord
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder, trainer_callback

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

V = 40


def hf_config(arch: str):
    common = dict(vocab_size=V, bos_token_id=0, eos_token_id=0)
    if arch == "gpt2":
        return transformers.GPT2Config(n_positions=32, n_embd=16, n_layer=2, n_head=2, **common)
    if arch == "gpt_neox":  # rotary
        return transformers.GPTNeoXConfig(
            max_position_embeddings=32,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            **common,
        )
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    return cls(  # grouped-query attention: 4 query heads share 2 key/value heads
        max_position_embeddings=32,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        **common,
    )


class _Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def trainer_run(arch, out, callbacks=()):
    """4 steps of the transformers Trainer, saving at steps 2 and 4; returns the losses."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(arch))
    rows = torch.randint(1, V, (16, 12), generator=torch.Generator().manual_seed(0))
    args = transformers.TrainingArguments(
        str(out),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_Rows(rows), callbacks=list(callbacks)
    )
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


EVAL = torch.randint(1, V, (3, 10), generator=torch.Generator().manual_seed(1))


def check_against_brute_force(traj, source, step):
    plan = traj.plan
    model = next(c for c in source.checkpoints if c.step == step).load()
    ref = brute_force(model, EVAL, in_place=True)
    last = traj.select(steps=[step])
    rec = CheckpointRecord(step, {k: torch.as_tensor(v[0]) for k, v in last.values.items()})
    assert_matches(rec, plan, ref, range(2), range(model.cfg.n_heads))


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "qwen2"])
def test_trainer_folders_record_like_brute_force(arch, tmp_path):
    trainer_run(arch, tmp_path / "run")
    source = checkpoints.folder(tmp_path / "run")  # no options: the layout says what it is
    assert source.steps == [2, 4]
    plan = plan_recording(EVAL, V)
    traj = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan).record(source)
    assert traj.steps.tolist() == [2, 4]
    # the Trainer's seeds, read from its training_args.bin without unpickling it
    assert (traj.meta["seed"], traj.meta["data_seed"]) == (0, 0)
    check_against_brute_force(traj, source, 4)
    # one Trainer folder on its own is a source too
    assert checkpoints.folder(tmp_path / "run" / "checkpoint-2").steps == [2]


def test_trainer_callback_records_without_changing_training(tmp_path):
    plain = trainer_run("gpt2", tmp_path / "plain")
    recorder = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan_recording(EVAL, V))
    recorded = trainer_run("gpt2", tmp_path / "run", callbacks=[trainer_callback(recorder)])
    assert recorded == plain  # recording never touches the live model
    traj = recorder.trajectory()
    assert traj.steps.tolist() == [0, 2, 4]
    assert traj.recording is None  # training ended: the recorder let the folder go
    # the Trainer's own saves after a recording are whole and load as usual
    source = checkpoints.folder(tmp_path / "run")
    from_folder = Recorder(tmp_path / "traj2", EVAL, QUIET, plan=traj.plan).record(source)
    torch.testing.assert_close(from_folder.zbar.full(), traj.zbar[1:], atol=1e-6, rtol=1e-5)
    plain_keys = set(formats.load_state_dict(tmp_path / "plain" / "checkpoint-4"))
    assert set(formats.load_state_dict(tmp_path / "run" / "checkpoint-4")) == plain_keys


def test_trainer_callback_records_at_chosen_steps_between_saves(tmp_path):
    """`steps=` (Pythia's schedule, say) records at steps the Trainer does not save, and the
    saves as before; the training is unchanged."""
    plain = trainer_run("gpt2", tmp_path / "plain")
    recorder = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan_recording(EVAL, V))
    callback = trainer_callback(recorder, steps=[1, 3])
    assert trainer_run("gpt2", tmp_path / "run", callbacks=[callback]) == plain
    assert recorder.trajectory().steps.tolist() == [0, 1, 2, 3, 4]


def test_trainer_callback_records_where_an_adaptive_schedule_says(tmp_path):
    """`steps=AdaptiveSchedule(...)`: it records at the start, at the steps it chooses and at
    the Trainer's saves, all through the schedule (placement.json names each and why); the
    training is unchanged."""
    import json

    from scansnap_lens.planning.placement import PLACEMENT_FILE, AdaptiveSchedule

    plain = trainer_run("gpt2", tmp_path / "plain")
    recorder = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan_recording(EVAL, V))
    schedule = AdaptiveSchedule(recorder, budget=4, last_step=4)
    callback = trainer_callback(recorder, steps=schedule)
    assert trainer_run("gpt2", tmp_path / "run", callbacks=[callback]) == plain
    steps = recorder.trajectory().steps.tolist()
    assert steps[0] == 0 and {2, 4} <= set(steps) and steps == schedule.steps
    why = json.loads((tmp_path / "traj" / PLACEMENT_FILE).read_text())["steps"]
    assert sorted(map(int, why)) == steps


def test_trainer_step_must_agree_with_trainer_state(tmp_path):
    trainer_run("gpt2", tmp_path / "run")
    os.rename(tmp_path / "run" / "checkpoint-2", tmp_path / "run" / "checkpoint-3")
    with pytest.raises(CheckpointError, match=r"checkpoint-3.*says step 3.*says 2"):
        checkpoints.folder(tmp_path / "run")


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_checkpoints_compute_what_nanogpt_computes(bias, tmp_path):
    torch.manual_seed(0)
    gpt = GPT(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16, bias=bias).eval()
    with torch.no_grad():  # nanoGPT's LayerNorms start at 1 and 0; move them off
        for name, p in gpt.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    state = {f"_orig_mod.{k}": v for k, v in gpt.state_dict().items()}  # torch.compile prefix
    state["_orig_mod.transformer.h.0.attn.bias"] = torch.ones(1, 1, 16, 16).tril()
    for step in (100, 200):
        ckpt = {"model": state, "model_args": gpt.model_args, "iter_num": step, "config": {}}
        torch.save(ckpt, tmp_path / f"ckpt_{step}.pt")
    torch.save({**ckpt, "iter_num": 300}, tmp_path / "ckpt.pt")  # nanoGPT's own file name
    source = checkpoints.folder(tmp_path)
    assert source.steps == [100, 200, 300]
    bridge = source.checkpoints[0].load()
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = gpt(x)
        got = bridge(x, return_type="logits")
    # float32, two layers of dot products of length <= 64 over values of order 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    traj = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan_recording(EVAL, V)).record(source)
    assert traj.steps.tolist() == [100, 200, 300]


def tl_weights_folder(tmp_path, config_text):
    """Two TransformerLens-layout checkpoints with the given config.json text."""
    fields = dict(
        n_layers=1,
        d_model=16,
        n_heads=2,
        d_head=8,
        d_vocab=V,
        n_ctx=16,
        attn_only=True,
        act_fn="relu",
        normalization_type="LN",
    )
    folder = tmp_path / "tl"
    folder.mkdir()
    for step in (0, 10):
        torch.save(initial_weights(fields, seed=step), folder / f"model_{step}.pt")
    (folder / "config.json").write_text(config_text(fields))
    return folder, fields


@pytest.mark.parametrize(
    "config_text",
    [
        lambda f: json.dumps(f),  # a hand-written dict of the main fields
        lambda f: json.dumps(make_config(f).to_dict(), default=str),  # cfg.to_dict() as dumped
    ],
    ids=["fields", "to_dict-default-str"],
)
def test_tl_state_dicts_load_on_the_installed_major(tmp_path, config_text):
    folder, _ = tl_weights_folder(tmp_path, config_text)
    model = checkpoints.folder(folder).checkpoints[1].load()
    want = attention_only_model(
        V, d_model=16, n_heads=2, n_ctx=16, seed=10, positional=True, backend=default_backend()
    )
    x = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model(x, return_type="logits"), want(x, return_type="logits"))


@pytest.mark.parametrize("ignore", [-1e5, -math.inf], ids=["tl1.0", "tl1.19-2.x"])
def test_tl_state_dicts_of_older_versions_with_their_buffers_load(tmp_path, ignore):
    """State dicts saved by TransformerLens 1.x-2.x carry each block's causal mask at
    [n_ctx, n_ctx] and IGNORE (`_hub.legacy_buffers`, after those versions' sources): they
    load on either major and compute what the same weights without the buffers compute."""
    from _hub import legacy_buffers

    folder, fields = tl_weights_folder(tmp_path, json.dumps)
    for step in (0, 10):
        state = legacy_buffers(initial_weights(fields, seed=step), fields, ignore=ignore)
        assert state["blocks.0.attn.mask"].shape == (16, 16)
        torch.save(state, folder / f"model_{step}.pt")
    model = checkpoints.folder(folder).checkpoints[1].load()
    want = attention_only_model(
        V, d_model=16, n_heads=2, n_ctx=16, seed=10, positional=True, backend=default_backend()
    )
    x = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model(x, return_type="logits"), want(x, return_type="logits"))


def test_weights_that_do_not_fit_list_their_keys(tmp_path):
    folder, _ = tl_weights_folder(tmp_path, json.dumps)
    state = torch.load(folder / "model_10.pt", weights_only=True)
    state.pop("blocks.0.attn.W_V")
    state["blocks.0.attn.extra"] = torch.zeros(1)
    torch.save(state, folder / "model_10.pt")
    with pytest.raises(
        CheckpointError, match=r"missing keys: .*(W_V|v\.weight).*unexpected keys: .*extra"
    ):
        checkpoints.folder(folder).checkpoints[1].load()


class Payload:
    """Unpickling this runs code: it creates the file named in `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickled_models_need_trust_and_then_work(tmp_path):
    # A whole Hugging Face model (TransformerBridge itself cannot be pickled on 4.x).
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config("gpt2")).eval()
    torch.save(model, tmp_path / "model_7.pt")
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil"
    evil.mkdir()
    torch.save({"model": Payload(marker)}, evil / "model_1.pt")
    with pytest.raises(CheckpointError, match=r"pickled Python objects.*not loaded") as refused:
        checkpoints.folder(evil).checkpoints[0].load()
    assert "weights_only=False" not in str(refused.value)  # no advice to turn it off
    assert not marker.exists()  # refused before anything ran
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        checkpoints.folder(tmp_path).checkpoints[0].load()
    loaded = checkpoints.folder(tmp_path, trust_pickle=True).checkpoints[0].load()
    x = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, return_type="logits"), model(x).logits)


def _nanogpt_folder(tmp_path):
    torch.manual_seed(0)
    gpt = GPT(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16)
    for step in (100, 200):
        ckpt = {"model": gpt.state_dict(), "model_args": gpt.model_args, "iter_num": step}
        torch.save(ckpt, tmp_path / f"ckpt_{step}.pt")
    return tmp_path, [], [100, 200]


def _trainer_folder(tmp_path):
    trainer_run("qwen2", tmp_path)
    return tmp_path, [], [2, 4]


def _pickle_folder(tmp_path):
    torch.manual_seed(0)
    torch.save(
        transformers.AutoModelForCausalLM.from_config(hf_config("gpt2")), tmp_path / "m_3.pt"
    )
    return tmp_path, ["--trust-pickle"], [3]


def _tl_folder(tmp_path):
    folder, _ = tl_weights_folder(
        tmp_path, lambda f: json.dumps(make_config(f).to_dict(), default=str)
    )
    return folder, [], [0, 10]


@pytest.mark.parametrize(
    "make", [_trainer_folder, _nanogpt_folder, _pickle_folder, _tl_folder],
    ids=["hf-trainer", "nanogpt", "pickle", "tl-state-dicts"],
)  # fmt: skip
def test_record_command_reads_every_format(make, tmp_path, capsys):
    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.recording.trajectory import Trajectory

    (tmp_path / "ckpt").mkdir()
    folder, flags, steps = make(tmp_path / "ckpt")
    save_tokens(tmp_path / "eval.safetensors", EVAL)
    args = ["record", "--checkpoints", str(folder), "--tokens", str(tmp_path / "eval.safetensors")]
    assert main([*args, "--out", str(tmp_path / "traj"), *flags]) == 0, capsys.readouterr().err
    assert Trajectory.load(tmp_path / "traj").steps.tolist() == steps


def test_record_command_reads_legacy_labels_offline(tmp_path, capsys):
    from _hub import fake_legacy_tl_model

    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens

    fake_legacy_tl_model(os.environ["HF_HUB_CACHE"], "NeelNanda/attn-only-2l-demo", [0, 10, 110])
    save_tokens(tmp_path / "eval.safetensors", EVAL)
    args = ["record", "--model", "NeelNanda/attn-only-2l-demo", "--tokens"]
    assert main([*args, str(tmp_path / "eval.safetensors"), "--out", str(tmp_path / "t")]) == 0
    assert "3 checkpoints recorded" in capsys.readouterr().out
    assert main([*args, str(tmp_path / "eval.safetensors"), "--out", str(tmp_path / "u"),
                 "--model", "NeelNanda/absent"]) == 2  # fmt: skip
    assert "huggingface-cli download NeelNanda/absent" in capsys.readouterr().err


def test_model_option_takes_a_local_folder(tmp_path):
    trainer_run("llama", tmp_path / "run")
    source = checkpoints.pretrained(str(tmp_path / "run" / "checkpoint-4"))
    assert source.steps == [4]
    model = source.checkpoints[0].load()
    assert model.cfg.n_heads == 4 and model.cfg.d_vocab == V


def test_trainer_folders_with_pytorch_model_bin_load_weights_only(tmp_path):
    trainer_run("gpt2", tmp_path / "run")
    folder = tmp_path / "run" / "checkpoint-4"
    want = checkpoints.folder(folder).checkpoints[0].load()
    state = formats.load_state_dict(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")  # the older Trainer format
    got = checkpoints.folder(folder).checkpoints[0].load()
    x = torch.randint(1, V, (2, 9), generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(got(x, return_type="logits"), want(x, return_type="logits"))
    marker = tmp_path / "pwned"
    torch.save({"transformer.wte.weight": Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot load the Hugging Face model"):
        checkpoints.folder(folder).checkpoints[0].load()
    assert not marker.exists()  # loaded with weights_only: the payload never ran


def test_a_corrupt_trainer_state_is_said_not_ignored(tmp_path):
    (tmp_path / "trainer_state.json").write_text('{"global_step": ')
    with pytest.warns(UserWarning, match=r"trainer_state\.json is not readable.*unchecked"):
        assert formats.trainer_step(tmp_path) is None
    for log in ('"every step"', '[{"step": 1, "learning_rate": "0.1"}, 7]'):
        (tmp_path / "trainer_state.json").write_text(f'{{"global_step": 2, "log_history": {log}}}')
        with pytest.warns(UserWarning, match=r"log_history is not the Trainer's list"):
            assert formats.trainer_training([tmp_path / "trainer_state.json"]) == {}


def test_the_command_line_says_each_corrupt_trainer_state_in_one_line(tmp_path):
    """Two checkpoints whose trainer_state.json is cut short: `scansnap record` says each, one
    line apiece in its own voice (no Python warning with its source line), and records."""
    import subprocess
    import sys

    from scansnap_lens.inputs.tokens import save_tokens

    trainer_run("gpt2", tmp_path / "run")
    for step in (2, 4):
        (tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json").write_text("{")
    save_tokens(tmp_path / "eval.safetensors", EVAL)
    done = subprocess.run(
        [sys.executable, "-m", "scansnap_lens.cli", "record", "--checkpoints",
         str(tmp_path / "run"), "--tokens", str(tmp_path / "eval.safetensors"), "--out",
         str(tmp_path / "t")], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "trainer_state.json" in line]
    assert len(said) == 2 and all(line.startswith("scansnap: warning: ") for line in said), said
    assert "the training's rates and losses from the other" in said[0]
    assert "UserWarning" not in done.stderr


def test_a_trainer_run_keeps_its_training_in_the_trajectory(tmp_path):
    """The Trainer's rate, schedule and optimizer reach the trajectory's meta, from the
    checkpoints' trainer_state.json and from the callback's arguments, and the report says
    what the theory can say of AdamW with a decaying rate."""
    from scansnap_lens.measures import theory_limits
    from scansnap_lens.recording.recorder import trainer_callback

    trainer_run("gpt2", tmp_path / "run")
    source = checkpoints.folder(tmp_path / "run")
    meta = source.meta
    assert meta["optimizer"] == "adam" and meta["lr_y"] == meta["lr_z"] <= 1e-2
    rates = [r for _, r in meta["lr_schedule"]]
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-1]  # linear decay
    assert "assumed AdamW" in meta["training_from"]
    traj = Recorder(tmp_path / "traj", EVAL, QUIET, plan=plan_recording(EVAL, V)).record(source)
    assert traj.meta["lr_schedule"] == meta["lr_schedule"]
    said = " ".join(theory_limits(traj))
    assert "t0 (predicted_snap) is not defined" in said and "warmup and decay" in said

    recorder = Recorder(tmp_path / "cb", EVAL, QUIET, plan=plan_recording(EVAL, V))
    trainer_run("gpt2", tmp_path / "run2", callbacks=[trainer_callback(recorder)])
    recorded = recorder.trajectory().meta
    assert recorded["lr_y"] == 1e-2 and recorded["optimizer"] == "adam"
    assert recorded["lr_schedule"].startswith("linear")


def _trainer_bin_folder(tmp_path):
    trainer_run("gpt2", tmp_path)
    for step in (2, 4):  # the older Trainer format, as torch.save writes it
        folder = tmp_path / f"checkpoint-{step}"
        torch.save(formats.load_state_dict(folder / "model.safetensors"),
                   folder / "pytorch_model.bin")  # fmt: skip
        (folder / "model.safetensors").unlink()
    return tmp_path, [], [2, 4]


def _tl_safetensors_folder(tmp_path):
    from safetensors.torch import save_file

    folder, _ = tl_weights_folder(tmp_path, json.dumps)
    for step in (0, 10):
        save_file(torch.load(folder / f"model_{step}.pt"), folder / f"step_{step}.safetensors")
        (folder / f"model_{step}.pt").unlink()
    return folder, [], [0, 10]


@pytest.mark.parametrize(
    "make", [_trainer_folder, _trainer_bin_folder, _nanogpt_folder, _tl_folder,
             _tl_safetensors_folder],
    ids=["hf-trainer", "hf-trainer-bin", "nanogpt", "tl-state-dicts", "tl-safetensors"],
)  # fmt: skip
def test_a_truncated_weights_file_is_a_checkpoint_error_in_every_format(make, tmp_path, capsys):
    """The last checkpoint's weights file cut in half (a copy interrupted, a full disk): the
    command names the file and exits 2, no traceback; --on-error skip records the others and
    notes the damaged one."""
    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.recording.trajectory import Trajectory

    (tmp_path / "ckpt").mkdir()
    folder, flags, steps = make(tmp_path / "ckpt")
    last = checkpoints.folder(folder, steps=[steps[-1]]).checkpoints[0].path
    files = [last] if last.is_file() else sorted(
        p for p in last.iterdir() if p.name.startswith(("model.", "pytorch_model."))
    )  # fmt: skip
    (weights,) = files
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size // 2)
    save_tokens(tmp_path / "eval.safetensors", EVAL)
    args = ["record", "--checkpoints", str(folder), "--tokens", str(tmp_path / "eval.safetensors")]
    assert main([*args, "--out", str(tmp_path / "a"), *flags]) == 2
    err = capsys.readouterr().err
    assert weights.name in err and "Traceback" not in err, err
    assert "--on-error skip" in err, err  # the way on, named
    assert main([*args, "--out", str(tmp_path / "b"), "--on-error", "skip", *flags]) == 0
    traj = Trajectory.load(tmp_path / "b")
    assert traj.steps.tolist() == steps[:-1]
    assert [s["step"] for s in traj.skipped] == steps[-1:]
    assert weights.name in traj.skipped[0]["error"]


def test_local_checkpoints_with_one_weights_file_under_two_steps_are_found(tmp_path, capsys):
    """A Trainer run whose checkpoint-2 holds checkpoint-4's weights (a copy gone wrong):
    found by hashing the files before anything is recorded, and said plainly."""
    import shutil

    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.recording.trajectory import Trajectory

    trainer_run("gpt2", tmp_path / "run")
    shutil.copy(tmp_path / "run" / "checkpoint-4" / "model.safetensors",
                tmp_path / "run" / "checkpoint-2" / "model.safetensors")  # fmt: skip
    save_tokens(tmp_path / "eval.safetensors", EVAL)
    args = ["record", "--checkpoints", str(tmp_path / "run"), "--tokens",
            str(tmp_path / "eval.safetensors")]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 checkpoints serve weights identical" in err and "step 4" in err, err
    assert not (tmp_path / "a" / "manifest.json").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--duplicates", "skip"]) == 0
    traj = Trajectory.load(tmp_path / "b")
    assert traj.steps.tolist() == [4] and [s["step"] for s in traj.skipped] == [2]


class _Planted:  # a pickle that would run a command if it were unpickled
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_trainer_seeds_are_read_without_running_the_pickle(tmp_path):
    args = transformers.TrainingArguments(str(tmp_path / "o"), report_to=[], seed=7,
                                          data_seed=11)  # fmt: skip
    torch.save(args, tmp_path / "training_args.bin")  # as the Trainer saves it
    assert formats.trainer_seeds(tmp_path / "training_args.bin") == {"seed": 7, "data_seed": 11}
    planted = tmp_path / "ran"
    torch.save({"seed": 3, "x": _Planted(planted)}, tmp_path / "bad.bin")
    assert formats.trainer_seeds(tmp_path / "bad.bin") == {"seed": 3}
    (tmp_path / "junk.bin").write_bytes(b"not a pickle at all")
    assert formats.trainer_seeds(tmp_path / "junk.bin") == {}
    assert not planted.exists()


def test_a_checkpoints_config_that_is_no_regular_file_is_refused_not_waited_on(tmp_path):
    """A checkpoint folder's config.json as a FIFO blocked for ever (read as it was), a huge
    training_args.bin was read whole: each is now checked as a small regular file first."""
    import threading

    os.mkfifo(tmp_path / "config.json")
    out = {}
    reader = threading.Thread(target=lambda: out.update(error=_refusal(tmp_path)), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "still waiting on the FIFO"
    assert "not a regular file" in out["error"] and "config.json" in out["error"]
    assert not formats.is_hf_folder(tmp_path)
    big = tmp_path / "training_args.bin"
    with open(big, "wb") as handle:
        handle.truncate(formats.ARGS_BYTES + 1)  # sparse: no disk spent
    assert formats.trainer_seeds(big) == {}


def _refusal(folder) -> str:
    try:
        formats.read_tl_config(folder / "config.json")
    except CheckpointError as err:
        return str(err)
    return "read"
