"""Brute-force reference of the recorder's aggregates: plain loops over a full cache."""

from __future__ import annotations

import math
from collections import defaultdict


def brute_force(model, tokens, exclude_bos=True, include_self=False, queries=None):
    """Dicts zbar[(layer, head, m, l)], chat[(layer, head, m, n, l)], entropy per (m, n) and m."""
    _, cache = model.run_with_cache(tokens)
    zsum, zcnt = defaultdict(float), defaultdict(int)
    csum, ev = defaultdict(float), defaultdict(int)
    esum, qsum, qev = defaultdict(float), defaultdict(float), defaultdict(int)
    first = int(exclude_bos)
    for layer in range(model.cfg.n_layers):
        S = cache[f"blocks.{layer}.attn.hook_attn_scores"].double()
        A = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        for b, row in enumerate(tokens.tolist()):
            for T in range(first + 1, len(row) - 1):
                m, n = row[T], row[T + 1]
                if queries is not None and m not in queries:
                    continue
                ctx = list(range(first, T)) + ([T] if include_self else [])
                for h in range(model.cfg.n_heads):
                    den = sum(A[b, h, T, t].item() for t in ctx)
                    ent = 0.0
                    for t in ctx:
                        l = row[t]
                        zsum[layer, h, m, l] += S[b, h, T, t].item()
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
    chat = {k: v / ev[k[2:4]] for k, v in csum.items()}
    ent = {k: v / ev[k[2:]] for k, v in esum.items()}
    qent = {k: v / qev[k[2]] for k, v in qsum.items()}
    return zbar, chat, ent, qent


def assert_matches(rec, plan, reference, layers, heads, abs_tol=1e-5):
    """Compare a CheckpointRecord against `brute_force` output, slot by slot."""
    zbar, chat, ent, qent = reference
    for j, (m, l) in enumerate(zip(plan.pair_query.tolist(), plan.pair_token.tolist())):
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.zbar[i, k, j].item(), zbar[layer, h, m, l]
                assert abs(got - want) <= abs_tol * max(1, abs(want)), (layer, h, m, l, got, want)
    for j in range(plan.num_triples):
        c = plan.triple_class[j].item()
        m, n = plan.class_query[c].item(), plan.class_next[c].item()
        l = plan.triple_token[j].item()
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                got, want = rec.chat[i, k, j].item(), chat[layer, h, m, n, l]
                assert abs(got - want) <= abs_tol, (layer, h, m, n, l, got, want)
    for c in range(plan.num_classes):
        m, n = plan.class_query[c].item(), plan.class_next[c].item()
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                assert abs(rec.entropy[i, k, c].item() - ent[layer, h, m, n]) <= abs_tol
    for q, m in enumerate(plan.queries.tolist()):
        for i, layer in enumerate(layers):
            for k, h in enumerate(heads):
                assert abs(rec.query_entropy[i, k, q].item() - qent[layer, h, m]) <= abs_tol
