"""A tiny TransformerLens model of the installed major's default backend."""

from __future__ import annotations

import math

import torch

from scansnap_lens.models.backend import attention_logit_parameters, build_model
from scansnap_lens.recording.settings import RecordingSettings

V = 13


def tiny_model(positional="standard", seed=0, n_layers=2, attn_only=False, backend=None,
               n_heads=3, n_key_value_heads=None):  # fmt: skip
    """A 2-layer model of the installed major's default backend (HookedTransformer on 3.x);
    `n_key_value_heads` < `n_heads`: grouped-query attention."""
    torch.manual_seed(seed)
    cfg = dict(
        n_layers=n_layers,
        d_model=16,
        n_heads=n_heads,
        d_head=8,
        d_mlp=32,
        d_vocab=V,
        n_ctx=24,
        act_fn="relu",
        attn_only=attn_only,
        positional_embedding_type=positional,
        seed=seed,
    )
    if n_key_value_heads is not None:
        cfg["n_key_value_heads"] = n_key_value_heads
    model = build_model(cfg, backend)
    # Larger weights give peaked attention, where a renormalisation bug would show.
    with torch.no_grad():
        for param in attention_logit_parameters(model)[0]:
            param.mul_(4)
    return model.eval()


QUIET = RecordingSettings(progress=False)  # the tests' recordings: no progress bars


def planted_circuit(V: int, T: int, d: int) -> dict[str, torch.Tensor]:
    """A 2-layer attention-only model's weights (TransformerLens layout, no LayerNorm) that
    make layer 0 a previous-token head and layer 1 an induction head: the residual holds the
    token (one-hot), the position (one-hot) and, after layer 0, the previous token."""
    D = 2 * V + T
    E, P, R = slice(0, V), slice(V, V + T), slice(V + T, D)
    beta = 30.0 * math.sqrt(d)  # sharp attention whatever the scale
    s = {
        "embed.W_E": torch.zeros(V, D), "pos_embed.W_pos": torch.zeros(T, D),
        "unembed.W_U": torch.zeros(D, V), "unembed.b_U": torch.zeros(V),
    }  # fmt: skip
    s["embed.W_E"][:, E] = torch.eye(V)
    s["pos_embed.W_pos"][:, P] = torch.eye(T)
    s["unembed.W_U"][E] = torch.eye(V)
    for layer in (0, 1):
        for name, shape in (("W_Q", (1, D, d)), ("W_K", (1, D, d)), ("W_V", (1, D, d)),
                            ("W_O", (1, d, D)), ("b_Q", (1, d)), ("b_K", (1, d)),
                            ("b_V", (1, d)), ("b_O", (D,))):  # fmt: skip
            s[f"blocks.{layer}.attn.{name}"] = torch.zeros(shape)
    a0, a1 = "blocks.0.attn", "blocks.1.attn"
    s[f"{a0}.W_Q"][0, P, :T] = beta * torch.eye(T)  # position p looks for ...
    s[f"{a0}.W_K"][0, P, :T] = torch.eye(T).roll(1, 1)  # ... position p - 1
    s[f"{a0}.W_V"][0, E, :V] = torch.eye(V)
    s[f"{a0}.W_O"][0, :V, R] = torch.eye(V)  # its token, written as "previous token"
    s[f"{a1}.W_Q"][0, E, :V] = beta * torch.eye(V)  # token x looks for ...
    s[f"{a1}.W_K"][0, R, :V] = torch.eye(V)  # ... the position whose previous token is x
    s[f"{a1}.W_V"][0, E, :V] = torch.eye(V)
    s[f"{a1}.W_O"][0, :V, E] = torch.eye(V)
    return s


def planted_run():
    """(model_at(step), rows): a 2-layer attention-only model whose weights move from a
    random start to `planted_circuit` (layer 0 previous-token, layer 1 induction) along a
    sigmoid centred on step 100, and 16 rows of BOS then ten tokens twice, where both
    circuits read."""
    from scansnap_lens.models.backend import load_weights
    from scansnap_lens.models.training import attention_only_model, initial_weights

    Vp, T, d = 32, 24, 32
    kw = dict(d_model=2 * Vp + T, n_heads=1, n_layers=2, n_ctx=T, positional=True,
              normalization_type=None, d_head=d)  # fmt: skip
    fields = dict(n_layers=2, d_model=2 * Vp + T, n_heads=1, d_head=d, d_vocab=Vp, n_ctx=T,
                  attn_only=True, normalization_type=None)  # fmt: skip
    start, planted = initial_weights(fields, 0), planted_circuit(Vp, T, d)

    def model_at(step: int):
        mix = 1 / (1 + math.exp(-(step - 100) / 10))
        model = attention_only_model(Vp, **kw)
        load_weights(model, {k: start[k] + mix * (planted[k] - start[k]) for k in start}, "mix")
        return model

    g = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(Vp - 1, generator=g)[:10] + 1 for _ in range(16)])
    return model_at, torch.cat([torch.zeros(16, 1, dtype=torch.long), ids, ids], 1)
