"""Discriminative bias on a hand-built trajectory, and against a loop over queries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _hand import groups, hand_trajectory
from _tiny import QUIET, V, tiny_model
from scipy.stats import rankdata

from scansnap_lens import measures
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import record_trajectory
from scansnap_lens.statistics.groups import TokenGroups


def test_discriminative_bias_by_hand_with_ties():
    traj = hand_trajectory(
        [0, 10],
        {(0, 1): [0.5, 1.5], (0, 2): [0.0, 3.0], (0, 3): [1.0, 0.0], (0, 4): [2.0, 2.0]},
        {(0, 5): {1: [0.25, 0.25], 2: [0.25, 0.25], 3: [0.25, 0.25], 4: [0.25, 0.25]}},
    )
    g = groups({(0, 5): {1: 0.5, 2: 0.5}}, {0: [3, 4]})
    table = measures.discriminative_bias(traj, g).table
    # dz distinct = {1, 3}, common = {-1, 0}: bias = 2 - (-0.5) = 2.5, every pair ordered
    assert table["bias"].tolist() == pytest.approx([0.0, 2.5])
    assert table["auroc"].tolist() == pytest.approx([0.5, 1.0])
    # a tie: distinct dz {0, 1} against common dz {0} -> (0.5 + 1) / 2
    traj.zbar[1, 0, 0, 1] = traj.zbar[0, 0, 0, 1]  # pair (0, 2) frozen
    traj.zbar[1, 0, 0, 0] = traj.zbar[0, 0, 0, 0] + 1
    g_tie = groups({(0, 5): {1: 0.5, 2: 0.5}}, {0: [4]})
    assert measures.discriminative_bias(traj, g_tie).final()["auroc"].item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="both distinct and common"):
        measures.discriminative_bias(traj, groups({(0, 5): {1: 0.5}}, {}))


@pytest.mark.tl
def test_discriminative_bias_equals_a_loop_over_queries(tmp_path):
    """Every query at once (segment sums and ranks) gives what a loop over queries with scipy's
    rankdata gives: a recorded trajectory of 2 layers x 4 heads, logits rounded so that ties
    occur, kinds drawn at random, and tokens the recording does not hold among them."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V - 2, (6, 16), generator=g)  # V - 2, V - 1 never occur
    plan = plan_recording(tokens, V)
    models = {0: tiny_model(seed=0), 5: tiny_model(seed=1), 9: tiny_model(seed=2)}
    traj = record_trajectory(in_memory(models), tokens, tmp_path / "t", QUIET, plan=plan)
    traj = traj.replace(zbar=torch.round(traj.zbar.full() * 4) / 4)
    query, next_token, events, distinct, distinct_p, common = [], [], [], [], [], {}
    for m in plan.queries.tolist():
        pool = torch.cat([plan.pair_token[plan.pair_query == m], torch.tensor([V - 2, V - 1])])
        pool = pool[torch.randperm(pool.numel(), generator=g)]
        cut = int(torch.randint(1, pool.numel(), (1,), generator=g))
        common[m] = pool[cut:] if m % 4 else torch.tensor([V - 2, V - 1])  # none held
        for n in plan.class_next[plan.class_query == m].tolist():  # parts of the distinct ones
            part = pool[:cut][torch.rand(cut, generator=g) < 0.7]
            query.append(m), next_token.append(n), events.append(int(torch.randint(1, 9, (1,))))
            distinct.append(part), distinct_p.append(torch.full((part.numel(),), 0.5).double())
    kinds = TokenGroups(torch.tensor(query), torch.tensor(next_token), torch.tensor(events),
                        distinct, distinct_p, common)  # fmt: skip

    z = traj.zbar.double()
    dz = (z - z[:1]).numpy()  # [S, L, H, Pz]
    bias, auroc, weights = [], [], []
    for m in sorted(set(query)):
        mine = [k for k, q in enumerate(query) if q == m]
        d = plan.pair_slot(m, torch.unique(torch.cat([distinct[k] for k in mine])))
        c = plan.pair_slot(m, common[m])
        d, c = d[d >= 0].numpy(), c[c >= 0].numpy()
        if not (len(d) and len(c)):
            continue
        ranks = rankdata(np.concatenate([dz[..., d], dz[..., c]], -1), axis=-1)
        bias.append(dz[..., d].mean(-1) - dz[..., c].mean(-1))
        auroc.append((ranks[..., : len(d)].sum(-1) - len(d) * (len(d) + 1) / 2)
                     / (len(d) * len(c)))  # fmt: skip
        weights.append(sum(events[k] for k in mine))
    assert 3 <= len(weights) < len(set(query))  # some queries keep both kinds, some not

    measured = measures.discriminative_bias(traj, kinds)
    for name, values in (("bias", bias), ("auroc", auroc)):
        expected = np.mean(np.stack(values, -1), axis=-1)  # every query counts once
        np.testing.assert_allclose(measured.tensor(name).numpy(), expected, rtol=1e-12, atol=1e-12)
    assert measured.table["bias_queries"].iloc[0] == len(weights)
