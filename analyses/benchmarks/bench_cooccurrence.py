"""Co-occurrence counting throughput on WikiText-2 valid+test (word level, W = 64, all queries).

    python analyses/benchmarks/bench_cooccurrence.py [--window 64] [--shared ../shared]

Prints one JSON line: triples counted, triples per second of the library, of a plain Python
dict reference and of a numpy sort-and-count reference (both on a prefix of the corpus,
scaled by their own triple counts), and the peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import Counter
from pathlib import Path

import numpy as np

from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.statistics.corpus import cooccurrence


def python_reference(rows, window):
    triples, n = Counter(), 0
    for row in rows:
        row = row.tolist()
        for T in range(1, len(row) - 1):
            m, nxt = row[T], row[T + 1]
            for t in range(max(0, T - window), T):
                triples[(m, nxt, row[t])] += 1
                n += 1
    return n


def numpy_reference(rows, window, vocab):
    keys = []
    for row in rows:
        L = len(row)
        for d in range(1, window + 1):
            T = np.arange(max(1, d), L - 1)
            keys.append((row[T] * vocab + row[T + 1]) * vocab + row[T - d])
    keys = np.concatenate(keys)
    np.unique(keys, return_counts=True)
    return keys.size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    p.add_argument("--quick", action="store_true", help="200 documents: it runs, no figure")
    p.add_argument("--reference-tokens", type=int, default=60_000, help="prefix for the references")
    args = p.parse_args()
    data = args.shared / "data" / "wikitext-2"
    docs = wikitext_documents(data / "valid.txt") + wikitext_documents(data / "test.txt")
    docs = docs[:200] if args.quick else docs
    tok = word_level_tokenizer(docs)
    rows = encode_documents(tok, docs)
    vocab = tok.get_vocab_size()

    cooccurrence(rows[:2], vocab, window=args.window)  # compile (cached after the first run)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        stats = cooccurrence(rows, vocab, window=args.window)
        best = min(best, time.perf_counter() - start)
    triples = int(stats.count.sum())

    prefix, size = [], 0
    for row in rows:
        prefix.append(row[: args.reference_tokens - size])
        size += len(prefix[-1])
        if size >= args.reference_tokens:
            break
    start = time.perf_counter()
    n_py = python_reference(prefix, args.window)
    py_s = time.perf_counter() - start
    start = time.perf_counter()
    n_np = numpy_reference(prefix, args.window, vocab)
    np_s = time.perf_counter() - start
    assert n_np == n_py

    result = {
        "tokens": int(sum(len(r) for r in rows)),
        "window": args.window,
        "triples": triples,
        "distinct_triples": stats.num_triples,
        "lib_seconds": round(best, 3),
        "lib_triples_per_s": round(triples / best),
        "naive_triples_per_s": round(n_py / py_s),
        "numpy_triples_per_s": round(n_np / np_s),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    result["ratio_vs_numpy"] = round(result["lib_triples_per_s"] / result["numpy_triples_per_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
