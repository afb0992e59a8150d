"""What a run's measurements say (docs/glossary.md): read from `measures`, never measured here.

- `analysis`: `Analysis.of`, every measurement of a trajectory once with its
  `AnalysisSettings`, saved and reloaded where its inputs match: what the report, the runs
  page, the command line and a notebook read;
- `findings`: `findings_of`, what the summary found in sentences (the report's first lines),
  and `runs_findings_of`, what holds across runs with each run's caveats;
- `heads`: `rank_heads`, `head_grid`, `atlas` (every head's verdict, snap beside the head
  types, fit, entropy);
- `runs`: `measure_runs` / `compare_runs`, several runs of one recipe head by head (verdict per
  run, bias, AUROC and snap step with an interval over runs beside the within-run one,
  the share of runs scanning), `RunComparison`.
"""

from scansnap_lens._lazy import exports

_MODULES = "analysis findings heads runs"
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
