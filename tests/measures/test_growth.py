"""Theorem 3's growth factor on a hand-built trajectory."""

from __future__ import annotations

import math

import pytest
from _hand import groups, hand_trajectory

from scansnap_lens import measures


def test_growth_deviation_by_hand():
    # P = (0.6, 0.3); z_l0 rises by ln 2, z_l stays: r(1) = (0.6*2/0.3)^2 - 1 = 15,
    # r(0) chi = ((0.6/0.3)^2 - 1) * 4 = 12 -> deviation 3/12.
    traj = hand_trajectory(
        [0, 1],
        {(0, 1): [0.0, math.log(2)], (0, 2): [0.0, 0.0]},
        {(0, 5): {1: [0.6, 0.75], 2: [0.4, 0.25]}},
    )
    g = groups({(0, 5): {1: 0.6, 2: 0.3}}, {})
    table = measures.growth_factor(traj, g).table
    assert table["chi_l0"].tolist() == pytest.approx([1.0, 4.0])
    assert table["max_deviation"].tolist() == pytest.approx([0.0, 0.25], abs=1e-6)
