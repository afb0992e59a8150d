"""The one step language: training's checkpoint schedule and a recording's selection of
checkpoints read "every k-th", "log:N" and lists the same way."""

from __future__ import annotations

import math
import random

import pytest

from scansnap_lens.models.steps import select_steps
from scansnap_lens.models.training import schedule


def _log_spaced_reference(available: list[int], n: int) -> list[int]:
    """Brute force: for each target, the nearest step not chosen yet, over all steps."""
    lo, hi = available[0] + 1, available[-1] + 1
    chosen: list[int] = []
    for i in range(n):
        target = math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)) - 1
        free = [s for s in available if s not in chosen]
        chosen.append(min(free, key=lambda s: abs(math.log1p(s) - math.log1p(target))))
    return sorted(chosen)


def test_log_spacing_equals_brute_force_and_gives_exactly_n_steps():
    rng = random.Random(0)
    for _ in range(500):
        available = sorted(rng.sample(range(5000), rng.randint(3, 60)))
        n = rng.randint(2, len(available) - 1)
        got = select_steps(available, f"log:{n}")
        assert got == _log_spaced_reference(available, n)
        assert len(got) == n and got[0] == available[0] and got[-1] == available[-1]


def test_training_saves_the_steps_a_recording_would_select():
    """A run trained with ``checkpoints=x`` holds exactly the steps that ``steps=x`` picks
    among all of its steps (plus the last), so one spelling means one set everywhere."""
    for total, every in [(250, "log:15"), (2000, "log:20"), (100, 7), (100, [3, 50])]:
        saved = schedule(total, every)
        assert saved == sorted(set(select_steps(range(total + 1), every)) | {0, total})
    assert len(schedule(250, "log:15")) == 15  # N log-spaced steps, not fewer
    assert schedule(100, 25) == [0, 25, 50, 75, 100]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (0, "k >= 1"),
        (20, "leaves only the first"),
        ("log:1", "N >= 2"),
        ("every 3", "'all', 'log:N', an int or a list"),
        ([4, 99], r"steps \[99\] are not available"),
        (True, "an int or a list"),
    ],
)
def test_bad_steps_name_the_problem(steps, message):
    with pytest.raises(ValueError, match=message):
        select_steps(range(0, 20, 2), steps)
