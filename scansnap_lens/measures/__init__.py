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
- `analysis`: `Analysis.of`, every measurement of a trajectory once with its
  `AnalysisSettings`, saved and reloaded where its inputs match: what the report, the runs
  page, the command line and a notebook read;
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
  and its verdict (`scans`), each figure from its own module and `resampling`;
- `power`: power planned before recording, `planned_mde` and `rows_for_power`.
"""

from scansnap_lens._lazy import exports

_MODULES = """analysis catalog discriminative entropy findings fit frequency growth head_types heads
matching measurement placement power rates resampling runs snap summary uncertainty"""
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
