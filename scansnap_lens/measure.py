"""Measurements of scan and snap (DESIGN section 2), shared by the lab and real models."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["restricted_entropy"]


def restricted_entropy(attention: Tensor, mask: Tensor) -> Tensor:
    """Shannon entropy (nats) of ``attention`` restricted to ``mask`` and renormalised.

    attention: [..., K, M] per-token attention of each class (rows sum to 1);
    mask: [K, M] bool, the tokens to keep for each class (its distinct tokens for the Fig. 6
    metric).  Returns [..., K]; a class with one kept token has entropy 0, and 0 log 0 = 0.

    >>> a = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    >>> restricted_entropy(a, torch.tensor([[False, True, True, True]]))
    tensor([0.6931])
    """
    if attention.shape[-2:] != mask.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match attention {tuple(attention.shape)}"
        )
    if not mask.any(-1).all():
        raise ValueError("every class needs at least one token in the mask")
    kept = attention * mask.to(attention.dtype)
    p = kept / kept.sum(-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(-1)
