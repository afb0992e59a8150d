"""Frequency bias on a hand-built trajectory."""

from __future__ import annotations

import math

import pytest
from _hand import groups, hand_trajectory

from scansnap_lens import measures


def test_frequency_bias_spearman_weighting_and_single_token_class():
    traj = hand_trajectory(
        [0, 5],
        {
            (0, 1): [0, 1],
            (0, 2): [0, 3],
            (0, 3): [0, 2],
            (1, 4): [0, 2],
            (1, 5): [0, 1],
            (2, 6): [0, 4],
        },
        {
            (0, 7): {1: [1 / 3] * 2, 2: [1 / 3] * 2, 3: [1 / 3] * 2},
            (1, 8): {4: [0.5] * 2, 5: [0.5] * 2},
            (2, 9): {6: [1.0] * 2},
        },
    )
    g = groups(
        {(0, 7): {1: 0.1, 2: 0.2, 3: 0.7}, (1, 8): {4: 0.3, 5: 0.7}, (2, 9): {6: 1.0}},
        {},
        events=[1, 3, 5],
    )
    result = measures.frequency_bias(traj, g)
    final = result.final()
    # class (0, 7): ranks dz (1, 3, 2) vs P (1, 2, 3) -> rho = 0.5; class (1, 8): rho = -1;
    # class (2, 9) has one distinct token and is left out; weights N = 1 and 3.
    assert final["spearman"].item() == pytest.approx((0.5 * 1 - 1.0 * 3) / 4)
    assert final["spearman_classes"].item() == 2
    assert math.isnan(result.table["spearman"].iloc[0])  # dz is flat at the first step
