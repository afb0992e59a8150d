"""Fused attention while recording: the forward runs its attention as one fused kernel and
the recorder reads the scores and weights it needs from the queries, the keys and each
row's log-sum-exp, so that no [rows, heads, T, T] tensor is made for the forward's sake.

A TransformerBridge's joint-QKV attention (GPT-2, GPT-NeoX / Pythia; TransformerLens 3 and
4) rebuilds the attention eagerly in ``_reconstruct_attention``: scores, mask, softmax and
a second matmul, about half of a Pythia-70m forward on a CPU; the native bridge's
``NativeAttention`` does the same.  Inside `fused_attention` that method of each such layer
runs instead a fused kernel that returns each query row's log-sum-exp L beside its output
(the CPU's flash attention; on a GPU flash attention in half precision, memory-efficient
attention in float32, for rows of `GPU_MIN_POSITIONS` or more); the recorder's callback gets
q, k (rotary applied) and L and forms

    scores S[b, h, q, k] = q . k * scale        weights A[b, h, q, k] = exp(S - L[b, h, q])

only at the positions it reads (`FusedReads`): the plan's event rows by one matmul over
those rows, the position aggregates' reads from the lines of scores many share (on a CPU)
or by a dot product each.  The values equal the eager path's to float32 rounding (tests:
both majors, both model kinds).

A layer keeps the eager path where anything else would change what the model computes or
what someone observes: a hook on its ``hook_attn_scores`` or ``hook_pattern``, an attention
mask other than the causal one, cached keys, dropout in training mode, grouped-query heads,
``use_attn_result`` or GPT-2's ``reorder_and_upcast_attn``, a device without the kernel, or
short rows on a GPU (there the forward is bound by its launches, and the eager attention
launches fewer kernels than the fused reads).  A GPU's mask is checked without the host
waiting: `MaskCheck` reads its flags once per checkpoint and refuses a recording that ran
fused under another mask.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

__all__ = ["FusedReads", "MaskCheck", "fusable_layers", "fused_attention"]

# Set False to record every layer through the eager attention (the tests compare both).
ENABLED = True
# On a GPU, rows shorter than this run eagerly: there the forward is bound by its launches,
# and the eager attention's few kernels cost less than the fused reads' (bench_device.py on
# an H200: 512 positions 1.46x the forward eager, 1.72x fused; 2048 positions 1.26x, 1.04x).
GPU_MIN_POSITIONS = 1024

# [B, H, T, d] q, k, v -> (output [B, H, T, d], log-sum-exp [B, H, T] float32, ...)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# on a GPU: flash for half precision, memory-efficient for float32 (its log-sum-exp padded to
# a multiple of 32 positions)
_FLASH_GPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
_EFFICIENT_GPU = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)


def _known() -> dict:
    """{the eager method this module replaces: the kind of attention it computes}."""
    known = {}
    with contextlib.suppress(ImportError):
        from transformer_lens.model_bridge.generalized_components import joint_qkv_attention
        from transformer_lens.model_bridge.generalized_components import (
            joint_qkv_position_embeddings_attention as rotary,
        )

        known[joint_qkv_attention.JointQKVAttentionBridge._reconstruct_attention] = "joint"
        cls = rotary.JointQKVPositionEmbeddingsAttentionBridge
        known[cls._reconstruct_attention] = "joint_rotary"
    with contextlib.suppress(ImportError):
        from transformer_lens.model_bridge.sources.native.model import NativeAttention

        known[NativeAttention.forward] = "native"
    return known


def _kind(attn, known: dict) -> str | None:
    """The kind of `attn`'s attention where it can run fused, else None."""
    if attn.hook_attn_scores._forward_hooks or attn.hook_pattern._forward_hooks:
        return None  # someone watches what the fused path never makes
    cfg = getattr(attn, "config", None)
    joint = known.get(getattr(type(attn), "_reconstruct_attention", None))
    if joint and cfg is not None and "_reconstruct_attention" not in vars(attn):
        n_kv = getattr(cfg, "n_key_value_heads", None)
        if (
            (n_kv and n_kv != cfg.n_heads)
            or getattr(cfg, "use_attn_result", False)
            or getattr(attn, "_reorder_and_upcast_attn", False)
        ):
            return None
        return joint
    native = getattr(attn, "original_component", None)
    if known.get(getattr(type(native), "forward", None)) == "native" and (
        "forward" not in vars(native)
        and native.causal
        and native.kv_repeats == 1
        and native.attn_scores_soft_cap <= 0
    ):
        return "native"
    return None


def fusable_layers(model, last_layer: int, device, positions: int | None = None) -> dict[int, str]:
    """{layer <= `last_layer`: its kind ("joint", "joint_rotary", "native")} for the layers
    whose attention `fused_attention` can run (none where the switch, the device, the rows'
    `positions` or the model says no)."""
    kind = torch.device(device).type
    if kind == "cuda" and positions is not None and positions < GPU_MIN_POSITIONS:
        return {}
    kernel = {"cpu": _FLASH_CPU, "cuda": _EFFICIENT_GPU and _FLASH_GPU}.get(kind)
    blocks = getattr(model, "blocks", None)
    if not ENABLED or kernel is None or blocks is None or not hasattr(model, "original_model"):
        return {}  # the switch, the device, or not a bridge
    if kind == "cuda" and (
        int(model.cfg.d_head) % 8  # the GPU kernels' alignment, and their precisions
        or next(model.parameters()).dtype not in (torch.float32, torch.float16, torch.bfloat16)
    ):
        return {}
    known = _known()
    kinds = {layer: _kind(blocks[layer].attn, known) for layer in range(last_layer + 1)}
    return {layer: kind for layer, kind in kinds.items() if kind is not None}


def _scale(attn, d_head: int, rotary: bool) -> float:
    """The scale the eager method multiplies its scores by (its own rule, per class)."""
    scale = d_head**-0.5
    layer = getattr(attn, "_layer_idx", None)
    if not rotary and getattr(attn.config, "scale_attn_by_inverse_layer_idx", False):
        if layer is not None:
            scale /= float(layer + 1)
    return scale


def _causal_only(mask: Tensor | None, T: int) -> bool | Tensor:
    """Whether `mask` (None, [B, T] or a Hugging Face [B, 1, T, T] additive or boolean mask)
    masks exactly the future: no padding, no bias (an additive mask other than 0 and the
    dtype's least value counts as a bias).  On a GPU a bool on the device (`MaskCheck`
    reads it later: reading it here would make the host wait)."""
    if mask is None:
        return True
    if mask.ndim >= 4 and mask.shape[-2:] != (T, T):
        return False
    if mask.ndim < 4:  # a [B, T] mask: True where seen, or 0 added
        ok = mask.all() if mask.dtype == torch.bool else (mask == 0).all()
    else:
        ok = (mask == _causal_mask(T, mask.dtype, mask.device)).all()
    return ok if mask.device.type == "cuda" else bool(ok)


@functools.lru_cache(maxsize=8)
def _causal_mask(T: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[T, T] the causal mask as Hugging Face writes it in `dtype`: True where a key is seen
    (bool), else 0 there and the dtype's least value above the diagonal."""
    seen = torch.ones(T, T, dtype=torch.bool, device=device).tril_()
    if dtype == torch.bool:
        return seen
    return torch.zeros(T, T, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)


class MaskCheck:
    """The attention masks fused layers ran under, one check per pass (each layer of a pass
    gets the same mask): on a CPU at once, so a layer under another mask runs eagerly; on a
    GPU a flag left on the device and read by `verify` where the host waits anyway."""

    def __init__(self):
        self.mask: Tensor | None = None
        self.causal, self.pending = True, []

    def causal_for(self, mask: Tensor | None, T: int) -> bool:
        if self.mask is not mask or mask is None:
            ok = _causal_only(mask, T)
            if isinstance(ok, Tensor):
                self.pending.append(ok)
            self.mask, self.causal = mask, ok is not False
        return self.causal

    def verify(self) -> None:
        """Raise where a pass on a GPU ran fused under a mask other than the causal one."""
        pending, self.pending = self.pending, []
        if pending and not bool(torch.stack(pending).all()):
            raise RuntimeError(
                "a fused attention layer ran under an attention mask other than the causal one"
                " (padding or a bias), which it does not apply; record with"
                " scansnap_lens.recording.fused.ENABLED = False"
            )


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


def _rows(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """`t` [..., d] as rows [i, d] starting at each element offset i from its first (its last
    axis made contiguous where it is not), and its strides: the row of index (a, b, c) is
    row a s0 + b s1 + c s2, a view of `t` (no copy)."""
    t = t if t.stride(-1) == 1 else t.contiguous()
    d = t.shape[-1]
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.as_strided((span - d + 1, d), (1, 1)), t.stride()


def _flash(q: Tensor, k: Tensor, v: Tensor, scale: float, on_qk: Callable | None) -> Tensor:
    if q.device.type != "cuda":
        out, lse = _FLASH_CPU(q, k, v, is_causal=True, scale=scale)[:2]
    elif q.dtype in (torch.float16, torch.bfloat16):
        out, lse = _FLASH_GPU(q, k, v, 0.0, True, False, scale=scale)[:2]
    else:
        out, lse = _EFFICIENT_GPU(q, k, v, None, True, 0.0, True, scale=scale)[:2]
        lse = lse[..., : q.shape[2]]
    if on_qk is not None:
        on_qk(q, k, lse, scale)
    return out


def _joint(attn, eager: Callable, rotary: bool, on_qk: Callable | None, masks: MaskCheck):
    """The replacement of a joint-QKV bridge's ``_reconstruct_attention``: the eager one's
    steps, with the flash kernel for scores, softmax and the value matmul; `on_qk(q, k, lse,
    scale)` reads (it may raise to stop the forward)."""

    def method(q: Tensor, k: Tensor, v: Tensor, **kwargs):
        causal = masks.causal_for(kwargs.get("attention_mask"), q.shape[1])
        if attn.training or not causal or not _no_cached_keys(attn, kwargs):
            return eager(q, k, v, **kwargs)
        H = attn.config.n_heads
        q, k, v, B, T, d = attn._reshape_qkv_to_heads(q, k, v, H, H)
        pe = kwargs.get("position_embeddings")
        if rotary and isinstance(pe, tuple):
            cos, sin = attn._apply_position_embedding_hooks(pe)
            q, k = attn._apply_rotary_pos_emb(q, k, cos, sin)
        # no `_update_kv_cache`: the cache is empty (checked above) and the recorder's passes
        # discard it, so appending k and v to it (a copy per layer) would be wasted
        out = _flash(q, k, v, _scale(attn, d, rotary), on_qk)
        return (attn._apply_output_projection(attn._reshape_attn_output(out, B, T, H, d)), None)

    return method


def _native(mod, eager: Callable, on_qk: Callable | None):
    """The replacement of TransformerLens 4's ``NativeAttention.forward`` (the native
    bridge's attention): its steps, with the flash kernel (no pattern returned)."""

    def forward(hidden_states: Tensor, attention_mask=None, position_ids=None, **kwargs):
        if mod.training or attention_mask is not None:
            return eager(hidden_states, attention_mask, position_ids, **kwargs)
        B, T, _ = hidden_states.shape
        q, k, v = (
            proj(hidden_states).view(B, T, mod.n_heads, mod.d_head).transpose(1, 2)
            for proj in (mod.q, mod.k, mod.v)
        )
        if mod.rotary is not None:
            q, k = mod.rotary.apply_rope(q, k, position_ids=position_ids)
        out = _flash(q, k, v, 1.0 / mod.scale, on_qk)
        return mod.o(rearrange(out, "b h t d -> b t (h d)")), None

    return forward


@contextlib.contextmanager
def fused_attention(
    model,
    layers: dict[int, str],
    on_qk: Callable[[int], Callable | None],
    masks: MaskCheck | None = None,
):
    """Inside, each layer of `layers` ({layer: kind}, `fusable_layers`) runs fused attention
    and calls ``on_qk(layer)``'s reader (None: reads nothing); after, the eager methods are
    back.  `masks` checks the passes' attention masks (its `verify` is the caller's)."""
    masks = MaskCheck() if masks is None else masks
    replaced = []  # (object, attribute) set on an instance
    try:
        for layer, kind in layers.items():
            attn = model.blocks[layer].attn
            if kind == "native":
                mod = attn.original_component
                mod.forward = _native(mod, mod.forward, on_qk(layer))
                replaced.append((mod, "forward"))
            else:
                eager = attn._reconstruct_attention
                rotary = kind == "joint_rotary"
                attn._reconstruct_attention = _joint(attn, eager, rotary, on_qk(layer), masks)
                replaced.append((attn, "_reconstruct_attention"))
        yield
    finally:
        for obj, name in replaced:
            vars(obj).pop(name, None)


@dataclass
class FusedReads:
    """Where the recorder's reads of one batch lie for fused layers (kept with its indices).

    The plan's reads (head-0 flat indices into [B, H, T, T]) are re-indexed into scores
    [B, H, nb, N, S + W] that one matmul fills: each batch row's event rows in blocks of S
    query positions (`rows`: up to N per block), each block against the S + W keys its
    rows' windows of W can reach (one block of all T keys without a window, or where
    blocks would save little).  Position reads stay (row, query, key) triples; those that
    many share a line of the [T, T] scores (`lines`: the previous token's diagonal k = q - 1,
    the first token's column k = 0) are read from that line's dot products, made whole, the
    others by a dot product each.
    """

    rows: Tensor  # [B, nb, N] each block's event rows' query positions (padded with 0)
    plan: Tensor  # [J] the plan's reads, head 0's flat indices into [B, H, nb, N, S + W]
    plan_row: Tensor  # [J] their row, head 0's flat indices into [B, H, nb, N]
    zbar: Tensor | None  # [J''] `plan` at the pairs the plan holds (None: all of them)
    at: Tensor  # [n, 3] the position reads' (batch row, query, key)
    block: int  # S, query positions per block
    window: int  # W, keys before a block's first row that its rows reach (0: no window)
    # (diagonal: k = q - c, or column: k = c; c; its reads' indices into `at`, their batch
    # row, their query) per line, and the indices of the reads on none
    lines: tuple[tuple[bool, int, Tensor, Tensor, Tensor], ...] = ()
    off_lines: Tensor | None = None

    MIN_BLOCK = 32  # fewer rows per block: the matmul's calls cost more than they save
    # the fewest reads, as a share of the batch's B * T positions, that a line is made for on
    # a CPU: a line's dot products cost B T d, a read's own 2 d gathered and a multiply (at
    # Pythia-70m's shape the previous and first token's reads took 0.49 s of a checkpoint's
    # 8.0 one by one, 0.27 s by lines)
    LINE_SHARE = 0.25

    @classmethod
    def of(
        cls,
        flat: Tensor,
        n: int,
        zbar_pairs: Tensor | None,
        B: int,
        H: int,
        T: int,
        window: int | None = None,
    ) -> FusedReads:
        """From the batch's reads `flat` [n + J] (head 0 into [B, H, T, T]; the first n the
        position aggregates'; the plan's within `window` keys before their query), on the
        host."""
        b, within = flat // (H * T * T), flat % (T * T)
        q, k = within // T, within % T
        at = torch.stack([b[:n], q[:n], k[:n]], 1)
        b, q, k = b[n:], q[n:], k[n:]
        S = max(window or 0, cls.MIN_BLOCK)
        S, W = (T, 0) if not window or S + window >= T * 3 // 4 else (S, window)
        nb = -(-T // S)
        group = b * nb + q // S
        rows, inverse = torch.unique(group * T + q, return_inverse=True)
        row_group = rows // T
        counts = torch.bincount(row_group, minlength=B * nb)
        N = max(int(counts.max()) if counts.numel() else 0, 1)
        slot = torch.arange(rows.numel()) - (torch.cumsum(counts, 0) - counts)[row_group]
        padded = torch.zeros(B * nb, N, dtype=torch.long)
        padded[row_group, slot] = rows % T
        blk = q // S
        plan_row = (b * H * nb + blk) * N + slot[inverse]
        plan = plan_row * (S + W) + k - (blk * S - W)
        zbar = None if zbar_pairs is None else plan[zbar_pairs]
        lines, off_lines = cls._lines(at, B * T)
        return cls(padded.view(B, nb, N), plan, plan_row, zbar, at, S, W, lines, off_lines)

    @classmethod
    def _lines(cls, at: Tensor, positions: int) -> tuple[tuple, Tensor]:
        """The lines that at least `LINE_SHARE` of the `positions` reads of `at` [n, 3] share
        (diagonals at or below the main one first), and the indices of the reads on none."""
        lines, left = [], torch.arange(at.shape[0])
        for diagonal in (True, False):
            b, q, k = at[left].unbind(1)
            c = q - k if diagonal else k
            values, counts = torch.unique(c[c >= 0] if diagonal else c, return_counts=True)
            for value in values[counts >= max(1, cls.LINE_SHARE * positions)].tolist():
                on = c == value
                lines.append((diagonal, value, left[on], b[on], q[on]))
            taken = torch.zeros(at.shape[0], dtype=torch.bool)
            for line in lines:
                taken[line[2]] = True
            left = torch.arange(at.shape[0])[~taken]
        return tuple(lines), left

    def to(self, device, move: Callable = Tensor.to) -> FusedReads:
        """These reads on `device`, each tensor moved by `move(tensor, device)`."""

        def moved(v):
            if isinstance(v, tuple):
                return tuple(moved(x) for x in v)
            return move(v, device) if isinstance(v, Tensor) else v

        return FusedReads(*(moved(v) for v in vars(self).values()))

    def plan_scores(self, q: Tensor, k: Tensor, scale: float) -> Tensor:
        """[B, H, nb, N, S + W] float32: the scores of the event rows with their blocks' keys."""
        B, H, T, d = q.shape
        _, nb, N = self.rows.shape
        S, W = self.block, self.window
        index = self.rows.view(B, 1, nb * N, 1).expand(-1, H, -1, d)
        rows = q.gather(2, index).view(B, H, nb, N, d).float()
        # keys padded so that block j's start at j S - W: [B, H, nb, d, S + W], a view
        keys = torch.nn.functional.pad(k.float(), (0, 0, W, nb * S - T)).unfold(2, S + W, S)
        return torch.matmul(rows, keys).mul_(scale)

    def row_lse(self, lse: Tensor) -> Tensor:
        """[B, H, nb * N]: the event rows' log-sum-exp."""
        B, nb, N = self.rows.shape
        return lse.gather(2, self.rows.view(B, 1, nb * N).expand(-1, lse.shape[1], -1))

    def position_weights(
        self, q: Tensor, k: Tensor, lse: Tensor, scale: float, heads: Tensor | None
    ) -> Tensor:
        """[n, H'] the weights at the position reads, of `heads` (None: all)."""
        if not self.lines or q.device.type != "cpu":  # a GPU: each line's calls cost more
            return self._read_weights(self.at, q, k, lse, scale, heads)
        if heads is not None:
            q, k, lse = q[:, heads], k[:, heads], lse[:, heads]
        out = q.new_empty(self.at.shape[0], q.shape[1], dtype=torch.float32)
        T = q.shape[2]
        for diagonal, c, reads, b, qp in self.lines:  # [B, H', T'] a line's dot products
            if diagonal:  # k = q - c: query positions c.., keys ..T - c
                line = torch.linalg.vecdot(q[:, :, c:].float(), k[:, :, : T - c].float())
                line = line[b, :, qp - c]
            else:  # k = c
                line = torch.linalg.vecdot(q.float(), k[:, :, c : c + 1].float())[b, :, qp]
            w = line.mul_(scale).sub_(lse[b, :, qp]).clamp_max_(0).exp_()  # [reads, H'] <= 1
            out[reads] = w.masked_fill_((qp < c)[:, None], 0.0) if not diagonal else w
        if self.off_lines.numel():
            rest = self.at[self.off_lines]
            out[self.off_lines] = self._read_weights(rest, q, k, lse, scale, None)
        return out

    @staticmethod
    def _read_weights(
        at: Tensor, q: Tensor, k: Tensor, lse: Tensor, scale: float, heads: Tensor | None
    ) -> Tensor:
        """[n, H'] the weights at reads `at` [n, 3], a dot product each."""
        heads = torch.arange(q.shape[1], device=q.device) if heads is None else heads
        (q_rows, qs), (k_rows, ks), (lse_at, ls) = _rows(q), _rows(k), _rows(lse[..., None])
        out = []
        for part in at.split(1 << 16):  # [chunk, H', d] at a time
            b, qp, kp = part.unbind(1)
            # each (read, head)'s row of q and of k, and its row log-sum-exp, by one
            # contiguous gather each (indexing q[b, :, qp] took 3x as long on a CPU)
            at_q = ((b * qs[0] + qp * qs[2])[:, None] + heads * qs[1]).view(-1)
            at_k = ((b * ks[0] + kp * ks[2])[:, None] + heads * ks[1]).view(-1)
            at_lse = ((b * ls[0] + qp * ls[2])[:, None] + heads * ls[1]).view(-1)
            qq, kk = q_rows.index_select(0, at_q), k_rows.index_select(0, at_k)
            s = qq.float().mul_(kk.float()).sum(-1).mul_(scale)  # one dot product per (read, head)
            w = s.sub_(lse_at.index_select(0, at_lse)[:, 0]).clamp_max_(0).exp_()  # <= 1
            w = w.view(-1, heads.numel())
            out.append(w.masked_fill_(kp.view(-1, 1) > qp.view(-1, 1), 0.0))
        H = heads.numel()
        return out[0] if len(out) == 1 else torch.cat(out) if out else q.new_zeros(0, H)
