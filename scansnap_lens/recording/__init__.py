"""Recording attention over checkpoints.

- `budget`: what a recording may write (`CHECKPOINT_BUDGET`, `RUN_BUDGET`);
- `plan`: `RecordPlan`, what a recording tracks (queries, classes (m, n), sparse slots);
- `hooks`: the two hooks per layer that aggregate attention logits and weights
  (`record_checkpoint`, `run_until`);
- `recorder`: `Recorder`, a model's checkpoints into a resumable trajectory folder;
- `storage`: the trajectory folder on disk (format, tensor names, writer, locks, lazy reader);
- `trajectory`: `Trajectory`, the recorded zbar and c_hat over checkpoints, saved and loaded.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "duration": "budget",
    "CLASSES_PER_QUERY": "plan",
    "COMMON_PER_QUERY": "plan",
    "BYTES_PER_VALUE": "budget",
    "CHECKPOINT_BUDGET": "budget",
    "RUN_BUDGET": "budget",
    "CheckpointRecord": "hooks",
    "RecordPlan": "plan",
    "Recorder": "recorder",
    "RecordingLock": "storage",
    "StepStack": "storage",
    "Trajectory": "trajectory",
    "TrajectoryWriter": "storage",
    "FILE_KEYS": "storage",
    "FORMAT": "storage",
    "read_steps": "storage",
    "checkpoint_name": "storage",
    "record_tensors": "storage",
    "model_vocab_size": "hooks",
    "plan_recording": "plan",
    "prompt_attention": "hooks",
    "record_checkpoint": "hooks",
    "watched": "hooks",
    "record_trajectory": "recorder",
    "remove_trajectory": "storage",
    "select_queries": "plan",
    "size_text": "budget",
    "budget_queries": "plan",
    "trainer_callback": "recorder",
}
_MODULES = {"budget", "hooks", "plan", "recorder", "storage", "trajectory"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
