"""`scan_uncertainty` at the head counts of the models users study, against the point estimates
it puts intervals on (`discriminative_bias` and `frequency_bias`), timed in the same run.

    python analyses/benchmarks/bench_uncertainty.py [--layers 6 --heads 8] [--shared ../shared]

The plan is the one `scansnap record --stats` makes by default for a model of that many
heads with d_vocab 50304 in the 64 MB checkpoint budget: 64 held-out rows of 512 WikiText-2
test tokens (word level), made for the scan's power with the training text's statistics
(valid.txt, window 512) and the report's default classification (every query whose
distinct and common tokens both occur, with a sample of its common tokens; the budget's
rest to the most frequent other queries, whole).  The trajectory's values are seeded random
walks (their numbers do not change the work), 20 checkpoints as on Pythia's schedule.
6 x 8 = 48 heads is Pythia-70m's shape, 12 x 12 = 144 Pythia-160m's.

Prints one JSON line: the plan's sizes, the queries with both kinds (the test's units),
seconds of the point estimates and of `scan_uncertainty`, their ratio, the number of heads.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.measures import discriminative_bias, frequency_bias, scan_uncertainty
from scansnap_lens.recording.budget import BYTES_PER_VALUE, CHECKPOINT_BUDGET
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

D_VOCAB = 50304  # Pythia's padded vocabulary
SEQ_LEN, ROWS, CHECKPOINTS = 512, 64, 20


def random_trajectory(plan, layers: int, heads: int, seed: int = 0) -> Trajectory:
    """Seeded random walks of the plan's size: zbar, c_hat (rows of each class summing to at
    most 1), entropies."""
    g = torch.Generator().manual_seed(seed)
    S, L, H = CHECKPOINTS, layers, heads

    def walk(n):
        return torch.randn(S, L, H, n, generator=g).mul_(0.1).cumsum_(0)

    c_hat = walk(plan.num_triples).exp_()
    totals = torch.zeros(S, L, H, plan.num_classes).index_add_(3, plan.triple_class, c_hat)
    c_hat /= totals[..., plan.triple_class] * 1.25
    return Trajectory(
        plan,
        torch.tensor([0, *[2**i for i in range(10)], *range(750, 7000, 750)][:S]),
        list(range(L)),
        list(range(H)),
        zbar=walk(plan.num_pairs),
        c_hat=c_hat,
        entropy=torch.rand(S, L, H, plan.num_classes, generator=g) * 3,
        query_entropy=torch.rand(S, L, H, plan.num_queries, generator=g) * 3,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    args = p.parse_args()
    data = args.shared / "data" / "wikitext-2"
    train_docs = wikitext_documents(data / "valid.txt")
    tok = word_level_tokenizer(train_docs)
    train = encode_documents(tok, train_docs)
    held_out = np.concatenate(encode_documents(tok, wikitext_documents(data / "test.txt")))
    rows = torch.from_numpy(held_out[: ROWS * SEQ_LEN]).long().reshape(ROWS, SEQ_LEN)

    start = time.perf_counter()
    stats = cooccurrence(train, D_VOCAB, window=SEQ_LEN)
    num_heads = args.layers * args.heads
    # the plan `scansnap record --stats` makes: for the scan's power, in the checkpoint budget
    groups = TokenGroups.from_statistics(stats)  # the report's default classification
    per_head = CHECKPOINT_BUDGET // (BYTES_PER_VALUE * num_heads) - 64**2  # 64-token prompt
    plan = plan_recording(rows, D_VOCAB, window=SEQ_LEN, groups=groups, max_slots=per_head)
    groups = TokenGroups.from_statistics(stats, queries=plan.queries.tolist())
    traj = random_trajectory(plan, args.layers, args.heads)
    setup = time.perf_counter() - start

    start = time.perf_counter()
    discriminative_bias(traj, groups), frequency_bias(traj, groups)
    point = time.perf_counter() - start
    start = time.perf_counter()
    table = scan_uncertainty(traj, groups).table
    seconds = time.perf_counter() - start
    assert len(table) == num_heads
    print(json.dumps({
        "heads": num_heads, "layers": args.layers, "checkpoints": CHECKPOINTS,
        "queries": plan.num_queries, "classes": plan.num_classes, "pairs": plan.num_pairs,
        "triples": plan.num_triples, "common_per_query": plan.common_per_query,
        "queries_with_both_kinds": float(table["auroc_n_eff"].max()),
        "group_classes": len(groups.query), "setup_s": round(setup, 1),
        "point_estimates_s": round(point, 2), "uncertainty_s": round(seconds, 2),
        "uncertainty_over_point_estimates": round(seconds / point, 2),
        "threads": torch.get_num_threads(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
