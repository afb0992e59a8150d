"""The paper's synthetic experiments as calls: the Fig. 6 sweep, Figs. 11-12 recall."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from scansnap_lens.lab import (
    distinct_recall,
    entropy_sweep,
    recall_sweep,
    summarize_sweep,
)
from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.lab.yz import train_yz


def test_sweep_trends_and_summary():
    per_seed = entropy_sweep(
        num_last=(1,), lr_z=(0.5, 3.0), ratio=(2.0, 10.0), seeds=3, num_steps=100, progress=False
    )
    summary = summarize_sweep(per_seed)
    assert list(summary.columns) == [
        "num_last",
        "lr_z",
        "ratio",
        "entropy_mean",
        "entropy_std",
        "n_seeds",
    ]
    assert len(summary) == 4 and (summary["n_seeds"] == 3).all()
    cell = per_seed[(per_seed.lr_z == 3.0) & (per_seed.ratio == 2.0)]["entropy"]
    row = summary[(summary.lr_z == 3.0) & (summary.ratio == 2.0)].iloc[0]
    assert row.entropy_std == pytest.approx(np.std(cell, ddof=1))
    mean = summary.set_index(["lr_z", "ratio"])["entropy_mean"]
    assert mean[(3.0, 2.0)] < mean[(0.5, 2.0)]  # larger eta_Z: sparser
    assert mean[(3.0, 10.0)] > mean[(3.0, 2.0)]  # fixed eta_Z, larger eta_Y: denser
    assert (per_seed["entropy"] < math.log(10)).all()


def test_distinct_recall_counts_retrieved_distinct_tokens():
    """Figs. 11-12's recall against loops over classes and tokens, with the two ends known:
    every distinct token has positive attention (recall 1 at threshold 0), none exceeds 1."""
    run = train_yz(syn_medium(2), [0.5, 3.0], 2.0, seeds=[0, 1], init="uniform", num_steps=30)
    classes, att = run.classes, run.attention()[-1]
    owner = classes.distinct_for()
    x = [0.0, 0.5 / classes.vocab_size, 2.0 / classes.vocab_size, 1.0]
    got = distinct_recall(run, x)
    for r in range(run.num_runs):
        for j, threshold in enumerate(x):
            shares = []
            for k in range(classes.num_classes):
                distinct = [l for l in range(classes.vocab_size) if owner[l] == k]
                shares.append(
                    sum(float(att[r, k, l]) > threshold for l in distinct) / len(distinct)
                )
            assert got[r, j].item() == pytest.approx(sum(shares) / len(shares), abs=1e-12)
    assert (got[:, 0] == 1).all() and (got[:, -1] == 0).all()
    assert (torch.diff(got, dim=1) <= 0).all()  # recall never rises with the threshold
    table = recall_sweep(lr_z=(0.5,), ratio=(2.0, 5.0), threshold_factors=(0.5, 2.0), seeds=2,
                         num_steps=10, progress=False)  # fmt: skip
    assert len(table) == 2 * 2 * 2
    assert sorted(set(table["threshold"] * 33)) == pytest.approx([0.5, 2.0])  # M = 33


def test_lab_training_is_one_config_saved_with_the_run(tmp_path):
    """Keywords override the config's fields; the config saves and loads exactly; a sweep
    with ``training=`` equals one with the same fields as keywords."""
    from scansnap_lens.lab import LabTraining

    training = LabTraining(seeds=2, num_steps=20, momentum=0.0)
    assert LabTraining.load(training.save(tmp_path / "training.json")) == training
    grid = dict(num_last=(1,), lr_z=(1.0,), ratio=(2.0,), progress=False)
    by_config = entropy_sweep(**grid, training=training)
    by_keywords = entropy_sweep(**grid, seeds=2, num_steps=20, momentum=0.0)
    pd.testing.assert_frame_equal(by_config, by_keywords)
    assert len(by_config) == 2
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        LabTraining(seeds=0)
    with pytest.raises(TypeError, match="learning_rate"):
        entropy_sweep(**grid, learning_rate=0.1)
