"""Discriminative bias on a hand-built trajectory."""

from __future__ import annotations

import pytest
from _hand import groups, hand_trajectory

from scansnap_lens import measures


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
