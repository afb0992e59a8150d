"""Every measurement of a trajectory at once, and the one-row-per-head summary."""

from __future__ import annotations

import math

import pandas as pd

from scansnap_lens.measures.discriminative import discriminative_bias
from scansnap_lens.measures.entropy import attention_entropy, sparsity
from scansnap_lens.measures.fit import SUMMARY_COLUMNS
from scansnap_lens.measures.frequency import frequency_bias
from scansnap_lens.measures.growth import growth_factor
from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.rates import predicted_snap
from scansnap_lens.measures.snap import snapping
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["MEASURES", "SUMMARY_MEASURES", "measure_all", "summarize"]


MEASURES = (
    "snapping",
    "discriminative_bias",
    "frequency_bias",
    "sparsity",
    "attention_entropy",
    "growth_factor",
)
SUMMARY_MEASURES = MEASURES[:-1]  # the ones whose last checkpoint `summarize` tabulates


def measure_all(
    traj: Trajectory, groups: TokenGroups, names=MEASURES
) -> tuple[dict[str, Measurement], dict[str, str]]:
    """Each measurement of `names` once: ({name: result}, {name: why it is not measurable}).

    `snapping` needs two checkpoints and raises otherwise; the others are left out with the
    reason where the trajectory or the groups lack what they need.  `summarize` and
    `report.write_report` share these results rather than measuring twice.
    """
    functions = {
        "snapping": lambda: snapping(traj),
        "discriminative_bias": lambda: discriminative_bias(traj, groups),
        "frequency_bias": lambda: frequency_bias(traj, groups),
        "sparsity": lambda: sparsity(traj, groups),
        "attention_entropy": lambda: attention_entropy(traj),
        "growth_factor": lambda: growth_factor(traj, groups),
    }
    results, why = {}, {}
    for name in names:
        if name == "snapping":
            results[name] = functions[name]()
            continue
        try:
            results[name] = functions[name]()
        except ValueError as err:
            why[name] = str(err)
    return results, why


def summarize(
    traj: Trajectory,
    groups: TokenGroups,
    prediction=None,
    checks: dict | None = None,
    training: dict | None = None,
    results: dict[str, Measurement] | None = None,
) -> pd.DataFrame:
    """One row per layer and head: scan scores and sparsity at the last checkpoint, snap steps,
    and the theory's transition t0 (`prediction`: one value, one per head, or by default
    `predicted_snap(traj)`; NaN where unknown).  `checks`: measurements of
    `fit.theory_checks`, whose last-checkpoint columns join the row (``bound_ratio``,
    ``inside`` of `growth_bounds`; ``population_snap``, ``snap_ratio``, ``rank_agreement``,
    ``dz_corr`` of `theory_fit`).  `training`: the rates if the trajectory does not hold them
    (see `training_of`).  `results`: the measurements of `measure_all`, if already made."""
    if results is None:
        results, _ = measure_all(traj, groups, SUMMARY_MEASURES)
    parts = [results["snapping"].table]  # attention movement of every tracked class
    for name in SUMMARY_MEASURES[1:]:
        if name in results:
            parts.append(results[name].final().drop(columns=["step"]))
    for name, result in (checks or {}).items():
        final = result.final()
        parts.append(final[["layer", "head", *SUMMARY_COLUMNS[name]]])
    out = parts[0]
    for part in parts[1:]:
        out = out.merge(part, on=["layer", "head"], how="left")
    out["final_step"] = int(traj.steps[-1])
    if prediction is None:
        prediction = predicted_snap(traj, training)
    if prediction is None:
        out["predicted_snap"] = math.nan
    elif isinstance(prediction, int | float):
        out["predicted_snap"] = float(prediction)
    else:
        by_head = dict(zip(traj.heads, prediction))
        out["predicted_snap"] = out["head"].map(by_head).astype(float)
    return out
