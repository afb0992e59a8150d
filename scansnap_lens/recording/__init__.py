"""Recording attention over checkpoints.

- `plan`: `RecordPlan`, what a recording tracks (queries, classes (m, n), sparse slots);
- `hooks`: the two hooks per layer that aggregate attention logits and weights
  (`record_checkpoint`, `run_until`, `position_entropy`);
- `recorder`: `Recorder`, a model's checkpoints into a resumable trajectory folder;
- `trajectory`: `Trajectory`, the recorded zbar and c_hat over checkpoints, saved and loaded.
"""

from scansnap_lens._lazy import exports

_NAMES = {
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
    "trainer_callback": "recorder",
}
_MODULES = {"hooks", "plan", "recorder", "trajectory"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
