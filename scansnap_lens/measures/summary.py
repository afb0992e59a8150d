"""Every measurement of a trajectory at once, and the one-row-per-head summary."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from scansnap_lens.measures.catalog import MeasureInputs, measures_of
from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.rates import predicted_snap
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["check_inputs", "measure_all", "summarize"]


def check_inputs(traj, groups) -> None:
    """TypeError naming the argument where it is not what the measurements take."""
    if not isinstance(traj, Trajectory):
        raise TypeError(f"traj must be a Trajectory (Trajectory.load), got {type(traj).__name__}")
    if groups is not None and not isinstance(groups, TokenGroups):
        raise TypeError(
            "groups must be TokenGroups (TokenGroups.from_statistics(stats)) or None, got"
            f" {type(groups).__name__}"
        )


def measure_all(
    traj: Trajectory,
    groups: TokenGroups | None = None,
    *,
    source=None,
    settings: AnalysisSettings | None = None,
    names: Iterable[str] | None = None,
    groups_reason: str | None = None,
) -> tuple[dict[str, Measurement], dict[str, str]]:
    """Each measurement of the trajectory (`catalog.measures_of`: `catalog.MEASURES` and a
    head type per rows aggregate of your own; or those of `names`) once, in order:
    ({name: result}, {name: why it could not be made}): what `reading.analysis.Analysis.of`
    measures with.

    groups: the token groups, or None where none could be formed (`groups_reason` says why;
    the measurements that need them are then left out with that reason).  source: the
    training corpus's statistics; settings: the one `AnalysisSettings` value every
    measurement reads its settings from.  Nothing raises because one measurement cannot be
    made (its ValueError is its reason); any other error is a defect and raises: `summarize`
    and `report.write_report` share these results.
    """
    check_inputs(traj, groups)
    inputs = MeasureInputs(traj, groups, source, settings or AnalysisSettings())
    if groups_reason:
        inputs.groups_reason = groups_reason
    wanted = None if names is None else set(names)
    results, why = {}, {}
    for entry in measures_of(traj):
        if wanted is not None and entry.name not in wanted:
            continue
        try:
            results[entry.name] = entry.run(inputs)
        except ValueError as err:  # what cannot be measured says so; a bug raises
            why[entry.name] = str(err)
    return results, why


def summarize(
    traj: Trajectory,
    groups: TokenGroups | None = None,
    settings: AnalysisSettings | None = None,
    results: dict[str, Measurement] | None = None,
    source=None,
) -> pd.DataFrame:
    """One row per layer and head: the last checkpoint's columns of each measurement of
    `catalog.MEASURES` that can be made (`Measure.summary` says which), the step of that
    checkpoint, and the theory's transition t0 (``settings.prediction``: one value, one per
    head, or by default `rates.predicted_snap` at ``settings.training``; NaN where unknown).

    results: the measurements of `measure_all` (to which one made by hand, e.g. a
    `theory_fit` of chosen classes, may be added), used as they are; by default each is
    measured here with `settings` (without `source`, the training corpus's statistics,
    there is no `theory_fit`).  `reading.analysis.Analysis.of` is the same, kept.
    """
    check_inputs(traj, groups)
    settings = settings or AnalysisSettings()
    if results is None:
        results, _ = measure_all(traj, groups, source=source, settings=settings)
    out = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"])
    out = out.to_frame(index=False)
    for entry in measures_of(traj):
        if entry.name not in results or entry.summary == ():
            continue
        table = results[entry.name].table
        if "step" in table:
            table = results[entry.name].final().drop(columns=["step"])
        if entry.summary is not None:
            table = table[["layer", "head", *entry.summary]]
        out = out.merge(table, on=["layer", "head"], how="left")
    out["final_step"] = int(traj.steps[-1])
    prediction = settings.prediction
    if isinstance(prediction, tuple):
        prediction = list(prediction)
    if prediction is None:
        prediction = predicted_snap(traj, settings.training)
    if prediction is None:
        out["predicted_snap"] = math.nan
    elif isinstance(prediction, int | float):
        out["predicted_snap"] = float(prediction)
    else:
        by_head = dict(zip(traj.heads, prediction))
        out["predicted_snap"] = out["head"].map(by_head).astype(float)
    return out
