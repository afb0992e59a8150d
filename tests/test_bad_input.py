"""Library calls refuse bad arguments at the door, naming the argument, instead of failing in
numpy, torch or pathlib internals."""

from __future__ import annotations

import pytest
import torch

import scansnap_lens as ss
from scansnap_lens.lab.calibration import Scenario, crossed_run


@pytest.fixture(scope="module")
def traj():
    return crossed_run(Scenario(queries=3), heads=1)[0]


ROWS = torch.tensor([[1, 2, 3, 4], [2, 3, 1, 4]])


def _groups(**counts):
    """Groups made by hand (one class of query 0 and next token 1), with corpus counts."""
    return ss.TokenGroups(torch.tensor([0]), torch.tensor([1]), torch.tensor([4]),
                          [torch.tensor([2])], [torch.tensor([1.0])], {0: torch.tensor([3])},
                          **counts)  # fmt: skip


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: ss.cooccurrence(ROWS, -1), ValueError, "vocab_size must be a positive"),
        (lambda t: ss.cooccurrence(ROWS.float(), 5), ValueError, "must be integers"),
        (lambda t: ss.measures.snap_step(torch.tensor([0, 1, 2]), torch.ones(5)), ValueError,
         r"moves must be \[\.\.\., S - 1\]"),
        (lambda t: ss.measures.snap_step(torch.tensor([]), torch.ones(0)), ValueError,
         "S >= 2"),
        (lambda t: ss.TokenGroups.from_statistics(None), TypeError, "needs CooccurrenceStats"),
        (lambda t: ss.summarize(t, "groups"), TypeError, "groups must be TokenGroups"),
        (lambda t: ss.summarize("traj"), TypeError, "traj must be a Trajectory"),
        (lambda t: ss.save_tokens(ROWS, "out.safetensors"), TypeError, "arguments swapped"),
        (lambda t: ss.plan_recording(ROWS.float(), 5), ValueError, "integer ids"),
        (lambda t: _groups(token_count=torch.ones(5)), ValueError,
         "token_count given without pair_count and pair_key: the scan's frequency control"),
        (lambda t: _groups(token_count=torch.ones(5), pair_key=torch.tensor([1, 2]),
                           pair_count=torch.tensor([3])), ValueError, "differ in shape"),
        (lambda t: _groups(shared=torch.tensor([[1.5]])), ValueError,
         "shared must be a 1-D tensor of token ids"),
        (lambda t: _groups(shared=torch.tensor([-3])), ValueError,
         "shared must be a 1-D tensor of token ids"),
        (lambda t: ss.Recorder("never_made", ROWS, settings={"window": 3}), TypeError,
         "settings must be RecordingSettings, got dict"),
        (lambda t: ss.Analysis.of(t, settings={"theory": False}), TypeError,
         "settings must be AnalysisSettings, got dict"),
        (lambda t: ss.Analysis.of("traj"), TypeError, "traj must be a Trajectory"),
        (lambda t: ss.Analysis.of(t, "groups"), TypeError, "groups must be TokenGroups"),
    ],
    ids=["negative-vocab", "float-tokens", "snap-mismatch", "snap-empty", "groups-none",
         "groups-str", "traj-str", "save-swapped", "plan-floats", "groups-word-count-only",
         "groups-pairs-unequal", "groups-shared-floats", "groups-shared-negative",
         "recorder-settings-dict", "analysis-settings-dict", "analysis-traj-str",
         "analysis-groups-str"],
)  # fmt: skip
def test_bad_arguments_are_refused_at_the_door(traj, call, error, match):
    with pytest.raises(error, match=match):
        call(traj)
