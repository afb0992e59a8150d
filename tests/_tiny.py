"""A tiny TransformerLens model of the installed major's default backend."""

from __future__ import annotations

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
