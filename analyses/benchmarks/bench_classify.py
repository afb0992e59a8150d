"""Classification speed and memory on WikiText-2 valid+test (word level, W = 64, all queries),
local scope with the binomial guard, against counting the statistics and against the previous
sort-based grouping, both measured in the same run.

    python analyses/benchmarks/bench_classify.py [--window 64] [--shared ../shared]

Prints one JSON line: seconds to count, to classify, and for the sort-based baseline (a
lexsort of every triple by (query, token, -count), which the library did before); peak
memory (tracemalloc, numpy's allocations) of classification and of the baseline next to the
size of the statistics; the ratios.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np

from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.kinds import token_kinds


def sort_based(stats):
    """The previous grouping: every triple sorted by (query, token, -count)."""
    V = stats.vocab_size
    cls = stats.triple_class.numpy()
    count = stats.count.numpy()
    pair = stats.query.numpy()[cls] * V + stats.token.numpy()
    order = np.lexsort((-count, pair))
    pair_s, count_s = pair[order], count[order]
    starts = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1]])
    return np.add.reduceat(count_s, starts), count_s[starts]


def timed(fn, *args, **kwargs):
    """(result, seconds, first seconds, peak bytes): the best of three untraced runs, each
    result released before the next (tracing slows numpy down), the first of them (fresh
    pages from the operating system, which cost much on a virtual machine), then one run
    under tracemalloc for the peak."""
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        del out
    tracemalloc.start()
    out = fn(*args, **kwargs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, min(seconds), seconds[0], peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    p.add_argument("--quick", action="store_true", help="200 documents: it runs, no figure")
    args = p.parse_args()
    data = args.shared / "data" / "wikitext-2"
    docs = wikitext_documents(data / "valid.txt") + wikitext_documents(data / "test.txt")
    docs = docs[:200] if args.quick else docs
    tok = word_level_tokenizer(docs)
    rows = encode_documents(tok, docs)
    token_kinds(cooccurrence(rows[:50], tok.get_vocab_size(), window=8))  # compile the kernels
    stats, count_s, _, _ = timed(cooccurrence, rows, tok.get_vocab_size(), window=args.window)
    stats_bytes = sum(
        t.numel() * t.element_size()
        for t in (stats.query, stats.next_token, stats.events, stats.offsets, stats.token,
                  stats.count)
    )  # fmt: skip
    classes, classify_s, classify_first_s, classify_peak = timed(token_kinds, stats)
    _, baseline_s, _, baseline_peak = timed(sort_based, stats)
    print(
        json.dumps(
            {
                "triples": stats.num_triples,
                "pairs": len(classes),
                "count_s": round(count_s, 3),
                "classify_s": round(classify_s, 3),
                "classify_first_s": round(classify_first_s, 3),
                "sort_baseline_s": round(baseline_s, 3),
                "classify_over_count": round(classify_s / count_s, 2),
                "baseline_over_classify": round(baseline_s / classify_s, 2),
                "stats_mib": round(stats_bytes / 2**20, 1),
                "classify_peak_mib": round(classify_peak / 2**20, 1),
                "baseline_peak_mib": round(baseline_peak / 2**20, 1),
                "classify_peak_over_stats": round(classify_peak / stats_bytes, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
