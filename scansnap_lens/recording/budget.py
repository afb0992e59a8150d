"""What a recording may write: the default budgets and how sizes are spelled.

A plan's values are float32, one per head for each zbar pair, c_hat triple, class and query
(`RecordPlan.num_slots`), plus the [T, T] weights of the example prompt.  Without an explicit
choice of queries the recorder tracks those that fit one checkpoint's budget (and the run's
share per checkpoint); a run over the run budget is refused before anything is written.

>>> size_text(CHECKPOINT_BUDGET), size_text(RUN_BUDGET), size_text(760_123_456)
('64 MB', '2 GB', '760 MB')
>>> duration(0.42), duration(95), duration(3 * 3600 + 1200)
('0.42 s', '1.6 min', '3.3 h')
"""

from __future__ import annotations

__all__ = ["BYTES_PER_VALUE", "CHECKPOINT_BUDGET", "RUN_BUDGET", "duration"]

CHECKPOINT_BUDGET = 64 * 10**6  # bytes of one checkpoint's file, by default
RUN_BUDGET = 2 * 10**9  # bytes of a whole recording, by default
BYTES_PER_VALUE = 4  # float32 (docs/trajectories.md says why that keeps zbar's changes)


def size_text(num_bytes: float) -> str:
    """Bytes in decimal units, as disks are sold: '64 MB', '1.2 GB'."""
    for unit in ("B", "kB", "MB", "GB"):
        if num_bytes < 1000:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.3g} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:.3g} TB"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: '12 s', '4.5 min', '3.3 h'."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h"
