"""Checkpoint labels resolved to exact files and revisions, offline, on fake hub caches."""

from __future__ import annotations

import os

import pytest
import torch
from _backends import BACKENDS
from _hub import fake_legacy_tl_model

from scansnap_lens.models import checkpoints
from scansnap_lens.models.backend import state_layout, tl_to_native
from scansnap_lens.models.checkpoints import CheckpointError
from scansnap_lens.models.training import initial_weights

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

LABELS = (0, 5_000_000, 15_000_000)  # 5,000,000 is a decimal suffix of 15,000,000


@pytest.fixture(scope="module")
def legacy_hub():
    fake_legacy_tl_model(os.environ["HF_HUB_CACHE"], "NeelNanda/attn-only-1l", labels=LABELS)
    return "NeelNanda/attn-only-1l"


def native(state):
    return tl_to_native(state) if state_layout(state) == "tl" else dict(state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_legacy_labels_load_exactly_their_own_file(legacy_hub, backend):
    source = checkpoints.pretrained(legacy_hub, backend=backend)
    assert source.steps == list(LABELS) and source.step_unit == "steps"
    fields = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=64, n_ctx=32, d_vocab=64)
    fields.update(attn_only=True, normalization_type="LN")
    for i, checkpoint in enumerate(source.checkpoints):
        got = native(checkpoint.load().state_dict())
        want = native(initial_weights(fields, seed=i))  # the weights written for this label
        for key, value in want.items():
            assert torch.equal(got[key], value), (checkpoint.step, key)


def test_offline_without_the_files_says_what_to_download():
    with pytest.raises(CheckpointError, match=r"HF_HUB_OFFLINE.*huggingface-cli download"):
        checkpoints.pretrained("NeelNanda/not-downloaded")
    source = checkpoints.pretrained("EleutherAI/pythia-31m", steps=[0])
    with pytest.raises(CheckpointError, match=r"pythia-31m@step0.*HF_HUB_OFFLINE"):
        source.checkpoints[0].load()


def test_models_without_labels_are_refused():
    with pytest.raises(ValueError, match="no checkpoint labels"):
        checkpoints.pretrained("gpt2")


def test_polypythias_names_have_pythias_labels():
    """PolyPythias' repositories keep Pythia's branches under names TransformerLens does not
    list (3.x refuses them by name): their labels are those of the model they vary."""
    from scansnap_lens.models import hub

    pythia = hub.checkpoint_labels("EleutherAI/pythia-160m")
    for suffix in ("seed3", "data-seed2", "weight-seed1"):
        assert hub.checkpoint_labels(f"EleutherAI/pythia-160m-{suffix}") == pythia
    assert hub.revision_of("EleutherAI/pythia-160m-seed3", 1000) == "step1000"


@pytest.mark.parametrize("backend", BACKENDS)
def test_stanford_crfm_labels_load_their_revision(backend):
    from _hub import fake_hub_model

    name = "stanford-crfm/alias-gpt2-small-x21"
    revisions = ["checkpoint-0", "checkpoint-10", "checkpoint-20"]
    fake_hub_model(os.environ["HF_HUB_CACHE"], name, revisions=revisions, arch="gpt2")
    source = checkpoints.pretrained(name, steps=[10, 20], backend=backend)
    assert source.steps == [10, 20]
    x = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = [c.load()(x, return_type="logits") for c in source.checkpoints]
    # each revision holds its own weights (seed = its position), so the two differ
    assert not torch.allclose(logits[0], logits[1])
    want = _hf_logits(name, "checkpoint-10", x)
    # HookedTransformer centres the unembedding (logits shift per position): compare log-probs;
    # float32 over two small layers, with folded LayerNorms on the hooked side
    torch.testing.assert_close(logits[0].log_softmax(-1), want.log_softmax(-1), atol=1e-4, rtol=0)


def _hf_logits(name, revision, x):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(name, revision=revision).eval()
    with torch.no_grad():
        return model(x).logits


def test_load_options_are_not_silently_dropped(legacy_hub):
    source = checkpoints.pretrained(legacy_hub, steps=[0], fold_ln=True)
    with pytest.raises(ValueError, match=r"load options \['fold_ln'\]"):
        source.checkpoints[0].load()


@pytest.mark.slow
def test_pythia_as_on_the_hub_from_labels_to_report(tmp_path, capsys):
    """Pythia's 154 checkpoint labels (step0, 1, 2, 4, ..., 512, 1000, ..., 143000), a
    revision per label in a hub cache, the model's d_vocab padded to 50304 beyond its
    tokenizer's 50277, `--steps log:5` over the labels, statistics from the model's own
    tokenizer, and the recording and report through the labels, offline."""
    from _hub import fake_hub_model

    from scansnap_lens.cli import main
    from scansnap_lens.models.hub import checkpoint_labels
    from scansnap_lens.models.steps import select_steps
    from scansnap_lens.recording.trajectory import Trajectory

    name = "EleutherAI/pythia-70m"
    labels, unit = checkpoint_labels(name)
    assert len(labels) == 154 and unit == "steps"
    assert labels[:12] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert labels[-1] == 143000 and labels[11:] == list(range(1000, 143001, 1000))
    chosen = select_steps(labels, "log:5")
    assert chosen == [0, 16, 512, 7000, 143000]
    repo = fake_hub_model(os.environ["HF_HUB_CACHE"], name, [f"step{n}" for n in chosen],
                          vocab_size=50304, tokenizer_size=50277, d_model=16, n_heads=2,
                          n_ctx=64)  # fmt: skip
    gen = torch.Generator().manual_seed(0)  # lines: noise, a key, more noise, w1, w(5 + key)
    noise = torch.randint(100, 130, (300, 8), generator=gen)
    key = torch.randint(2, 5, (300, 1), generator=gen)
    rows = torch.cat([noise[:, :5], key, noise[:, 5:], torch.ones_like(key), 5 + key], 1)
    text = tmp_path / "text.txt"
    text.write_text("".join(" ".join(f"w{i}" for i in row) + "\n" for row in rows.tolist()))
    snapshot = next((repo / "snapshots").iterdir())
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(text), "--tokenizer", str(snapshot), "--documents", "line",
                 "--window", "8", "--out", str(stats)]) == 0  # fmt: skip
    out = tmp_path / "traj"
    assert main(["record", "--model", name, "--steps", "log:5", "--backend", "bridge", "--text",
                 str(text), "--documents", "line", "--seq-len", "11", "--stats", str(stats),
                 "--out", str(out)]) == 0  # fmt: skip
    traj = Trajectory.load(out)
    assert traj.steps.tolist() == chosen
    assert traj.plan.vocab_size == 50304 and traj.plan.window == 8
    assert traj.meta["source"].startswith(name)
    assert main(["report", str(out), "--stats", str(stats)]) == 0
    printed = capsys.readouterr().out
    assert "plan: " in printed and "for 5 checkpoints" in printed
    assert (out / "report" / "report.html").exists()
