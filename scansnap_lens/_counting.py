"""Compiled kernels for co-occurrence counting (numba).  Internal: use `scansnap_lens.corpus`.

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
    """First pass: the number of distinct context tokens of each class [C].

    Events are sorted by class; ``class_bounds`` [C + 1] delimits the events of each class.
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
    """Second pass: (token, count) of each class written at ``offsets`` [C + 1], tokens in
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
def _query_pairs(lo, hi, class_offsets, token, count, stamp, mark, support, top, top_class,
                 num_next, touched):  # fmt: skip
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


@numba.njit(cache=True)
def pair_summary(query_bounds, class_offsets, token, count, vocab_size):
    """Per (query, context token) pair, sorted by query then token: the token, its support
    (occurrences over the query's classes), top count, the class of the top count (ties: the
    smallest next token) and the number of classes it occurs in.

    query_bounds: [Q + 1] the classes of each query (classes sorted by (m, n)); class_offsets:
    [C + 1] CSR offsets of the triples.  Work O(triples + pairs log pairs-per-query), memory
    O(vocab) beyond the output: no sort of the triples.
    """
    V = vocab_size
    stamp = np.full(V, -1, np.int64)
    support = np.zeros(V, np.int64)
    top = np.zeros(V, np.int64)
    top_class = np.zeros(V, np.int64)
    num_next = np.zeros(V, np.int64)
    touched = np.empty(V, np.int64)
    Q = query_bounds.shape[0] - 1
    sizes = np.zeros(Q, np.int64)
    for q in range(Q):  # pass 1: the output size
        lo, hi = query_bounds[q], query_bounds[q + 1]
        args = (class_offsets, token, count, stamp, q, support, top, top_class, num_next)
        sizes[q] = _query_pairs(lo, hi, *args, touched)
    total = sizes.sum()
    out_query = np.empty(total, np.int64)
    out_token = np.empty(total, np.int64)
    out_support = np.empty(total, np.int64)
    out_top = np.empty(total, np.int64)
    out_class = np.empty(total, np.int64)
    out_next = np.empty(total, np.int64)
    stamp[:] = -1
    at = 0
    for q in range(Q):  # pass 2: fill, tokens ascending within the query
        lo, hi = query_bounds[q], query_bounds[q + 1]
        args = (class_offsets, token, count, stamp, q, support, top, top_class, num_next)
        n = _query_pairs(lo, hi, *args, touched)
        tokens = np.sort(touched[:n])
        for j in range(n):
            t = tokens[j]
            out_query[at] = q
            out_token[at] = t
            out_support[at] = support[t]
            out_top[at] = top[t]
            out_class[at] = top_class[t]
            out_next[at] = num_next[t]
            at += 1
    return out_query, out_token, out_support, out_top, out_class, out_next
