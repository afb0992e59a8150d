"""Checkpoint labels resolved to exact files and revisions, offline, on fake hub caches."""

from __future__ import annotations

import os

import pytest
import torch
from _backends import BACKENDS

from scansnap_lens.models import checkpoints
from scansnap_lens.models.backend import state_layout, tl_to_native
from scansnap_lens.models.checkpoints import CheckpointError
from scansnap_lens.models.training import initial_weights
from scansnap_lens.testing import fake_legacy_tl_model

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_stanford_crfm_labels_load_their_revision(backend):
    from scansnap_lens.testing import fake_hub_model

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
