"""The seed question on the Pythia-like run: which of its findings hold across seeds?

    for s in 0 1 2 3 4; do python analyses/pythia_like_run.py --out out/seeds/seed$s --seed $s; done
    python analyses/pythia_like_seeds.py out/seeds/seed* --out out/seeds/compared

Each run folder is one `pythia_like_run.py` output (its trajectory and statistics; the seed
sets the initialisation and the data order, the evaluation rows and the plan are the same).
The runs are compared with `reading.measure_runs` (`scansnap report RUN_A RUN_B ...` does
the same): per layer, whichever heads they are (seeds permute the heads), the heads that scan,
the best AUROC, the median snap step and the heads that became previous-token, induction or
first-token heads, each with its interval over seeds; per head, each seed's verdict and the
within-run intervals beside the interval over seeds.  Writes --out/runs.html, its CSVs and
figures, and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from scansnap_lens.reading.runs import measure_runs
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.report import write_runs_report
from scansnap_lens.statistics.corpus import CooccurrenceStats
from scansnap_lens.statistics.groups import TokenGroups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="pythia_like_run.py output folders")
    parser.add_argument("--out", type=Path, default=Path("out/seeds/compared"))
    args = parser.parse_args()
    start = time.perf_counter()
    trajs, groups = {}, {}
    for folder in args.runs:
        traj = Trajectory.load(folder / "trajectory")
        stats = CooccurrenceStats.load(folder / "stats.safetensors")
        trajs[folder.name] = traj
        groups[folder.name] = TokenGroups.from_statistics(stats, queries=traj.plan.queries.tolist())
    comparison = measure_runs(trajs, groups)
    report = write_runs_report(
        comparison, args.out, title=f"Pythia-like run: {len(trajs)} seeds compared"
    )
    pd.set_option("display.width", 250)
    layers = comparison.layers
    print("per layer: each seed's figure, the mean over seeds and its interval over seeds")
    print(layers.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    table = comparison.table
    cols = ["layer", "head", "scans_runs", "auroc_mean", "auroc_lo", "auroc_hi", "auroc_within",
            "snap_step_mean", "snap_step_lo", "snap_step_hi", "snap_step_within"]  # fmt: skip
    print("per head (matched by index)")
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    scanning = comparison.per_run[comparison.per_run["scans"].fillna(False).astype(bool)]
    info = {
        "runs": comparison.runs,
        "scanning_heads": scanning[
            ["run", "layer", "head", "auroc", "auroc_lo", "auroc_hi"]
        ].to_dict(orient="records"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(info))
    print(f"report: {report.path.resolve()}")


if __name__ == "__main__":
    main()
