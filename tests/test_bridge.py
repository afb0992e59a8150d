"""TransformerBridge recording; runs under transformer-lens 3.x and 4.x (no HookedTransformer)."""

from __future__ import annotations

import pytest
import torch
from _backends import requires_tl4
from _reference import assert_matches, brute_force

from scansnap_lens.models import checkpoints
from scansnap_lens.models.backend import BackendError, default_backend
from scansnap_lens.recording.hooks import CheckpointRecord, record_checkpoint
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.testing import bridge_from_hf, tiny_hf_model


@pytest.mark.parametrize("exclude_bos", [True, False])
def test_gpt2_bridge_equals_brute_force(exclude_bos):
    hf = tiny_hf_model("gpt2", vocab_size=20, n_ctx=16, d_model=16, n_layers=2, n_heads=2)
    with torch.no_grad():  # peaked attention
        for block in hf.transformer.h:
            block.attn.c_attn.weight.mul_(8)
    bridge = bridge_from_hf(hf, "gpt2")
    tokens = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, 20, exclude_bos=exclude_bos)
    rec = record_checkpoint(bridge, tokens, plan, batch_size=2, progress=False)
    ref = brute_force(bridge, tokens, exclude_bos=exclude_bos)
    assert_matches(rec, plan, ref, range(2), range(2))


def test_pythia_labels_through_the_bridge(fake_hub, tmp_path):
    tokens = torch.randint(1, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    plan = plan_recording(tokens, 64, queries=0.5)
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps="log:2", backend="bridge")
    assert source.steps == [0, 143000]
    source = checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0, 2000], backend="bridge")
    traj = Recorder(tmp_path / "t", tokens, plan, progress=False).record(source)
    assert traj.steps.tolist() == [0, 2000]
    model = source.checkpoints[-1].load()
    ref = brute_force(model, tokens, queries=set(plan.queries.tolist()))
    last = traj.select(steps=[2000])
    rec = CheckpointRecord(2000, last.zbar[0], last.chat[0], last.entropy[0], last.query_entropy[0])
    assert_matches(rec, plan, ref, range(2), range(4))


@requires_tl4
def test_hooked_backend_on_4x_is_a_clear_error():
    """4.x has no HookedTransformer: asking for it says what to use instead."""
    with pytest.raises(BackendError, match=r"backend 'hooked'.*4\.\d.*use backend 'bridge'"):
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0], backend="hooked")
    assert default_backend() == "bridge"


def test_dropout_is_off_while_recording():
    """A GPT-2 bridge with dropout 0.5 left in training mode: its forward passes differ, its
    recordings do not (the recorder evaluates), and it is back in training mode after."""
    hf = tiny_hf_model("gpt2", vocab_size=20, n_ctx=16, d_model=16, n_layers=1, n_heads=2)
    hf.config.resid_pdrop = hf.config.attn_pdrop = hf.config.embd_pdrop = 0.5
    hf = type(hf)(hf.config)  # rebuilt with the dropout rates
    bridge = bridge_from_hf(hf, "gpt2")
    bridge.train()
    tokens = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(bridge(tokens), bridge(tokens))  # dropout is active
    plan = plan_recording(tokens, 20)
    a, b = (record_checkpoint(bridge, tokens, plan, progress=False) for _ in range(2))
    assert torch.equal(a.zbar, b.zbar) and torch.equal(a.entropy, b.entropy)
    assert bridge.training
