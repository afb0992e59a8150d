"""Where and how much to record, decided from what the measures show or will be able to show.

- `placement`: where to record so the checkpoints resolve each head's snap and formation
  steps: `record_placed` (a coarse pass, then the checkpoints that split each unresolved
  bracket) and `AdaptiveSchedule` (a training run's next step from the movement it saw);
- `power`: power planned before recording, `planned_mde` and `rows_for_power`.
"""

from scansnap_lens._lazy import exports

_MODULES = "placement power"
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
