"""Several runs of one recipe side by side: each head's verdict in every run, and its bias,
AUROC and snap step across runs, with an interval over runs beside the within-run one.

A within-run interval resamples the queries and context tokens of one trained model: it says
how well that model's figure is known, not what another seed would give.  Across runs
(seeds, deduped or not, two learning rates), each run is one unit: the interval over runs is
Student's t on the runs' estimates with runs - 1 degrees of freedom, for the mean of the
recipe's runs; the snap step's on the log-step axis, as `snap_step` finds its crossing (a
geometric mean).  It covers the recipe's mean where the runs' figures scatter near normally
(``bench_runs`` in ``analyses/benchmarks`` measures its coverage with skewed run effects
too); one run gives "too few runs".  The share of runs in which a head scans comes with its
Clopper-Pearson interval.

Shape letters: R runs, L watched layers, H watched heads.

>>> import pandas as pd
>>> runs = {r: pd.DataFrame({"layer": [0], "head": [0], "bias": [b], "bias_lo": [b - 0.1],
...                          "bias_hi": [b + 0.1], "scans": [b > 1]})
...         for r, b in (("a", 0.5), ("b", 1.0), ("c", 1.5))}
>>> row = compare_runs(runs).table.iloc[0]
>>> [round(float(row[c]), 3) for c in ("bias_mean", "bias_lo", "bias_hi", "bias_within")]
[1.0, -0.242, 2.242, 0.1]
>>> int(row["scans_runs"]), row["reason"]
(1, '')
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from scansnap_lens._io import make_folder, read_json, write_text
from scansnap_lens.measures.catalog import MEASURES, columns, measures_of
from scansnap_lens.measures.matching import match_heads
from scansnap_lens.measures.resampling import (
    far_runs,
    interval_over_runs,
    run_groups,
    share_interval,
    spread_split,
)
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "RUN_MEASURES",
    "RunComparison",
    "check_same_runs",
    "compare_runs",
    "measure_runs",
    "median_bounds",
    "own_bounds",
    "run_design",
]

# the measurements a comparison needs: those that show columns per run (`catalog.ROLES`; the
# theory's fit shows none: minutes per run)
RUN_MEASURES = tuple(m.name for m in MEASURES if m.shown.get("runs"))
# per run and layer: what holds whichever head of the layer it is (heads of runs from other
# initialisations are not the same heads); and, per head type, the heads that formed one
LAYER = {
    "scanning_heads": ("scans", lambda v: float(v.fillna(False).astype(bool).sum())),
    "best_auroc": ("auroc", lambda v: float(v.max()) if v.notna().any() else math.nan),
    "snap_step_median": ("snap_step", lambda v: float(v.median()) if v.notna().any() else math.nan),
}
ACROSS = ("bias", "auroc", "snap_step")  # figures with an interval over runs (and head types)
LOG_SCALE = {"snap_step", "snap_step_median"}  # averaged on the log-step axis (and formation)
RANGE = {"auroc": (0.0, 1.0)}  # an interval over runs stays where the figure can be
TOO_FEW = "too few runs"
SHARED_INIT = "every run with one shares its initial weights: no interval for the recipe"
SPLIT = ("bias", "auroc", "snap_step")  # per head, and each layer's median snap step
# PolyPythias' names (pythia-160m-seed3, -data-seed2, -weight-seed1) and the original's
_SEEDED = re.compile(r"^(?P<base>.+?)-(?:(?P<kind>data|weight)-)?seed(?P<k>\d+)$")
TWO_RUNS = (
    "Only 2 runs: an interval over runs rests on 1 degree of freedom (t = 12.7 at 95 %), so it"
    " says little beyond the two values; each more seed narrows it."
)


@dataclass
class RunComparison:
    """Runs of one recipe compared head by head; every column is defined in docs/glossary.md
    ("Across runs").

    runs: the runs' names, in order.  per_run: one row per run, layer and head (verdict,
    bias, AUROC and snap step with their within-run intervals, head-type scores).  table: one
    row per layer and head: the verdicts' share, and for bias, AUROC and snap_step the
    across-run ``_mean``, ``_sd``, ``_lo``/``_hi``, ``_n`` and ``_within``; ``reason`` where
    the runs are too few; ``verdict_<run>`` per run.  layers: one row per layer, the figures
    that hold whichever head it is (per run and over runs).  matching: which head of each run
    is compared with which head of the first (`matching.match_heads`), or None (by index).
    warnings: what the reader must know first.  design: which runs share initial weights and
    data order, and how that was known (`run_design`).  split: the spread between runs split
    between them (`resampling.spread_split`), runs far from the fit named (``far_runs``).
    """

    runs: list[str]
    per_run: pd.DataFrame
    table: pd.DataFrame
    layers: pd.DataFrame | None = None
    matching: pd.DataFrame | None = None  # `matching.match_heads`, where heads were matched
    warnings: list[str] = field(default_factory=list)
    losses: pd.DataFrame | None = None  # run, step, loss: each run's recorded evaluation loss
    design: pd.DataFrame | None = None  # run, init, data, said (`run_design`)
    split: pd.DataFrame | None = None  # layer, head, figure, part, share, ... (`spread_split`)

    def to_dataframe(self) -> pd.DataFrame:
        return self.table

    def tensor(self, column: str) -> Tensor:
        """[R, L, H] values of a `per_run` column."""
        frame = self.per_run.sort_values(["run_index", "layer", "head"])
        layers = sorted(frame["layer"].unique())
        heads = sorted(frame["head"].unique())
        values = frame[column].astype(float).to_numpy()
        return torch.tensor(values, dtype=torch.float64).reshape(
            len(self.runs), len(layers), len(heads)
        )

    def save(self, path: str | Path) -> Path:
        """A folder with ``runs.json``, ``per_run.csv`` and ``across_runs.csv``."""
        path = Path(path)
        make_folder(path)
        said = {"runs": self.runs, "warnings": self.warnings}
        write_text(path / "runs.json", json.dumps(said, indent=1))
        extra = (
            ("matching", self.matching),
            ("losses", self.losses),
            ("design", self.design),
            ("split", self.split),
        )
        for name, frame in extra:
            if frame is not None and len(frame.columns):
                write_text(path / f"{name}.csv", frame.to_csv(index=False))
        write_text(path / "per_run.csv", self.per_run.to_csv(index=False))
        write_text(path / "across_runs.csv", self.table.to_csv(index=False))
        if self.layers is not None:
            write_text(path / "across_runs_layers.csv", self.layers.to_csv(index=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RunComparison:
        path = Path(path)
        said = read_json(path / "runs.json", "runs comparison's index")
        runs = said["runs"]
        matching, losses, design, split = (
            pd.read_csv(path / f"{name}.csv", keep_default_na=False, na_values=[""])
            if (path / f"{name}.csv").is_file()
            else None
            for name in ("matching", "losses", "design", "split")
        )
        per_run = pd.read_csv(path / "per_run.csv", keep_default_na=False, na_values=[""])
        table = pd.read_csv(path / "across_runs.csv", keep_default_na=False, na_values=[""])
        layers = None
        if (path / "across_runs_layers.csv").is_file():
            layers = pd.read_csv(path / "across_runs_layers.csv")
        if design is not None:
            design = design.astype({"run": str, "init": object, "data": object})
        return cls(
            [str(r) for r in runs],
            per_run,
            table,
            layers,
            matching,
            said.get("warnings", []),
            losses,
            design,
            split,
        )

    def __repr__(self) -> str:
        scans = self.table.get("scans_runs")
        scanning = int((scans > 0).sum()) if scans is not None else 0
        return (
            f"RunComparison({len(self.runs)} runs, {len(self.table)} heads,"
            f" {scanning} scanning in some run)"
        )


def compare_runs(
    summaries: Mapping[str, pd.DataFrame], entries=None, design: pd.DataFrame | None = None
) -> RunComparison:
    """Compare the per-head summaries of several runs (`measures.summarize` of each, keyed by
    the run's name): see `RunComparison`.  entries: the measurements whose columns are
    compared (their "runs" and "formed" roles; default `catalog.MEASURES`).  design: which
    runs share initial weights and data order (`run_design`; default: each run its own)."""
    if not summaries:
        raise ValueError("no runs to compare")
    design = run_design(list(summaries)) if design is None else design
    labels = design.set_index("run")[["init", "data"]]
    labels = labels.astype(object).where(labels.notna(), None)
    entries = entries or MEASURES
    runs = [str(r) for r in summaries]
    formed = columns("formed", entries)  # head types: their score and formation step
    across = [*ACROSS, *[c for f in formed for c in (f.removesuffix("_step"), f)]]
    last = max(
        (float(s["final_step"].max()) for s in summaries.values() if "final_step" in s),
        default=math.inf,
    )
    ranges = {**RANGE, **{c: (0.0, 1.0) for c in across if c not in ACROSS and c not in formed}}
    ranges.update({c: (0.0, last) for c in ("snap_step", *formed)})
    frames = []
    for index, (run, summary) in enumerate(summaries.items()):
        kept = [c for c in columns("runs", entries) if c in summary]
        own = [c for c in ("own_head", "final_step") if c in summary]  # its last: the run's span
        frame = summary[["layer", "head", *own, *kept]].copy()
        frame.insert(0, "run", str(run))
        frame.insert(1, "run_index", index)
        frames.append(frame)
    per_run = pd.concat(frames, ignore_index=True)
    rows = []
    for (layer, head), group in per_run.groupby(["layer", "head"], sort=True):
        row = {"layer": int(layer), "head": int(head), "runs": len(group)}
        if "scans" in group:
            known = group["scans"].dropna().astype(bool)
            k, n = int(known.sum()), len(known)
            row["scans_runs"] = k
            row["scans_share"] = k / n if n else math.nan
            row["scans_share_lo"], row["scans_share_hi"] = share_interval(k, n)
        for name in across:
            if name not in group:
                continue
            values = group[name].astype(float).to_numpy()
            steps = name in LOG_SCALE or name in formed
            bounds = own_bounds(group, name) if steps else None  # a run knows no better
            init, data = (labels.reindex(group["run"])[k].tolist() for k in ("init", "data"))
            mean, sd, lo, hi = interval_over_runs(
                values, steps, bounds=bounds, init=init, data=data
            )
            if name in ranges and not math.isnan(lo):
                lo, hi = max(lo, ranges[name][0]), min(hi, ranges[name][1])
            row[f"{name}_mean"], row[f"{name}_sd"] = mean, sd
            row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
            row[f"{name}_n"] = int(np.isfinite(values).sum())
            if f"{name}_lo" in group and f"{name}_hi" in group:
                half = (group[f"{name}_hi"].astype(float) - group[f"{name}_lo"].astype(float)) / 2
                row[f"{name}_within"] = float(half.median()) if half.notna().any() else math.nan
        reasons = []
        for name in ACROSS:
            n = row.get(f"{name}_n")
            if n == 0:
                reasons.append(f"no run has a {name}")
            elif n == 1:
                reasons.append(f"{TOO_FEW} for {name} (1 has one)")
            elif n and math.isnan(row.get(f"{name}_lo", math.nan)):
                reasons.append(f"{name}: {SHARED_INIT}")
        if "snap_step" in group:
            row["snap_step_groups"] = _groups_said(group["snap_step"])
        row["reason"] = "; ".join(reasons)
        for run, verdict in zip(group["run"], group.get("verdict", [""] * len(group))):
            row[f"verdict_{run}"] = verdict
        rows.append(row)
    warnings = [TWO_RUNS] if len(runs) == 2 else []
    warnings += _design_warnings(design)
    layers = _by_layer(per_run, runs, entries, last, labels)
    split = _split(per_run, layers, runs, labels)
    return RunComparison(
        runs, per_run, pd.DataFrame(rows), layers, warnings=warnings, design=design, split=split
    )


def _groups_said(values: pd.Series) -> str | float:
    """ "k near a, m near b" where the runs' steps fall in two groups (`run_groups`), else
    NaN."""
    found = run_groups(values.astype(float).to_numpy(), log=True)
    if found is None:
        return math.nan
    k, m, a, b = found
    return f"{k} near {a:.3g}, {m} near {b:.3g}"


def _design_warnings(design: pd.DataFrame) -> list[str]:
    """What the reader must know of which runs share what (`run_design`)."""
    n = len(design)
    inits = design["init"].where(design["init"].notna(), design["run"]).nunique()
    orders = design["data"].where(design["data"].notna(), design["run"]).nunique()
    said = []
    if n > 1 and inits == 1:
        said.append(
            f"All {n} runs share their initial weights: they say how that one initialisation"
            " trains over data orders, not what another seed of the recipe would do (no"
            " interval for the recipe; each run's snap step is mostly set by its initial"
            " weights)"
        )
    elif inits < n:
        said.append(
            f"{n} runs from {inits} initial weights and {orders} data orders: runs that share"
            " initial weights are not independent draws of the recipe, and the interval over"
            " runs counts them so (its variance and degrees of freedom from the design)"
        )
    return said


def _split(per_run, layers, runs: list[str], labels) -> pd.DataFrame | None:
    """`spread_split` of each head's `SPLIT` figures and each layer's median snap step (None
    where the design shares nothing)."""
    if labels["init"].isna().all() or len(runs) < 3:
        return None
    init, data = (labels.reindex(runs)[k].tolist() for k in ("init", "data"))

    def split(values: np.ndarray, log: bool, **where) -> pd.DataFrame:
        far = far_runs(values, init, data, log=log)  # said apart: the split is the others'
        part = spread_split(np.where(far, math.nan, values), init, data, log=log)
        said = ", ".join(r for r, f in zip(runs, far) if f)
        return part.assign(**where, far_runs=said or math.nan)

    frames = []
    for (layer, head), group in per_run.groupby(["layer", "head"], sort=True):
        by_run = group.set_index("run")
        for name in SPLIT:
            if name not in by_run:
                continue
            values = by_run[name].reindex(runs).astype(float).to_numpy()
            frames.append(
                split(values, name in LOG_SCALE, layer=int(layer), head=int(head), figure=name)
            )
    for row in layers.to_dict("records"):
        values = np.array([row.get(f"snap_step_median_{r}", math.nan) for r in runs], float)
        frames.append(
            split(values, True, layer=int(row["layer"]), head=math.nan, figure="snap_step_median")
        )
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    out = pd.concat(frames, ignore_index=True)
    return out[
        ["layer", "head", "figure", *[c for c in out if c not in ("layer", "head", "figure")]]
    ]


def _by_layer(
    per_run: pd.DataFrame, runs: list[str], entries, last: float, labels=None
) -> pd.DataFrame:
    """Per layer: each run's layer figures (`LAYER`, and the heads that formed each head type
    of `entries`) and their interval over runs; a step figure's holds the runs' own bounds
    (the median of the heads' bounds bounds their median step), within [0, `last`]."""
    formed = {
        c.removesuffix("_step") + "_heads": (c, lambda v: float(v.notna().sum()))
        for c in columns("formed", entries)
    }
    counts = {"scanning_heads", *formed}
    rows = []
    for layer, group in per_run.groupby("layer", sort=True):
        row = {"layer": int(layer), "runs": len(runs)}
        heads = group["head"].nunique()
        for figure, (column, reduce) in {**LAYER, **formed}.items():
            if column not in group:
                continue
            by_run = [g for _, g in group.groupby("run_index")]
            values = np.array([reduce(g[column]) for g in by_run])
            for run, value in zip(runs, values):
                row[f"{figure}_{run}"] = value
            bounds = None  # a step: each run's median within its heads' own bounds
            if figure in LOG_SCALE:
                bounds = np.array([median_bounds(g, column) for g in by_run])
            order = [runs[int(g["run_index"].iloc[0])] for g in by_run]
            init, data = (
                (None, None)
                if labels is None
                else (labels.reindex(order)[k].tolist() for k in ("init", "data"))
            )
            mean, _, lo, hi = interval_over_runs(
                values, figure in LOG_SCALE, bounds=bounds, init=init, data=data
            )
            if figure in counts and not math.isnan(lo):  # a count of the layer's heads
                lo, hi = max(lo, 0.0), min(hi, float(heads))
            if figure in LOG_SCALE and not math.isnan(lo):
                lo, hi = max(lo, 0.0), min(hi, last)
            row[f"{figure}_mean"], row[f"{figure}_lo"], row[f"{figure}_hi"] = mean, lo, hi
            if figure == "snap_step_median":
                row["snap_step_median_groups"] = _groups_said(pd.Series(values))
        rows.append(row)
    return pd.DataFrame(rows)


def own_bounds(rows: pd.DataFrame, column: str) -> np.ndarray:
    """[n, 2] each row's own bounds of a step `column`: its interval (``_lo``, ``_hi``) and the
    checkpoints that bracket it (``_grid_lo``, ``_grid_hi``), the hull of those it has (the
    bracket holds where resampling had too few units); NaN where it has neither."""
    ends = [[f"{column}{k}{end}" for k in ("", "_grid")] for end in ("_lo", "_hi")]
    lo, hi = (rows.reindex(columns=e).astype(float) for e in ends)
    return np.stack([lo.min(axis=1).to_numpy(), hi.max(axis=1).to_numpy()], axis=1)


def median_bounds(heads: pd.DataFrame, column: str) -> np.ndarray:
    """[2] the medians of the own bounds (`own_bounds`) of the heads with a `column`: they
    bound the median of the heads' values; NaN where a head's bound is unknown.

    >>> heads = pd.DataFrame({"snap_step": [90.0, 300.0, 100.0], "snap_step_lo": [50.0, 256, 80],
    ...                       "snap_step_hi": [120.0, 512, 120]})
    >>> median_bounds(heads, "snap_step").tolist()  # the median 100 lies within
    [80.0, 120.0]
    """
    known = own_bounds(heads[heads[column].notna()], column)
    if not len(known) or np.isnan(known).any():
        return np.full(2, math.nan)
    return np.median(known, axis=0)


def check_same_runs(trajs: Mapping[str, Trajectory]) -> None:
    """ValueError naming the first difference where runs do not share their layers, heads,
    step unit and plan (queries, pairs, vocabulary, context convention)."""
    items = list(trajs.items())
    first_name, first = items[0]
    for name, traj in items[1:]:
        plan, base = traj.plan, first.plan
        checks = [
            ("layers", first.layers, traj.layers),
            ("heads", first.heads, traj.heads),
            ("step unit", first.step_unit, traj.step_unit),
            ("vocabulary", base.vocab_size, plan.vocab_size),
            ("window", base.window, plan.window),
            ("query's own position in context", base.include_self, plan.include_self),
            ("tracked queries", base.num_queries, plan.num_queries),
            ("tracked pairs", base.num_pairs, plan.num_pairs),
            ("tracked classes", base.num_classes, plan.num_classes),
        ]
        for what, ours, theirs in checks:
            if ours != theirs:
                raise ValueError(
                    f"runs {first_name!r} and {name!r} differ in their {what} ({ours} and"
                    f" {theirs}): compare runs recorded with the same plan and heads (the same"
                    " evaluation tokens, stats=, queries=, layers= and heads=)"
                )
        if not torch.equal(base.queries, plan.queries):
            raise ValueError(
                f"runs {first_name!r} and {name!r} track different queries: compare runs"
                " recorded with the same plan (the same evaluation tokens, stats= and queries=)"
            )


def run_design(runs, given=None) -> pd.DataFrame:
    """Which runs share initial weights and data order: one row per run with ``init``,
    ``data`` (labels; None: its own) and ``said`` (how it was known).

    runs: the runs' names, or {name: trajectory or `Analysis`}.  In order: `given` ({run:
    (init, data)}, or a frame with run, init, data columns; every run named), the seeds the
    recording kept (``seed`` in its meta: the initial weights and, unless ``data_seed``
    says otherwise, the data order, as the Trainer's `seed` and `data_seed` do;
    ``init_seed`` where the weights had their own), then the hub name of the run or of what
    it was recorded from (PolyPythias: ``pythia-160m-seed3`` its own weights and data,
    ``-data-seed2`` the original's weights, ``-weight-seed1`` the original's data order;
    ``pythia-160m`` itself the original).  Otherwise each run is its own.

    >>> names = ["pythia-160m", "pythia-160m-data-seed1", "pythia-160m-weight-seed1",
    ...          "pythia-160m-seed2"]
    >>> for row in run_design(names)[["init", "data"]].values.tolist():
    ...     print(row)
    ['pythia-160m', 'pythia-160m']
    ['pythia-160m', 'data-seed1']
    ['weight-seed1', 'pythia-160m']
    ['seed2', 'seed2']
    """
    entries = dict(runs) if isinstance(runs, Mapping) else {str(r): None for r in runs}
    names = [str(r) for r in entries]
    known = _given_design(given, names) if given is not None else {}
    metas = {}
    for name, run in entries.items():
        traj = run.traj if isinstance(run, Analysis) else run
        metas[str(name)] = dict(getattr(traj, "meta", None) or {})
    hub = {}
    for name in names:  # the name a hub gave, the run's or what it was recorded from
        for candidate in (name, str(metas[name].get("source", ""))):
            match = _SEEDED.match(Path(candidate).name) if candidate else None
            if match:
                hub[name] = match
                break
    bases = {m["base"] for m in hub.values()}
    rows = []
    for name in names:
        meta = metas[name]
        seed = _seed(meta.get("seed"))
        if name in known:
            init, data, said = *known[name], "given"
        elif seed is not None or _seed(meta.get("init_seed")) is not None:
            # the seed sets what has no seed of its own, as the Trainer's data_seed does
            init, data = _seed(meta.get("init_seed")), _seed(meta.get("data_seed"))
            init = f"init {seed if init is None else init}"
            data = (
                None if data is None and seed is None else f"data {seed if data is None else data}"
            )
            said = "the recording's seeds"
        elif name in hub:
            m = hub[name]
            own = f"{m['kind'] + '-' if m['kind'] else ''}seed{m['k']}"
            init = m["base"] if m["kind"] == "data" else own
            data = m["base"] if m["kind"] == "weight" else own
            said = "hub name"
        elif Path(name).name in bases or Path(str(meta.get("source", ""))).name in bases:
            base = Path(name).name if Path(name).name in bases else Path(meta["source"]).name
            init = data = base
            said = "hub name (the original run)"
        else:
            init = data = None
            said = "its own"
        rows.append({"run": name, "init": init, "data": data, "said": said})
    return pd.DataFrame(rows, columns=["run", "init", "data", "said"])


def _seed(value) -> int | None:
    """A seed kept in a meta, checked as an integer (None where there is none or it is not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _given_design(given, names: list[str]) -> dict[str, tuple]:
    """{run: (init, data)} from a mapping or a frame with run, init and data columns."""
    if isinstance(given, pd.DataFrame):
        missing = {"run", "init", "data"} - set(given.columns)
        if missing:
            raise ValueError(f"a design needs columns run, init and data; it lacks {missing}")
        given = {str(r): (i, d) for r, i, d in zip(given["run"], given["init"], given["data"])}
    out = {}
    for run, pair in dict(given).items():
        if str(run) not in names:
            raise ValueError(f"the design names run {run!r}, which is not among {names}")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"the design gives run {run!r} {pair!r}: give (init, data)")
        out[str(run)] = tuple(None if pd.isna(x) else str(x) for x in pair)
    return out


def measure_runs(
    runs: Mapping[str, Trajectory | Analysis],
    groups: TokenGroups | Mapping[str, TokenGroups | None] | None = None,
    *,
    source=None,
    settings: AnalysisSettings | None = None,
    match: str = "behaviour",
    design=None,
) -> RunComparison:
    """Measure every run (`RUN_MEASURES`) and compare them.

    runs: {run name: trajectory, or its `Analysis` (used as it is: the command line reloads
    each run's from beside it)}, runs of one architecture and plan (`check_same_runs`).
    groups: one `TokenGroups` for all runs (one corpus), or one per run (deduped or not).
    source, settings: as `Analysis.of` takes them (one for all runs).  match: "behaviour"
    compares each head with the head of the first run that does what it does
    (`matching.match_heads`: the table's ``head`` is the first run's, `per_run`'s
    ``own_head`` the run's own), or "index" (runs from one initialisation).  design: which
    runs share initial weights and data order, as `run_design` takes it (default: what the
    recordings and their names say).
    """
    if match not in ("behaviour", "index"):
        raise ValueError(f"match must be 'behaviour' or 'index', got {match!r}")
    if len(runs) < 1:
        raise ValueError("no runs to compare")
    trajs = {name: run.traj if isinstance(run, Analysis) else run for name, run in runs.items()}
    check_same_runs(trajs)
    entries = measures_of(next(iter(trajs.values())))
    settings = (settings or AnalysisSettings()).replace(
        leave_out=[m.name for m in entries if not m.shown.get("runs")]
    )
    summaries = {}
    for name, run in runs.items():
        if not isinstance(run, Analysis):
            run_groups = groups.get(name) if isinstance(groups, Mapping) else groups
            run = Analysis.of(run, run_groups, source=source, settings=settings)
        summaries[name] = run.summary.copy()
    matching, why = match_heads(trajs) if match == "behaviour" and len(trajs) > 1 else (None, "")
    if matching is not None:
        for name, summary in summaries.items():
            own = matching[matching["run"] == name].set_index(["layer", "head"])
            keys = list(zip(summary["layer"], summary["head"]))
            summary.insert(2, "own_head", summary["head"])
            summary["head"] = own["reference_head"].reindex(keys).to_numpy()
    comparison = compare_runs(summaries, entries, run_design(runs, design))
    comparison.matching = matching
    comparison.losses = pd.DataFrame(
        [
            (name, step, loss)
            for name, traj in trajs.items()
            for step, loss in zip(traj.steps.tolist(), traj.loss.tolist())
        ],
        columns=["run", "step", "loss"],
    )
    if why:
        comparison.warnings.append(f"heads matched by index: {why}")
    for name, traj in trajs.items():  # a run's steps are read between the checkpoints it has
        comparison.warnings += [
            f"{name}: step {s['step']} not recorded ({s['error']})" for s in traj.skipped
        ]
    return comparison
