"""Co-occurrence statistics and token classes on WikiText-2 (valid + test), word level.

    python analyses/wikitext_cooccurrence.py --out out/wikitext

For W = 64 and W = 128: builds the statistics (saved as safetensors), classifies context
tokens locally (guard on), and writes the distinct / common / undetermined counts of the 20
most frequent query tokens, ten example classes (m, n) with their top distinct tokens by
P(l|m, n), and the time taken.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
from _common import parser

from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.kinds import DISTINCT, token_kinds


def example_classes(stats, classes, tok, queries, k=10, top=5):
    rows = []
    for m in queries:
        nxt, counts = stats.top_next(m, k=3)
        for n, count in zip(nxt.tolist(), counts.tolist()):
            distinct = classes.distinct_tokens(m, n)
            if distinct.numel() == 0:
                continue
            tokens, probs = stats.p_context(m, n, dense=False)
            p = dict(zip(tokens.tolist(), probs.tolist()))
            best = sorted(distinct.tolist(), key=lambda l: -p.get(l, 0.0))[:top]
            rows.append(
                {
                    "query": tok.id_to_token(m),
                    "next": tok.id_to_token(n),
                    "events": count,
                    "top_distinct": " ".join(f"{tok.id_to_token(l)}({p[l]:.4f})" for l in best),
                }
            )
            break
        if len(rows) == k:
            break
    return pd.DataFrame(rows)


def main() -> None:
    p = parser(__doc__, "out/wikitext")
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    p.add_argument("--windows", type=int, nargs="+", default=[64, 128])
    p.add_argument("--min-support", type=int, default=5)
    p.add_argument("--purity", type=float, default=0.9)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.shared / "data" / "wikitext-2"
    start = time.perf_counter()
    docs = wikitext_documents(data / "valid.txt") + wikitext_documents(data / "test.txt")
    tok = word_level_tokenizer(docs)
    rows = encode_documents(tok, docs)
    timings = {"tokenize_s": round(time.perf_counter() - start, 2)}
    summary = {
        "documents": len(rows),
        "tokens": int(sum(len(r) for r in rows)),
        "vocab_size": tok.get_vocab_size(),
    }
    for W in args.windows:
        t0 = time.perf_counter()
        stats = cooccurrence(
            rows, tok.get_vocab_size(), window=W, tokenizer="wikitext-2 word level"
        )
        t1 = time.perf_counter()
        classes = token_kinds(stats, min_support=args.min_support, purity=args.purity, guard=True)
        t2 = time.perf_counter()
        stats.save(args.out / f"stats_W{W}.safetensors")
        queries, _ = stats.query_counts()
        top20 = queries[:20].tolist()
        counts = classes.counts_by_query().set_index("query").loc[top20].reset_index()
        counts.insert(1, "query_str", [tok.id_to_token(q) for q in top20])
        counts.to_csv(args.out / f"counts_W{W}.csv", index=False)
        examples = example_classes(stats, classes, tok, queries[:200].tolist())
        examples.to_csv(args.out / f"examples_W{W}.csv", index=False)
        timings[f"W{W}"] = {"count_s": round(t1 - t0, 2), "classify_s": round(t2 - t1, 2)}
        summary[f"W{W}"] = {
            "classes": stats.num_classes,
            "triples": stats.num_triples,
            "distinct_pairs": int((classes.kind == DISTINCT).sum()),
            "judged_pairs": len(classes),
        }
        print(
            f"== W = {W}: {stats.num_classes} classes, {stats.num_triples} triples,"
            f" counted in {t1 - t0:.2f} s, classified in {t2 - t1:.2f} s"
        )
        print(counts.to_string(index=False))
        print(examples.to_string(index=False, max_colwidth=90))
    summary["timings"] = timings
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
