"""Brute-force reference of the recorder's aggregates: plain loops over a float64 cache.

The reference runs a float64 copy of the model, so it is exact for our purposes; the recorder
runs the float32 model.  Their difference is the float32 forward pass's own rounding, bounded
by `float32_tolerance`, not by a number picked to make the test pass.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict

import torch

EPS32 = torch.finfo(torch.float32).eps


def float32_tolerance(cfg, max_abs_score: float, max_context: int) -> dict[str, float]:
    """Absolute error bounds of float32 attention aggregates against exact values.

    A score q.k is built by dot products of length d_model (q and k from the residual stream)
    and d_head (q.k); the classical forward-error bound of a length-n dot product is
    n * eps * sum|a_i b_i|, and sum|a_i b_i| <= the largest |score| times the attention scale
    over the score's own terms.  Rounding in earlier layers feeds the residual stream of later
    ones, so the bound is multiplied by the number of layers.  Weights are softmaxes of the
    scores: a score error d moves a renormalised weight by at most d * (its value) * 2, so
    the per-token attention (a sum of weights <= 1) moves by at most 2 d; the entropy of a
    renormalised row moves by at most 2 d * (1 + ln(context length)).  Means over events are
    convex combinations and add nothing but one eps per term.
    """
    d = (cfg.d_model + cfg.d_head) * EPS32 * max_abs_score * cfg.n_layers
    return {
        "zbar": d,
        "c_hat": 2 * d + 16 * EPS32,
        "entropy": 2 * d * (1 + math.log(max(max_context, 1))) + 16 * EPS32,
    }


def _float64_copy(model, in_place=False):
    exact = model if in_place else copy.deepcopy(model)
    exact.to(torch.float64)
    if hasattr(exact, "cfg") and hasattr(exact.cfg, "dtype"):
        exact.cfg.dtype = torch.float64
    return exact


def brute_force(model, tokens, exclude_bos=False, include_self=False, queries=None, in_place=False,
                window=None):  # fmt: skip
    """Dicts zbar[(layer, head, m, l)], c_hat[(layer, head, m, n, l)], entropy per (m, n) and m,
    and the float32 tolerance of comparing a recording of `model` against them.

    in_place: convert `model` itself to float64 (for models that cannot be deep-copied).
    """
    tol_model_cfg = copy.copy(model.cfg)
    exact = _float64_copy(model, in_place)
    _, cache = exact.run_with_cache(tokens)
    zsum, zcnt = defaultdict(float), defaultdict(int)
    csum, ev = defaultdict(float), defaultdict(int)
    esum, qsum, qev = defaultdict(float), defaultdict(float), defaultdict(int)
    first = int(exclude_bos)
    max_abs = 0.0
    for layer in range(model.cfg.n_layers):
        S = cache[f"blocks.{layer}.attn.hook_attn_scores"].double()
        A = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        if torch.equal(S, A):  # a bridge that shows the pattern at the scores hook
            q = cache[f"blocks.{layer}.attn.hook_q"].double()  # [batch, pos, head, d_head]
            k = cache[f"blocks.{layer}.attn.hook_k"].double()
            native = getattr(exact.blocks[layer].attn, "original_component", None)
            if getattr(native, "rotary", None) is not None:  # hook_q, hook_k are unrotated
                pos = torch.arange(q.shape[1]).expand(q.shape[0], -1)
                q, k = (t.transpose(1, 2) for t in native.rotary.apply_rope(
                    q.transpose(1, 2), k.transpose(1, 2), position_ids=pos))  # fmt: skip
            # grouped-query attention: each key head serves n_heads / n_kv query heads
            k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
            S = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        for b, row in enumerate(tokens.tolist()):
            for T in range(first + 1, len(row) - 1):
                m, n = row[T], row[T + 1]
                if queries is not None and m not in queries:
                    continue
                lo = first if window is None else max(first, T - window)
                ctx = list(range(lo, T)) + ([T] if include_self else [])
                for h in range(model.cfg.n_heads):
                    den = sum(A[b, h, T, t].item() for t in ctx)
                    ent = 0.0
                    for t in ctx:
                        l = row[t]
                        zsum[layer, h, m, l] += S[b, h, T, t].item()
                        max_abs = max(max_abs, abs(S[b, h, T, t].item()))
                        ahat = A[b, h, T, t].item() / den
                        csum[layer, h, m, n, l] += ahat
                        ent -= ahat * math.log(ahat) if ahat > 0 else 0.0
                    esum[layer, h, m, n] += ent
                    qsum[layer, h, m] += ent
                    if layer == 0 and h == 0:
                        ev[m, n] += 1
                        qev[m] += 1
                        for t in ctx:
                            zcnt[m, row[t]] += 1
    zbar = {k: v / zcnt[k[2:]] for k, v in zsum.items()}
    c_hat = {k: v / ev[k[2:4]] for k, v in csum.items()}
    ent = {k: v / ev[k[2:]] for k, v in esum.items()}
    qent = {k: v / qev[k[2]] for k, v in qsum.items()}
    tol = float32_tolerance(tol_model_cfg, max_abs, tokens.shape[1])
    return zbar, c_hat, ent, qent, tol


def assert_matches(rec, plan, reference, layers, heads):
    """Compare a CheckpointRecord against `brute_force` output, slot by slot."""
    zbar, c_hat, ent, qent, tol = reference
    for j, (m, l) in enumerate(zip(plan.pair_query.tolist(), plan.pair_token.tolist())):
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.zbar[i, k, j].item(), zbar[layer, h, m, l]
                assert abs(got - want) <= tol["zbar"], (layer, h, m, l, got, want, tol)
    for j in range(plan.num_triples):
        c = plan.triple_class[j].item()
        m, n = plan.class_query[c].item(), plan.class_next[c].item()
        l = plan.triple_token[j].item()
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.c_hat[i, k, j].item(), c_hat[layer, h, m, n, l]
                assert abs(got - want) <= tol["c_hat"], (layer, h, m, n, l, got, want, tol)
    for c in range(plan.num_classes):
        m, n = plan.class_query[c].item(), plan.class_next[c].item()
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.entropy[i, k, c].item(), ent[layer, h, m, n]
                assert abs(got - want) <= tol["entropy"], (layer, h, m, n, got, want, tol)
    for q, m in enumerate(plan.queries.tolist()):
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.query_entropy[i, k, q].item(), qent[layer, h, m]
                assert abs(got - want) <= tol["entropy"], (layer, h, m, got, want, tol)
