"""The authors' WikiText model (`models.tutorial.tutorial_model`) against the PyTorch
tutorial's own nn.Transformer model, and the all-position entropy of Fig. 10
(`measures.entropy.position_entropy`)."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import EPS32, assert_matches, brute_force
from torch import nn

from scansnap_lens.measures.entropy import position_entropy
from scansnap_lens.models.training import _param_groups, train
from scansnap_lens.models.tutorial import FIRST_FEED_FORWARD, sinusoidal_positions, tutorial_model
from scansnap_lens.recording.hooks import record_checkpoint
from scansnap_lens.recording.plan import plan_recording

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

V, T, D = 40, 12, 16


class TutorialLM(nn.Module):
    """The tutorial's TransformerModel (post-LN nn.TransformerEncoder under a causal mask)."""

    def __init__(self, n_layers: int, d_mlp: int):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        layer = nn.TransformerEncoderLayer(D, 1, d_mlp, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.decoder = nn.Linear(D, V)
        self.register_buffer("pe", sinusoidal_positions(T, D))

    def forward(self, src):
        x = self.embedding(src) * math.sqrt(D) + self.pe[: src.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(src.shape[1])
        return self.decoder(self.encoder(x, mask=mask, is_causal=True))


def _reference_of(model, n_layers: int, d_mlp: int) -> TutorialLM:
    """The tutorial model holding `model`'s weights, read from the Hugging Face modules."""
    hf = model.original_model.transformer
    ref = TutorialLM(n_layers, d_mlp).double()
    with torch.no_grad():
        ref.embedding.weight.copy_(hf.tokens_embed.weight)
        ref.decoder.weight.copy_(model.original_model.lm_head.weight)
        ref.decoder.bias.copy_(model.original_model.lm_head.bias)
        for layer, block in zip(ref.encoder.layers, hf.h):
            attn = block.attn
            q, k, v = (getattr(attn, name) for name in ("q", "k", "v"))  # the bridge's split
            layer.self_attn.in_proj_weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            layer.self_attn.in_proj_bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
            layer.self_attn.out_proj.weight.copy_(attn.c_proj.weight.T)
            layer.self_attn.out_proj.bias.copy_(attn.c_proj.bias)
            layer.linear1.weight.copy_(block.mlp.c_fc.weight.T)
            layer.linear1.bias.copy_(block.mlp.c_fc.bias)
            layer.linear2.weight.copy_(block.mlp.c_proj.weight.T)
            layer.linear2.bias.copy_(block.mlp.c_proj.bias)
            for mine, theirs in ((layer.norm1, block.ln_1), (layer.norm2, block.ln_2)):
                mine.weight.copy_(theirs.weight)
                mine.bias.copy_(theirs.bias)
    return ref.eval()


def _tokens(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (rows, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n_layers", [1, 3])
def test_tutorial_model_computes_the_tutorials_function(n_layers):
    """The same logits as nn.TransformerEncoder (post-LN, causal) with the same weights, at
    initialisation and after SGD steps with clipping and the doubled feed-forward rate; the
    float32 forward against a float64 reference, so the tolerance is float32 rounding over
    dot products of length D through the layers (with a margin of 64 for softmax and LN)."""
    model = tutorial_model(V, n_layers=n_layers, d_model=D, d_mlp=24, n_ctx=T, dropout=0.0)
    tokens = _tokens(4)
    for _ in range(2):
        ref = _reference_of(model, n_layers, 24)
        with torch.no_grad():
            want = ref(tokens)
            got = model(tokens, return_type="logits").double()
        tol = 64 * D * EPS32 * n_layers * float(want.abs().max())
        assert float((got - want).abs().max()) <= tol
        train(model, _tokens(16, 1), num_steps=3, lr_y=5.0, clip_grad_norm=0.5, batch_size=4,
              lr_by_name={FIRST_FEED_FORWARD: 10.0}, save_steps=[], progress=False)  # fmt: skip
    positions = model.original_model.transformer.positions_embed.weight
    assert torch.equal(positions, sinusoidal_positions(T, D))  # frozen through training


def test_tutorial_initialisation_and_rates():
    model = tutorial_model(V, n_layers=2, d_model=D, d_mlp=24, n_ctx=T, seed=3)
    hf = model.original_model
    assert float(hf.transformer.tokens_embed.weight.detach().abs().max()) <= 0.1
    assert float(hf.lm_head.weight.detach().abs().max()) <= 0.1 and not hf.lm_head.bias.any()
    # each layer draws as nn.TransformerEncoderLayer: Xavier-uniform in_proj, bound sqrt(6/(D+3D))
    bound = math.sqrt(6 / (D + 3 * D))
    q = hf.transformer.h[0].attn.q.weight.detach()
    assert float(q.abs().max()) <= bound and float(q.abs().max()) > 0.8 * bound
    same = tutorial_model(V, n_layers=2, d_model=D, d_mlp=24, n_ctx=T, seed=3)
    other = tutorial_model(V, n_layers=2, d_model=D, d_mlp=24, n_ctx=T, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    assert not torch.equal(hf.lm_head.weight, other.original_model.lm_head.weight)
    groups = _param_groups(model, 5.0, 5.0, 0.0, {FIRST_FEED_FORWARD: 10.0})
    doubled = [g for g in groups if g["lr"] == 10.0]
    assert len(doubled) == 1 and len(doubled[0]["params"]) == 2 * 2  # weight, bias per layer
    for block in hf.transformer.h:
        assert any(p is block.mlp.c_fc.weight for p in doubled[0]["params"])


def test_tutorial_dropout_trains_and_is_off_while_recording():
    model = tutorial_model(V, d_model=D, d_mlp=24, n_ctx=T, dropout=0.3)
    tokens = _tokens(3)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(tokens), model(tokens))
    plan = plan_recording(tokens, V)
    a, b = (record_checkpoint(model, tokens, plan, progress=False) for _ in range(2))
    assert torch.equal(a.c_hat, b.c_hat) and model.training


def test_tutorial_recording_equals_brute_force():
    model = tutorial_model(V, n_layers=2, d_model=D, d_mlp=24, n_ctx=T, dropout=0.0)
    with torch.no_grad():  # peaked attention
        for block in model.original_model.transformer.h:
            block.attn.q.weight.mul_(6)
    tokens = _tokens(3)
    plan = plan_recording(tokens, V)
    rec = record_checkpoint(model, tokens, plan, batch_size=2, progress=False)
    assert_matches(rec, plan, brute_force(model, tokens), range(2), range(1))


@pytest.mark.parametrize("include_self,exclude_bos", [(True, False), (False, False), (False, True)])
def test_position_entropy_equals_a_loop_over_rows(include_self, exclude_bos):
    """Every row of every prompt, renormalised over its context, against plain loops over the
    weights a cache holds (float32 weights: the entropy of a row of n weights moves by at most
    n * eps * (1 + ln n) per weight's rounding)."""
    model = tutorial_model(V, n_layers=2, d_model=D, d_mlp=24, n_ctx=T, dropout=0.0)
    with torch.no_grad():
        for block in model.original_model.transformer.h:
            block.attn.q.weight.mul_(6)
    tokens = _tokens(5)
    got = position_entropy(model, tokens, include_self=include_self, exclude_bos=exclude_bos,
                           batch_size=2)  # fmt: skip
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        total, count = 0.0, 0
        for b in range(tokens.shape[0]):
            for t in range(T):
                ctx = [s for s in range(t + include_self) if not (exclude_bos and s == 0)]
                if not ctx:
                    continue
                w = pattern[b, 0, t, ctx] / pattern[b, 0, t, ctx].sum()
                total += float(-(w * torch.log(w.clamp_min(1e-300))).sum())
                count += 1
        tol = T * EPS32 * (1 + math.log(T)) * 4
        assert abs(float(got[layer, 0]) - total / count) <= tol


def test_bad_sizes_and_tokens_name_the_problem():
    with pytest.raises(ValueError, match="d_model=10 is not a multiple of n_heads=3"):
        tutorial_model(V, d_model=10, n_heads=3)
    model = tutorial_model(V, d_model=D, d_mlp=24, n_ctx=T)
    with pytest.raises(ValueError, match=r"tokens must be \[N, T\] with T >= 2, got \(12,\)"):
        position_entropy(model, _tokens(1)[0])
    with pytest.raises(ValueError, match="token ids"):
        position_entropy(model, _tokens(2) + V)
