"""The one place that knows the TransformerLens major: backends, weight layouts, the model
protocol."""

from __future__ import annotations

import pytest
import torch
from _backends import BACKENDS, requires_tl4
from _hub import tiny_hf_model
from _tiny import V, tiny_model
from torch import nn

from scansnap_lens.models import checkpoints
from scansnap_lens.models.backend import (
    BackendError,
    default_backend,
    make_config,
    state_layout,
    tl_to_native,
)
from scansnap_lens.models.training import attention_only_model, initial_weights, train

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


@requires_tl4
def test_hooked_backend_on_4x_is_a_clear_error():
    """4.x has no HookedTransformer: asking for it says what to use instead."""
    with pytest.raises(BackendError, match=r"backend 'hooked'.*4\.\d.*use backend='bridge'"):
        checkpoints.pretrained("EleutherAI/pythia-14m", steps=[0], backend="hooked")
    assert default_backend() == "bridge"


@pytest.mark.parametrize("backend", BACKENDS)
def test_models_of_both_backends_satisfy_the_model_protocol(backend):
    from scansnap_lens.models.backend import HookedModel

    assert isinstance(tiny_model(backend=backend), HookedModel)
    hf = tiny_hf_model("gpt2", vocab_size=V, n_ctx=8, d_model=8, n_layers=1, n_heads=1)
    assert not isinstance(hf, HookedModel)  # wrapped in a bridge first (backend.hf_bridge)


@requires_tl4
def test_tl_to_native_equals_transformer_lens_own_converter():
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    fields = dict(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=V, n_ctx=16)
    fields.update(attn_only=True, act_fn="relu", normalization_type="LN")
    state = initial_weights(fields, seed=1)
    ours, theirs = tl_to_native(state), convert_tl_checkpoint(state, make_config(fields))
    assert ours.keys() == theirs.keys() and state_layout(ours) == "native"
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_trains_the_same_parameters(backend):
    """HookedTransformer's parameters, bias of the unembedding included, on every backend and
    major: TransformerLens 4.3 freezes the native bridge's unembedding bias (a buffer), which
    trained another model there than on 3.x."""
    model = attention_only_model(V, d_model=8, n_heads=2, n_ctx=8, seed=0,
                                 normalization_type=None, backend=backend)  # fmt: skip
    state = model.state_dict(keep_vars=True)
    trained = {k: v.detach() for k, v in state.items() if isinstance(v, nn.Parameter)}
    trained = {k: v for k, v in trained.items() if state[k].requires_grad}
    names = set(tl_to_native(trained) if state_layout(trained) == "tl" else trained)
    native = tl_to_native(state) if state_layout(state) == "tl" else state
    attention = {f"blocks.0.attn.{p}.{w}" for p in "qkvo" for w in ("weight", "bias")}
    assert names == attention | {"embed.weight", "unembed.weight", "unembed.bias"}
    before = native["unembed.bias"].detach().clone()
    rows = torch.randint(0, V, (4, 8), generator=torch.Generator().manual_seed(0))
    train(model, lambda b, g: rows, num_steps=1, lr_y=0.5, lr_z=0.5, save_steps=[], progress=False)
    after = model.state_dict()
    after = tl_to_native(after) if state_layout(after) == "tl" else after
    assert not torch.equal(after["unembed.bias"], before)
