"""Trajectories and token groups built by hand, with answers known by hand."""

from __future__ import annotations

import torch

from scansnap_lens.recording.plan import RecordPlan
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

V = 10


def hand_trajectory(steps, zbar: dict, c_hat: dict, heads=1, vocab: int = V) -> Trajectory:
    """zbar {(m, l): [value per step]}, c_hat {(m, n): {l: [value per step]}}; one layer, a
    vocabulary of `vocab` tokens."""
    pairs = sorted(zbar)
    classes = sorted(c_hat)
    triples = [(c, l) for c, key in enumerate(classes) for l in sorted(c_hat[key])]
    queries = sorted({m for m, _ in pairs} | {m for m, _ in classes})
    plan = RecordPlan(
        vocab_size=max(vocab, 1 + max(max(k) for k in [*zbar, *c_hat])),
        exclude_bos=False,
        include_self=False,
        fingerprint=0,
        queries=torch.tensor(queries),
        query_events=torch.ones(len(queries), dtype=torch.long),
        class_query=torch.tensor([m for m, _ in classes]),
        class_next=torch.tensor([n for _, n in classes]),
        class_events=torch.ones(len(classes), dtype=torch.long),
        pair_query=torch.tensor([m for m, _ in pairs]),
        pair_token=torch.tensor([l for _, l in pairs]),
        pair_count=torch.ones(len(pairs), dtype=torch.long),
        triple_class=torch.tensor([c for c, _ in triples], dtype=torch.long),
        triple_token=torch.tensor([l for _, l in triples], dtype=torch.long),
        triple_count=torch.ones(len(triples), dtype=torch.long),
    )
    S = len(steps)
    z = torch.tensor([zbar[p] for p in pairs], dtype=torch.float32).T  # [S, Pz]
    c = torch.tensor([c_hat[classes[ci]][l] for ci, l in triples], dtype=torch.float32).T
    return Trajectory(
        plan,
        torch.tensor(steps),
        [0],
        list(range(heads)),
        zbar=z[:, None, None].expand(S, 1, heads, -1).clone(),
        c_hat=c[:, None, None].expand(S, 1, heads, -1).clone(),
        entropy=torch.zeros(S, 1, heads, len(classes)),
        query_entropy=torch.zeros(S, 1, heads, len(queries)),
    )


def groups(distinct: dict, common: dict, events=None) -> TokenGroups:
    """distinct {(m, n): {l: P(l|m,n)}}, common {m: [l]}."""
    keys = sorted(distinct)
    return TokenGroups(
        query=torch.tensor([m for m, _ in keys]),
        next_token=torch.tensor([n for _, n in keys]),
        events=torch.tensor(events or [1] * len(keys)),
        distinct=[torch.tensor(sorted(distinct[k]), dtype=torch.long) for k in keys],
        distinct_p=[
            torch.tensor([distinct[k][l] for l in sorted(distinct[k])], dtype=torch.float64)
            for k in keys
        ],
        common={m: torch.tensor(v, dtype=torch.long) for m, v in common.items()},
    )
