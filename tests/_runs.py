"""The small training run that checkpoint, training and recorder tests share: Syn-Small,
30 SGD steps, checkpoints at 0, 5, 10, 20, 30."""

from __future__ import annotations

import torch

from scansnap_lens.lab.synthetic import syn_small
from scansnap_lens.models.backend import state_layout, tl_to_native
from scansnap_lens.models.training import attention_only_model, train

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
        num_steps=30,
        lr_y=0.5,
        lr_z=0.5,
        momentum=0.9,
        batch_size=32,
        save_steps=[0, 5, 10, 20, 30],
        loss_on="last",
        progress=False,
        **kwargs,
    )
    return model, result
