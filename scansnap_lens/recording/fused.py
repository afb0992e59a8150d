"""Fused attention while recording: the forward runs its attention as one fused kernel and
the recorder reads the scores and weights it needs from the queries, the keys and each
row's log-sum-exp, so that no [rows, heads, T, T] tensor is made for the forward's sake.

A TransformerBridge's joint-QKV attention (GPT-2, GPT-NeoX / Pythia; TransformerLens 3 and
4) rebuilds the attention eagerly in ``_reconstruct_attention``: scores, mask, softmax and
a second matmul, about half of a Pythia-70m forward on a CPU.  Inside `fused_attention`
that method of each such layer runs instead the CPU's flash attention, which returns each
query row's log-sum-exp L beside its output; the recorder's callback gets q, k (rotary
applied) and L and forms

    scores S[b, h, q, k] = q . k * scale        weights A[b, h, q, k] = exp(S - L[b, h, q])

only at the positions it reads (`FusedReads`): the plan's event rows by one matmul over
those rows, the position aggregates' few reads by dot products.  The values equal the
eager path's to float32 rounding (tests: both majors, both model kinds).

A layer keeps the eager path where anything else would change what the model computes or
what someone observes: a hook on its ``hook_attn_scores`` or ``hook_pattern``, an attention
mask other than the causal one, cached keys, dropout in training mode, grouped-query heads,
``use_attn_result`` or GPT-2's ``reorder_and_upcast_attn``, a device without the kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

__all__ = ["FusedReads", "fusable_layers", "fused_attention"]

# Set False to record every layer through the eager attention (the tests compare both).
ENABLED = True

# [B, H, T, d] q, k, v -> (output [B, H, T, d], log-sum-exp [B, H, T] float32)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _known_methods() -> dict:
    """{the eager `_reconstruct_attention` this module replaces: whether it applies rotary}."""
    try:
        from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
            JointQKVAttentionBridge,
        )
        from transformer_lens.model_bridge.generalized_components.joint_qkv_position_embeddings_attention import (  # noqa: E501
            JointQKVPositionEmbeddingsAttentionBridge,
        )
    except ImportError:
        return {}
    return {
        JointQKVAttentionBridge._reconstruct_attention: False,
        JointQKVPositionEmbeddingsAttentionBridge._reconstruct_attention: True,
    }


def fusable_layers(model, last_layer: int, device) -> dict[int, bool]:
    """{layer <= `last_layer`: whether it applies rotary} for the layers whose attention
    `fused_attention` can run (none where the switch, the device or the model says no)."""
    if not ENABLED or _FLASH_CPU is None or torch.device(device).type != "cpu":
        return {}
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "original_model"):  # a bridge's
        return {}
    known = _known_methods()
    out = {}
    for layer in range(last_layer + 1):
        attn = getattr(blocks[layer], "attn", None)
        method = getattr(type(attn), "_reconstruct_attention", None)
        cfg = getattr(attn, "config", None)
        if method not in known or cfg is None or "_reconstruct_attention" in vars(attn):
            continue
        n_kv = getattr(cfg, "n_key_value_heads", None)
        if (
            (n_kv and n_kv != cfg.n_heads)
            or getattr(cfg, "use_attn_result", False)
            or getattr(attn, "_reorder_and_upcast_attn", False)
            or attn.hook_attn_scores._forward_hooks
            or attn.hook_pattern._forward_hooks
        ):
            continue
        out[layer] = known[method]
    return out


def _scale(attn, d_head: int, rotary: bool) -> float:
    """The scale the eager method multiplies its scores by (its own rule, per class)."""
    scale = d_head**-0.5
    layer = getattr(attn, "_layer_idx", None)
    if not rotary and getattr(attn.config, "scale_attn_by_inverse_layer_idx", False):
        if layer is not None:
            scale /= float(layer + 1)
    return scale


def _causal_only(mask: Tensor | None, T: int) -> bool:
    """Whether `mask` (None, [B, T] or a Hugging Face [B, 1, T, T] additive or boolean mask)
    masks exactly the future: no padding, no bias."""
    if mask is None:
        return True
    if mask.dtype == torch.bool:
        allowed, zero = mask, True
    else:
        allowed = mask > torch.finfo(mask.dtype).min / 2
        zero = bool((mask.masked_fill(~allowed, 0) == 0).all())
    if mask.ndim < 4:
        return zero and bool(allowed.all())
    if mask.shape[-2:] != (T, T):
        return False
    causal = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril_()
    return zero and bool((allowed == causal).all())


def _no_cached_keys(attn, kwargs: dict) -> bool:
    """Whether this layer has no keys cached from earlier positions (a Hugging Face forward
    passes an empty cache to fill)."""
    cache = kwargs.get("past_key_values", kwargs.get("layer_past"))
    layer = getattr(attn, "_layer_idx", None)
    if cache is None or layer is None:  # no cache, or one `_update_kv_cache` leaves alone
        return True
    try:
        return int(cache.get_seq_length(layer)) == 0
    except Exception:  # a cache this module does not know: the eager path
        return False


def _fused_method(attn, eager: Callable, rotary: bool, on_qk: Callable | None, masks: dict):
    """The replacement of `attn`'s ``_reconstruct_attention``: the eager one's steps, with
    the flash kernel for scores, softmax and the value matmul; `on_qk(q, k, lse, scale)`
    reads (it may raise to stop the forward)."""

    def method(q: Tensor, k: Tensor, v: Tensor, **kwargs):
        T = q.shape[1]
        mask = kwargs.get("attention_mask")
        if "mask" not in masks or masks["mask"] is not mask:  # every layer of a pass gets
            masks["mask"], masks["causal"] = mask, _causal_only(mask, T)  # the same: once
        if attn.training or not masks["causal"] or not _no_cached_keys(attn, kwargs):
            return eager(q, k, v, **kwargs)
        H = attn.config.n_heads
        q, k, v, B, T, d = attn._reshape_qkv_to_heads(q, k, v, H, H)
        pe = kwargs.get("position_embeddings")
        if rotary and isinstance(pe, tuple):
            cos, sin = attn._apply_position_embedding_hooks(pe)
            q, k = attn._apply_rotary_pos_emb(q, k, cos, sin)
        k, v = attn._update_kv_cache(k, v, **kwargs)
        scale = _scale(attn, d, rotary)
        out, lse = _FLASH_CPU(q, k, v, is_causal=True, scale=scale)[:2]
        if on_qk is not None:
            on_qk(q, k, lse, scale)
        out = attn._reshape_attn_output(out, B, T, H, d)
        return (attn._apply_output_projection(out), None)

    return method


@contextlib.contextmanager
def fused_attention(model, layers: dict[int, bool], on_qk: Callable[[int], Callable | None]):
    """Inside, each layer of `layers` ({layer: rotary}, `fusable_layers`) runs fused
    attention and calls ``on_qk(layer)``'s reader (None: reads nothing); after, the eager
    method is back."""
    masks: dict = {}
    attns = [model.blocks[layer].attn for layer in layers]
    try:
        for (layer, rotary), attn in zip(layers.items(), attns):
            eager = attn._reconstruct_attention
            attn._reconstruct_attention = _fused_method(attn, eager, rotary, on_qk(layer), masks)
        yield
    finally:
        for attn in attns:
            vars(attn).pop("_reconstruct_attention", None)


@dataclass
class FusedReads:
    """Where the recorder's reads of one batch lie for fused layers (kept with its indices).

    The plan's reads (head-0 flat indices into [B, H, T, T]) are re-indexed into a
    [B, H, N, T] tensor of the N event rows of each batch row (`rows`), which one matmul
    fills; position reads stay (row, query, key) triples, read by dot products.
    """

    rows: Tensor  # [B, N] each batch row's query positions the plan reads (padded with 0)
    plan: Tensor  # [J] the plan's reads, head 0's flat indices into [B, H, N, T]
    plan_row: Tensor  # [J] their row, head 0's flat indices into [B, H, N]
    zbar: Tensor | None  # [J''] `plan` at the pairs the plan holds (None: all of them)
    at: Tensor  # [n, 3] the position reads' (batch row, query, key)

    @classmethod
    def of(cls, flat: Tensor, n: int, zbar_pairs: Tensor | None, B: int, H: int, T: int):
        """From the batch's reads `flat` [n + J] (head 0 into [B, H, T, T]; the first n the
        position aggregates'), on the host."""
        b, within = flat // (H * T * T), flat % (T * T)
        q, k = within // T, within % T
        at = torch.stack([b[:n], q[:n], k[:n]], 1)
        b, q, k = b[n:], q[n:], k[n:]
        rows, inverse = torch.unique(b * T + q, return_inverse=True)
        row_b = rows // T
        counts = torch.bincount(row_b, minlength=B)
        N = max(int(counts.max()) if counts.numel() else 0, 1)
        slot = torch.arange(rows.numel()) - (torch.cumsum(counts, 0) - counts)[row_b]
        padded = torch.zeros(B, N, dtype=torch.long)
        padded[row_b, slot] = rows % T
        plan_row = b * H * N + slot[inverse]
        plan = plan_row * T + k
        return cls(padded, plan, plan_row, None if zbar_pairs is None else plan[zbar_pairs], at)

    def to(self, device) -> FusedReads:
        return FusedReads(*(None if t is None else t.to(device) for t in vars(self).values()))

    def plan_scores(self, q: Tensor, k: Tensor, scale: float) -> Tensor:
        """[B, H, N, T] float32: the scores of the event rows."""
        index = self.rows[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1])
        return torch.matmul(q.gather(2, index).float(), k.float().transpose(-1, -2)).mul_(scale)

    def row_lse(self, lse: Tensor) -> Tensor:
        """[B, H, N]: the event rows' log-sum-exp."""
        return lse.gather(2, self.rows[:, None, :].expand(-1, lse.shape[1], -1))

    def position_weights(self, q: Tensor, k: Tensor, lse: Tensor, scale: float,
                         heads: Tensor | None) -> Tensor:  # fmt: skip
        """[n, H'] the weights at the position reads, of `heads` (None: all)."""
        b, qp, kp = self.at.unbind(1)
        T = q.shape[2]
        if heads is not None:
            q, k, lse = q[:, heads], k[:, heads], lse[:, heads]
        # position-major copies (a forward's q and k: a few MB), from which reads are rows
        qs, ks = (rearrange(t, "b h t d -> (b t) h d").float() for t in (q, k))
        ls = rearrange(lse, "b h t -> (b t) h").float()
        out = []
        for start in range(0, b.numel(), 1 << 16):  # [chunk, H, d] at a time
            part = slice(start, start + (1 << 16))
            at_q, at_k = b[part] * T + qp[part], b[part] * T + kp[part]
            qq, kk = qs.index_select(0, at_q), ks.index_select(0, at_k)  # [m, H, d]
            d = qq.shape[-1]  # one dot product per (read, head): a batched [1, d] x [d, 1]
            s = torch.bmm(qq.view(-1, 1, d), kk.view(-1, d, 1)).view(qq.shape[:2]).mul_(scale)
            w = s.sub_(ls.index_select(0, at_q)).exp_()
            out.append(w.masked_fill_((kp[part] > qp[part])[:, None], 0.0))
        H = q.shape[1] if heads is None else heads.numel()
        return torch.cat(out) if out else q.new_zeros(0, H, dtype=torch.float32)
