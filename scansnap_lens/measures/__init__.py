"""Measurements of scan and snap (docs/glossary.md), one module per quantity of the paper.

Every function takes a `Trajectory` (the recorded aggregates over checkpoints, per layer and
head) and,
where the quantity compares token kinds, `TokenGroups` (distinct tokens of each class with
P(l|m, n), common tokens of each query), and returns a `Measurement`: a table with
``to_dataframe()`` and its values as ``[step, layer, head]`` tensors (``tensor``).

- `discriminative`: `discriminative_bias`, distinct minus common dz of a query, and its AUROC
  (`QueryTokens`: every query's held distinct and common tokens, the figures' one definition);
- `frequency`: `frequency_bias`, Spearman(dz, P(l|m, n)) over a class's distinct tokens
  (`ClassTokens`);
- `entropy`: `sparsity` (Fig. 6 entropy over distinct tokens, Figs. 11-12 recall),
  `attention_entropy` (Fig. 10), `restricted_entropy`;
- `growth`: `growth_factor`, Theorem 3's growth factor and the deviation from its ratio law;
- `snap`: `snap_step` (the rate of movement fallen to half its peak: horizon-independent),
  `secondary_snap_steps`, `snapping`;
- `rates`: the training's effective rates and the theory's t0 at them (`predicted_snap`);
- `fit`: `growth_bounds` (Theorem 3's bounds) and `theory_fit` (population dynamics);
- `measurement`: `Measurement` (what every function returns) and `segment_ranks` (ranks
  within segments of flat arrays, the way every per-query and per-class figure is computed);
- `resampling`: every interval, p-value, correction over heads and minimal detectable effect
  (`Estimate`), from the per-unit pieces each measure hands over;
- `catalog`: `MEASURES`, the table of measurements (function, needs, summary columns,
  figures, explanation) that `measure_all`, `summarize` and the report iterate over;
- `summary`: `measure_all` (each measurement once) and `summarize` (one row per head);
- `findings`: `findings_of`, what the summary found in sentences (the report's first lines);
- `heads`: `rank_heads`, `head_grid`, `atlas` (every head's verdict, snap beside the head
  types, fit, entropy);
- `runs`: `measure_runs` / `compare_runs`, several runs of one recipe head by head (verdict per
  run, bias, AUROC and snap step with an interval over runs beside the within-run one,
  the share of runs scanning), `RunComparison`;
- `matching`: `match_heads`, the heads of several runs matched by their attention;
- `head_types`: `head_type`, the field's head types over training (previous-token,
  first-token, induction): scores with intervals over rows, and `formation_step`;
- `placement`: where to record so the checkpoints resolve those steps: `record_placed` (a
  coarse pass, then the checkpoints that split each unresolved bracket) and
  `AdaptiveSchedule` (a training run's next step from the movement it saw);
- `uncertainty`: `scan_uncertainty`, every head's intervals, p-values, the untrained baseline
  and its verdict (`scans`), each figure from its own module and `resampling`.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "ALPHA": "uncertainty",
    "LEVEL": "uncertainty",
    "UNCERTAINTY_COLUMNS": "uncertainty",
    "INDEX": "measurement",
    "MEASURES": "catalog",
    "Measure": "catalog",
    "MeasureInputs": "catalog",
    "Plot": "catalog",
    "measure_named": "catalog",
    "ROLES": "catalog",
    "columns": "catalog",
    "measures_of": "catalog",
    "VERDICTS": "uncertainty",
    "scan_uncertainty": "uncertainty",
    "Estimate": "resampling",
    "POWER": "resampling",
    "adjust": "resampling",
    "bootstrap_percentile": "resampling",
    "crossed": "resampling",
    "joint_mde": "resampling",
    "kish": "resampling",
    "mean_over_units": "resampling",
    "normal_p": "resampling",
    "resample_counts": "resampling",
    "sum_of_squares": "resampling",
    "too_few": "resampling",
    "attention_entropy_estimate": "entropy",
    "distinct_entropy_estimate": "entropy",
    "MATCH_NEIGHBOURS": "discriminative",
    "MATCH_RATIO": "discriminative",
    "MIN_UNITS": "resampling",
    "Measurement": "measurement",
    "QueryTokens": "discriminative",
    "ClassTokens": "frequency",
    "DistinctAttention": "entropy",
    "snap_step_interval": "snap",
    "head_movement": "snap",
    "comparable_intervals": "snap",
    "NOISY_BELOW": "snap",
    "straightness": "snap",
    "PLACEMENT_FILE": "placement",
    "TOLERANCE": "placement",
    "AdaptiveSchedule": "placement",
    "coarse_steps": "placement",
    "next_steps": "placement",
    "record_placed": "placement",
    "step_brackets": "placement",
    "segment_ranks": "measurement",
    "segment_starts": "measurement",
    "NOT_YET_SNAPPED": "snap",
    "NO_SCAN": "snap",
    "SINGLE_DISTINCT": "entropy",
    "atlas": "heads",
    "attention_entropy": "entropy",
    "discriminative_bias": "discriminative",
    "effective_rate": "rates",
    "findings_of": "findings",
    "runs_findings_of": "findings",
    "frequency_bias": "frequency",
    "growth_bounds": "fit",
    "growth_factor": "growth",
    "head_grid": "heads",
    "head_type": "head_types",
    "head_type_scores": "head_types",
    "formation_step": "head_types",
    "HEAD_TYPES": "head_types",
    "MIN_RISE": "head_types",
    "MIN_ROWS": "head_types",
    "known_rates": "rates",
    "match_heads": "matching",
    "measure_all": "summary",
    "position_entropy": "entropy",
    "predicted_snap": "rates",
    "rank_heads": "heads",
    "restricted_entropy": "entropy",
    "RunComparison": "runs",
    "RUN_MEASURES": "runs",
    "interval_over_runs": "resampling",
    "share_interval": "resampling",
    "widened": "resampling",
    "with_grid": "resampling",
    "compare_runs": "runs",
    "measure_runs": "runs",
    "median_bounds": "runs",
    "own_bounds": "runs",
    "check_same_runs": "runs",
    "class_movement": "snap",
    "snap_step": "snap",
    "secondary_snap_steps": "snap",
    "snapping": "snap",
    "sparsity": "entropy",
    "summarize": "summary",
    "theory_fit": "fit",
    "theory_of": "rates",
    "theory_limits": "rates",
    "training_of": "rates",
}
_MODULES = set(
    "catalog discriminative entropy findings fit frequency growth heads head_types matching "
    "measurement "
    "rates resampling runs snap summary uncertainty".split()
)

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
