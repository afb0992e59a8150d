"""The rates a trajectory was trained with, and the theory's snap at them."""

from __future__ import annotations

import warnings

import pytest
from _hand import hand_trajectory

from scansnap_lens import measures
from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.theory import PhaseTransition


def test_rates_under_other_names_warn_instead_of_predicting_nothing_silently():
    traj = hand_trajectory([0, 10], {(0, 1): [0.0, 1.0]}, {(0, 5): {1: [1.0, 1.0]}})
    traj.meta = {"eta_y": 0.1, "eta_z": 3.0}
    with pytest.warns(UserWarning, match=r"\['eta_y', 'eta_z'\] but not lr_y and lr_z"):
        assert measures.predicted_snap(traj) is None
    traj.meta = {"lr_y": 0.1, "lr_z": 3.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measures.predicted_snap(traj)[0] > 0
    traj.meta = {"model": "pythia"}  # a pretrained model: no rates, nothing to warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measures.predicted_snap(traj) is None


def test_predicted_snap_uses_effective_rates():
    classes = syn_medium(1)
    K, M = int(classes.next_token.unique().numel()), classes.vocab_size
    plain = measures.predicted_snap(_lab_trajectory(classes, lr_z=0.1, momentum=0.0))[0]
    heavy = measures.predicted_snap(_lab_trajectory(classes, lr_z=0.01, momentum=0.9))[0]
    assert plain == pytest.approx(PhaseTransition(K=K, M=M, lr_y=1.0, lr_z=0.1).t0)
    assert heavy == pytest.approx(plain)  # 0.01 / (1 - 0.9) = 0.1: the same effective rate


def _lab_trajectory(classes, lr_z, momentum):
    """Two steps of the population Y/Z lab at eta_Y = 10 eta_Z, as a trajectory."""
    run = train_yz(classes, lr_z=lr_z, ratio=10, momentum=momentum, num_steps=2, population=True,
                   snapshot_every=1)  # fmt: skip
    return run.to_trajectory()
