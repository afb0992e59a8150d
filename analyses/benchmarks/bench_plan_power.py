"""How many units the scan's test gets from a recording at Pythia's shapes: the plan made for
power (`plan_recording` with token groups, what `scansnap record --stats` makes) against the
plan of whole queries in the same budget, timed in the same run.

    python analyses/benchmarks/bench_plan_power.py [--checkpoints 154] [--shared ../shared]

The text and tokenizer are `bench_pythia.py`'s: a byte-level BPE of about 26k tokens trained
on WikiText-2, statistics of valid.txt with a window of 64, evaluation rows of test.txt (64
rows of 512 tokens for the 70m shape, 16 of 2048 for 160m), d_vocab 50304.  The budget is
the default: the 2 GB run budget shared by `--checkpoints` checkpoints (Pythia has 154),
at most 64 MB each, less the 64-token example prompt.  Prints one JSON line per shape: each
plan's sizes and bytes per checkpoint, the queries whose distinct and common tokens both
occur (the units of the scan's test), the test's n_eff (`QueryTokens`), and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from scansnap_lens.inputs.text import read_documents
from scansnap_lens.inputs.tokens import encode, load_tokenizer, rows_of
from scansnap_lens.measures.discriminative import QueryTokens
from scansnap_lens.recording.budget import BYTES_PER_VALUE, CHECKPOINT_BUDGET, RUN_BUDGET
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

sys.path.insert(0, str(Path(__file__).parent))
import bench_pythia
from bench_pythia import D_VOCAB, SHAPES, quick_shared, train_tokenizer

WINDOW, PROMPT = 64, 64
ROWS = {"70m": (64, 512), "160m": (16, 2048)}


def units(plan, groups) -> tuple[int, float]:
    """(queries with both kinds held, the scan test's n_eff) of a plan."""
    zeros = {n: torch.zeros(2, 1, 1, size) for n, size in (
        ("zbar", plan.num_pairs), ("c_hat", plan.num_triples),
        ("entropy", plan.num_classes), ("query_entropy", plan.num_queries))}  # fmt: skip
    traj = Trajectory(plan, torch.tensor([0, 1]), [0], [0], **zeros)
    try:
        held = QueryTokens.of(traj, groups)
    except ValueError:  # no query holds both kinds (a little text, its shared tokens left out)
        return 0, 0.0
    n_eff, _ = held._n_eff(held._kind_coefficient)
    return int(held.query.numel()), round(float(n_eff), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoints", type=int, default=154, help="Pythia's checkpoint count")
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    p.add_argument("--quick", action="store_true", help="a little text and few rows: it runs")
    args = p.parse_args()
    if args.quick:
        bench_pythia.BPE_VOCAB = 2000
        args.shared = quick_shared(args.shared, Path(tempfile.mkdtemp(prefix="plan_power_")))
        ROWS.update({"70m": (4, 64), "160m": (2, 128)})
    wiki = args.shared / "data" / "wikitext-2"
    with tempfile.TemporaryDirectory() as work:
        tok = load_tokenizer(str(train_tokenizer(args.shared, Path(work))))
    stats = cooccurrence(encode(tok, read_documents(wiki / "valid.txt", "wikitext")), D_VOCAB,
                         window=WINDOW)  # fmt: skip
    groups = TokenGroups.from_statistics(stats)  # the report's default classification
    test = encode(tok, read_documents(wiki / "test.txt", "wikitext"))
    for shape, (rows, seq_len) in ROWS.items():
        heads = SHAPES[shape][1] * SHAPES[shape][2]
        tokens = rows_of(test, seq_len)[:rows]
        per_checkpoint = min(CHECKPOINT_BUDGET, RUN_BUDGET // args.checkpoints)
        max_slots = per_checkpoint // (BYTES_PER_VALUE * heads) - PROMPT**2
        line = {"shape": shape, "rows": rows, "seq_len": seq_len, "heads": heads,
                "checkpoints": args.checkpoints, "budget_bytes": per_checkpoint}  # fmt: skip
        for name, options in (("power", {"groups": groups}), ("whole_queries", {})):
            start = time.perf_counter()
            plan = plan_recording(tokens, D_VOCAB, window=WINDOW, max_slots=max_slots, **options)
            seconds = time.perf_counter() - start
            both, n_eff = units(plan, groups)
            line[name] = {
                "queries": plan.num_queries, "classes": plan.num_classes,
                "pairs": plan.num_pairs, "triples": plan.num_triples,
                "bytes_per_checkpoint": BYTES_PER_VALUE * heads * (plan.num_slots + PROMPT**2),
                "queries_with_both_kinds": both, "scan_n_eff": n_eff, "s": round(seconds, 2),
            }  # fmt: skip
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
