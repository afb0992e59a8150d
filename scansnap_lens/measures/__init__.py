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
- `matching`: `match_heads`, the heads of several runs matched by their attention;
- `head_types`: `head_type`, the field's head types over training (previous-token,
  first-token, induction): scores with intervals over rows, and `formation_step`;
- `uncertainty`: `scan_uncertainty`, every head's intervals, p-values, the untrained baseline
  and its verdict (`scans`), each figure from its own module and `resampling`.

What the measurements say (the analysis value, findings, head ranking, runs) is `reading`;
where to record next is `planning`.
"""

from scansnap_lens._lazy import exports

_MODULES = """catalog discriminative entropy fit frequency growth head_types matching measurement
rates resampling snap summary uncertainty"""
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
