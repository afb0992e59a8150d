"""Recording attention over checkpoints.

- `budget`: what a recording may write (`CHECKPOINT_BUDGET`, `RUN_BUDGET`);
- `plan`: `RecordPlan`, what a recording tracks (queries, classes (m, n), sparse slots);
- `hooks`: the two hooks per layer that aggregate attention logits and weights
  (`record_checkpoint`, `run_until`, `position_entropy`);
- `recorder`: `Recorder`, a model's checkpoints into a resumable trajectory folder;
- `trajectory`: `Trajectory`, the recorded zbar and c_hat over checkpoints, saved and loaded.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "BYTES_PER_VALUE": "budget",
    "CHECKPOINT_BUDGET": "budget",
    "RUN_BUDGET": "budget",
    "CheckpointRecord": "hooks",
    "RecordPlan": "plan",
    "Recorder": "recorder",
    "RecordingLock": "trajectory",
    "Trajectory": "trajectory",
    "TrajectoryWriter": "trajectory",
    "model_vocab_size": "hooks",
    "plan_recording": "plan",
    "position_entropy": "hooks",
    "prompt_attention": "hooks",
    "record_checkpoint": "hooks",
    "record_trajectory": "recorder",
    "remove_trajectory": "trajectory",
    "select_queries": "plan",
    "size_text": "budget",
    "budget_queries": "plan",
    "measured_queries": "plan",
    "trainer_callback": "recorder",
}
_MODULES = {"budget", "hooks", "plan", "recorder", "trajectory"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
