"""Recording attention over checkpoints.

- `budget`: what a recording may write (`CHECKPOINT_BUDGET`, `RUN_BUDGET`);
- `plan`: `RecordPlan`, what a recording tracks (queries, classes (m, n), sparse slots);
- `aggregates`: what a checkpoint records, one table (`AGGREGATES`: zbar, c_hat, the
  entropies, the head types previous_token, first_token, induction; `Aggregate` for your own);
- `hooks`: the two hooks per layer that add each batch's attention into the aggregates
  (`record_checkpoint`, `run_until`);
- `settings`: `RecordingSettings`, how a run is recorded, one frozen value;
- `recorder`: `Recorder`, a model's checkpoints into a resumable trajectory folder, each
  through the one per-checkpoint step of `RecordingRun`;
- `sweep`: the next checkpoint fetched while one records (`Ahead`), hub revisions on a bounded
  disk (`HubRevisions`: read from your hub cache, or downloaded into the sweep's own
  `SweepCache`, at most `ON_DISK` there, each deleted once recorded), steps that serve one
  weights file (`same_weights`);
- `storage`: the trajectory folder on disk (format, tensor names, writer, locks, lazy reader);
- `trajectory`: `Trajectory`, the recorded aggregates over checkpoints, saved and loaded.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "ON_DISK": "settings",
    "RecordingSettings": "settings",
    "RecordingRun": "recorder",
    "TrajectoryFolder": "storage",
    "Ahead": "sweep",
    "DiskError": "sweep",
    "HubRevisions": "sweep",
    "ReadAhead": "sweep",
    "fetcher_for": "sweep",
    "DUPLICATES": "settings",
    "DuplicateWeightsError": "sweep",
    "SweepCache": "sweep",
    "same_weights": "sweep",
    "RESERVED": "aggregates",
    "duration": "budget",
    "CLASSES_PER_QUERY": "plan",
    "COMMON_PER_QUERY": "plan",
    "BYTES_PER_VALUE": "budget",
    "CHECKPOINT_BUDGET": "budget",
    "RUN_BUDGET": "budget",
    "CheckpointRecord": "aggregates",
    "Aggregate": "aggregates",
    "AGGREGATES": "aggregates",
    "RunState": "hooks",
    "DEFAULT": "aggregates",
    "HEAD_TYPES": "aggregates",
    "NotRecorded": "trajectory",
    "count_rows": "hooks",
    "row_sources": "hooks",
    "manifest_aggregates": "storage",
    "resolve": "aggregates",
    "earlier_copies": "aggregates",
    "first_token_positions": "aggregates",
    "induction_positions": "aggregates",
    "previous_token_positions": "aggregates",
    "repeated_random_rows": "aggregates",
    "Gathered": "aggregates",
    "AXES": "aggregates",
    "aggregate_named": "aggregates",
    "RecordPlan": "plan",
    "Recorder": "recorder",
    "RecordingLock": "storage",
    "StepStack": "storage",
    "Trajectory": "trajectory",
    "TrajectoryWriter": "storage",
    "FORMAT": "storage",
    "read_steps": "storage",
    "checkpoint_name": "storage",
    "record_tensors": "storage",
    "model_vocab_size": "hooks",
    "plan_recording": "plan",
    "find_sorted": "plan",
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
_MODULES = {"aggregates", "budget", "hooks", "plan", "recorder", "settings", "storage", "sweep",
            "trajectory"}  # fmt: skip

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
