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

__all__, __getattr__, __dir__ = exports(
    __name__, "aggregates budget hooks plan recorder settings storage sweep trajectory"
)
