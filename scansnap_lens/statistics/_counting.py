"""Compiled kernels for co-occurrence counting (numba).  Internal: use `statistics.corpus`.

Events are grouped by class (m, n) first; each class then walks the context windows of its
events into a dense per-thread counter over the vocabulary, so the work is one increment per
(event, context position) with no hashing or sorting of triples.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def find_events(tokens, row_starts, window, skip_bos, track_query, track_next):
    """Event positions T (index into ``tokens``) and the first context position of each.

    Context of T: max(row_start + skip_bos, T - window) <= t <= T - 1; T + 1 must be in the row.
    ``window <= 0`` means the whole row.
    """
    n = tokens.shape[0]
    positions = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    count = 0
    for r in range(row_starts.shape[0] - 1):
        lo = row_starts[r] + skip_bos
        hi = row_starts[r + 1]
        for t in range(lo + 1, hi - 1):
            if not track_query[tokens[t]] or not track_next[tokens[t + 1]]:
                continue
            first = lo if window <= 0 else max(lo, t - window)
            positions[count] = t
            starts[count] = first
            count += 1
    return positions[:count], starts[:count]


@numba.njit(parallel=True, cache=True)
def distinct_per_class(tokens, positions, starts, class_bounds, vocab_size, num_blocks):
    """First pass: the number of distinct context tokens of each class [K].

    Events are sorted by class; ``class_bounds`` [K + 1] delimits the events of each class.
    """
    num_classes = class_bounds.shape[0] - 1
    distinct = np.zeros(num_classes, np.int64)
    block = (num_classes + num_blocks - 1) // num_blocks
    for b in numba.prange(num_blocks):
        seen = np.zeros(vocab_size, np.bool_)
        touched = np.empty(vocab_size, np.int64)
        for c in range(b * block, min(num_classes, (b + 1) * block)):
            used = 0
            for e in range(class_bounds[c], class_bounds[c + 1]):
                for t in range(starts[e], positions[e]):
                    tok = tokens[t]
                    if not seen[tok]:
                        seen[tok] = True
                        touched[used] = tok
                        used += 1
            distinct[c] = used
            for i in range(used):
                seen[touched[i]] = False
    return distinct


@numba.njit(parallel=True, cache=True)
def fill_triples(tokens, positions, starts, class_bounds, vocab_size, num_blocks, offsets):
    """Second pass: (token, count) of each class written at ``offsets`` [K + 1], tokens in
    order of first occurrence (sorting them would double the cost; merging sorts anyway)."""
    num_classes = class_bounds.shape[0] - 1
    out_token = np.empty(offsets[-1], np.int32)
    out_count = np.empty(offsets[-1], np.int64)
    block = (num_classes + num_blocks - 1) // num_blocks
    for b in numba.prange(num_blocks):
        counter = np.zeros(vocab_size, np.int64)
        for c in range(b * block, min(num_classes, (b + 1) * block)):
            base = offsets[c]
            used = 0
            for e in range(class_bounds[c], class_bounds[c + 1]):
                for t in range(starts[e], positions[e]):
                    tok = tokens[t]
                    if counter[tok] == 0:
                        out_token[base + used] = tok
                        used += 1
                    counter[tok] += 1
            for i in range(used):
                tok = out_token[base + i]
                out_count[base + i] = counter[tok]
                counter[tok] = 0
    return out_token, out_count


@numba.njit(cache=True)
def _query_pairs(
    lo, hi, class_offsets, token, count, stamp, mark, support, top, top_class, num_next, touched
):
    """Accumulate the triples of classes lo..hi-1 (one query) per context token; returns how
    many tokens were touched (listed in ``touched``)."""
    n_touched = 0
    for c in range(lo, hi):
        for i in range(class_offsets[c], class_offsets[c + 1]):
            t = token[i]
            k = count[i]
            if stamp[t] != mark:
                stamp[t] = mark
                support[t] = 0
                top[t] = -1
                num_next[t] = 0
                touched[n_touched] = t
                n_touched += 1
            support[t] += k
            num_next[t] += 1
            if k > top[t]:  # classes come in order of n: the first maximum wins ties
                top[t] = k
                top_class[t] = c
    return n_touched


@numba.njit(parallel=True, cache=True)
def pair_counts(query_bounds, class_offsets, token, vocab_size, block_bounds):
    """[Q] the number of distinct context tokens of each query: `pair_summary`'s output
    sizes.  Arguments as there."""
    Q = query_bounds.shape[0] - 1
    sizes = np.zeros(Q, np.int64)
    for b in numba.prange(block_bounds.shape[0] - 1):
        stamp = np.full(vocab_size, -1, np.int64)
        for q in range(block_bounds[b], block_bounds[b + 1]):
            n = 0
            for i in range(class_offsets[query_bounds[q]], class_offsets[query_bounds[q + 1]]):
                t = token[i]
                if stamp[t] != q:
                    stamp[t] = q
                    n += 1
            sizes[q] = n
    return sizes


@numba.njit(parallel=True, cache=True)
def pair_summary(
    query_bounds,
    class_offsets,
    token,
    count,
    vocab_size,
    block_bounds,
    query_ids,
    class_next,
    class_total,
    starts,
    out,
    base,
):
    """Per (query, context token) pair, sorted by query then token, written into ``out``
    (seven int64 arrays [Pz]): the query id, the token, its support (occurrences over the
    query's classes), its top count, the next token of the top count (ties: the smallest),
    the number of classes it occurs in, the query's number of next tokens; and into ``base``
    (float64 [Pz]) the share of that next token among the query's context positions.

    query_bounds: [Q + 1] the classes of each query (classes sorted by (m, n)); class_offsets:
    [K + 1] CSR offsets of the triples; block_bounds: [B + 1] the queries of each block (the
    blocks run in parallel, each with its own O(vocab) counters); query_ids [Q]; class_next
    [K]; class_total [K] context positions of each class; starts [Q + 1] each query's first
    pair (cumulative `pair_counts`).  Work O(triples + pairs log pairs-per-query), memory
    O(vocab x threads) beyond the output, which the caller allocates: no sort of triples.
    """
    for b in numba.prange(block_bounds.shape[0] - 1):
        stamp = np.full(vocab_size, -1, np.int64)
        support = np.zeros(vocab_size, np.int64)
        top = np.zeros(vocab_size, np.int64)
        top_class = np.zeros(vocab_size, np.int64)
        num_next = np.zeros(vocab_size, np.int64)
        touched = np.empty(vocab_size, np.int64)
        for q in range(block_bounds[b], block_bounds[b + 1]):
            lo, hi = query_bounds[q], query_bounds[q + 1]
            args = (class_offsets, token, count, stamp, q, support, top, top_class, num_next)
            n = _query_pairs(lo, hi, *args, touched)
            tokens = np.sort(touched[:n])
            query_total = 0.0
            for c in range(lo, hi):
                query_total += class_total[c]
            at = starts[q]
            for j in range(n):
                t = tokens[j]
                out[0][at + j] = query_ids[q]
                out[1][at + j] = t
                out[2][at + j] = support[t]
                out[3][at + j] = top[t]
                out[4][at + j] = class_next[top_class[t]]
                out[5][at + j] = num_next[t]
                out[6][at + j] = hi - lo
                base[at + j] = class_total[top_class[t]] / query_total


@numba.njit(parallel=True, cache=True)
def whole_share_p_values(support, base, rivals):
    """min(1, rivals * base ** support): the Bonferroni-corrected binomial p-value of a token
    whose occurrences all go to one next token (P(X = support), X ~ Bin(support, base))."""
    out = np.empty(support.shape[0], np.float64)
    for i in numba.prange(support.shape[0]):
        out[i] = min(1.0, rivals[i] * base[i] ** support[i])
    return out


@numba.njit(parallel=True, cache=True)
def merge_triples(
    in_a, in_b, a_offsets, a_token, a_count, b_offsets, b_token, b_count, vocab_size, num_blocks
):
    """The triples of two statistics added, class by class, in one linear pass (no sort).

    in_a, in_b: [K] the index of each class of the union in a and in b (-1: absent there);
    the rest are the two CSR layouts.  Returns (offsets [K + 1], token, count): within a
    class a's tokens in a's order, then b's new tokens in b's order.
    """
    K = in_a.shape[0]
    sizes = np.zeros(K, np.int64)
    block = (K + num_blocks - 1) // num_blocks
    for blk in numba.prange(num_blocks):  # pass 1: the size of each merged class
        mark = np.full(vocab_size, -1, np.int64)
        for k in range(blk * block, min(K, (blk + 1) * block)):
            n = 0
            if in_a[k] >= 0:
                for i in range(a_offsets[in_a[k]], a_offsets[in_a[k] + 1]):
                    mark[a_token[i]] = k
                    n += 1
            if in_b[k] >= 0:
                for i in range(b_offsets[in_b[k]], b_offsets[in_b[k] + 1]):
                    if mark[b_token[i]] != k:
                        n += 1
            sizes[k] = n
    offsets = np.zeros(K + 1, np.int64)
    offsets[1:] = np.cumsum(sizes)
    token = np.empty(offsets[K], a_token.dtype)
    count = np.empty(offsets[K], np.int64)
    for blk in numba.prange(num_blocks):  # pass 2: fill
        mark = np.full(vocab_size, -1, np.int64)
        where = np.empty(vocab_size, np.int64)
        for k in range(blk * block, min(K, (blk + 1) * block)):
            at = offsets[k]
            if in_a[k] >= 0:
                for i in range(a_offsets[in_a[k]], a_offsets[in_a[k] + 1]):
                    t = a_token[i]
                    mark[t] = k
                    where[t] = at
                    token[at] = t
                    count[at] = a_count[i]
                    at += 1
            if in_b[k] >= 0:
                for i in range(b_offsets[in_b[k]], b_offsets[in_b[k] + 1]):
                    t = b_token[i]
                    if mark[t] == k:
                        count[where[t]] += b_count[i]
                    else:
                        token[at] = t
                        count[at] = b_count[i]
                        at += 1
    return offsets, token, count
