"""The one language for choosing checkpoint steps, when training saves them and when a
recording reads them.

Among the available steps (every step 0..N when training), `steps` is:

- ``None`` or ``"all"``: every one;
- an int k: every k-th, starting with the first (when training: every k steps);
- ``"log:N"``: the N steps nearest to log-spaced targets between the first and the last
  (in log(1 + step)), each chosen once, the first and last included;
- a list of steps, each of which must be available.

>>> labels = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 3000]
>>> select_steps(labels, 4)
[0, 8, 128, 2000]
>>> select_steps(labels, "log:4")
[0, 16, 256, 3000]
>>> select_steps(range(101), "log:5")  # training: steps 0..100
[0, 2, 9, 31, 100]
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable

__all__ = ["Steps", "select_steps"]

# The step language: None or "all", an int k (every k-th), "log:N", or a list of steps.
Steps = int | str | Iterable[int] | None


def select_steps(available: Iterable[int], steps: Steps = None) -> list[int]:
    """Choose among `available` step values (see the module's docstring)."""
    available = sorted({int(s) for s in available})
    if not available:
        raise ValueError("no checkpoints available")
    if steps is None or steps == "all":
        return available
    if isinstance(steps, bool):
        raise ValueError(f"steps must be 'all', 'log:N', an int or a list, got {steps!r}")
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(
                f"every k-th checkpoint needs k >= 1, got {steps}; for the checkpoint at step"
                f" {steps} give a list ([{steps}], or '{steps},' on the command line)"
            )
        if steps >= len(available) > 1:
            raise ValueError(
                f"every {steps}-th checkpoint leaves only the first of {len(available)}; for"
                f" the checkpoint at step {steps} give a list ([{steps}], or '{steps},' on the"
                " command line)"
            )
        return available[::steps]
    if isinstance(steps, str):
        match = re.fullmatch(r"log:(\d+)", steps)
        if not match:
            raise ValueError(f"steps must be 'all', 'log:N', an int or a list, got {steps!r}")
        if int(match.group(1)) < 2:
            raise ValueError(f"log:N needs N >= 2 (the first and the last), got {steps!r}")
        return _log_spaced(available, int(match.group(1)))
    wanted = sorted({int(s) for s in steps})
    have = set(available)  # once: training passes every step 0..N
    missing = [s for s in wanted if s not in have]
    if missing:
        raise ValueError(
            f"steps {missing} are not available; there are {len(available)} checkpoints"
            f" from {available[0]} to {available[-1]}"
        )
    return wanted


def _log_spaced(available: list[int], n: int) -> list[int]:
    """For each of n log-spaced targets, the nearest available step (in log(1 + step)) not
    chosen yet; a bisection and a walk outwards, so a long run's 0..N costs nothing."""
    if n >= len(available):
        return available
    lo, hi = math.log(available[0] + 1), math.log(available[-1] + 1)
    chosen: set[int] = set()
    for i in range(n):
        target = math.exp(lo + i * (hi - lo) / (n - 1)) - 1
        right = bisect.bisect_left(available, target)
        left = right - 1
        while left >= 0 and available[left] in chosen:
            left -= 1
        while right < len(available) and available[right] in chosen:
            right += 1
        candidates = [available[j] for j in (left, right) if 0 <= j < len(available)]
        chosen.add(min(candidates, key=lambda s: abs(math.log1p(s) - math.log1p(target))))
    return sorted(chosen)
