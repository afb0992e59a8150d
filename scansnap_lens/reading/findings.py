"""`findings_of`: what a recording found, in sentences made from the summary's verdicts, head
types and snap steps: the first lines of the report and of the command line.

>>> summary = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "scans": [False, False],
...     "verdict": ["no scan (could have seen AUROC >= 0.62)", "no scan (could have seen"
...                 " AUROC >= 0.7)"], "auroc_mde": [0.62, 0.7],
...     "snap_step": [120.0, 130.0], "snap_step_lo": [118.0, 126.0],
...     "snap_step_hi": [123.0, 131.0], "previous_token": [0.31, 0.02],
...     "previous_token_step": [95.0, float("nan")], "previous_token_step_lo": [90.0, None],
...     "previous_token_step_hi": [99.0, None]})
>>> for line in findings_of(summary):
...     print(line)
No head scans (each could have seen AUROC >= 0.62 to 0.7).
Layer 0 head 0 became a previous-token head (score 0.31) at step 95 [90, 99].
Layer 0 snapped near step 125 [122, 127] (its 2 heads: 120 to 130).
>>> findings_of(summary.iloc[:1])[-1]  # a layer of one head
'Layer 0 snapped near step 120 [118, 123] (its one head).'
>>> wide = summary.assign(snap_step_lo=[10.0, 12.0], snap_step_hi=[700.0, 800.0])
>>> print(findings_of(wide, steps=[0, 10, 100, 800])[-1])  # doctest: +NORMALIZE_WHITESPACE
Layer 0's snap cannot be placed from this run: somewhere in steps 11 to 750 (its 2 heads);
checkpoints between steps 11 and 750 would (scansnap record --steps auto).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from scansnap_lens.measures.catalog import MEASURES, Measure, columns
from scansnap_lens.measures.snap import NOISY_BELOW
from scansnap_lens.measures.uncertainty import TARGET_AUROC, VERDICTS

__all__ = ["findings_of", "in_progress", "runs_findings_of"]

MOST = 4  # heads named in one sentence; the rest are counted


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _interval(row, column: str) -> str:
    lo, hi = row.get(f"{column}_lo", math.nan), row.get(f"{column}_hi", math.nan)
    if pd.isna(lo) or pd.isna(hi):
        return _num(row[column])
    return f"{_num(row[column])} [{_num(lo)}, {_num(hi)}]"


def _heads(rows: pd.DataFrame) -> str:
    names = [f"layer {int(r.layer)} head {int(r.head)}" for r in rows.head(MOST).itertuples()]
    more = len(rows) - len(names)
    text = ", ".join(names) + (f" and {more} more" if more > 0 else "")
    return text[0].upper() + text[1:]


def _scan(summary: pd.DataFrame, step_unit: str) -> list[str]:
    if "scans" not in summary or "verdict" not in summary:
        return []
    scanning = summary[summary["scans"].astype(bool)]
    if len(scanning):
        order = scanning.sort_values("auroc", ascending=False) if "auroc" in summary else scanning
        best = order.iloc[0]
        said = f"{_heads(order)} scan{'s' if len(order) == 1 else ''}"
        if len(order) > 1:
            said += (
                f" ({len(order)} of {len(summary)} heads; the strongest, layer"
                f" {int(best['layer'])} head {int(best['head'])}: AUROC"
            )
        else:
            said += " (AUROC"
        said += f" {_interval(best, 'auroc')}"
        control = str(best.get("frequency_control", ""))
        if control.startswith("frequency bias"):
            r, p = _num(best["frequency_bias_r"]), f"{best['frequency_bias_p']:.2g}"
            said += (
                f"; the more frequent distinct tokens gain more, r {r}, p = {p}: not a"
                " preference for rare tokens"
            )
        elif "held_auroc" in best and best["held_auroc"] == best["held_auroc"]:
            said += f"; with frequency held {_interval(best, 'held_auroc')}"
        return [said + ")."]
    kinds = summary["verdict"].fillna("").str.split(" \\(").str[0]
    if (kinds == VERDICTS["no_scan"]).all() and "auroc_mde" in summary:
        power = _power(summary)
        if power.startswith("none"):
            return [f"No head scans, and {power}."]
        return [f"No head scans ({power})."]
    counts = kinds.value_counts()
    parts = [
        f"{n} {'head' if n == 1 else 'heads'}: {kind or 'no verdict'}" for kind, n in counts.items()
    ]
    said = [f"No head scans ({'; '.join(parts)})."]
    untold = summary[kinds == VERDICTS["cannot_tell"]]
    if len(untold):
        side = (
            "rarer"
            if untold["verdict"].astype(str).str.contains("rarer").any()
            else "more frequent"
        )
        need = untold.get("held_units_needed", pd.Series(dtype=float)).astype(float).max()
        settle = (
            f": about {need:,.0f} effective units (more evaluation text) would settle it"
            if need == need
            else ""
        )
        said.append(
            f"{len(untold)} {'head gains' if len(untold) == 1 else 'heads gain'} on distinct"
            f" tokens, but those are {side} than the common ones and frequency cannot be ruled"
            f" out{settle}."
        )
    explained = summary[kinds == VERDICTS["not_beyond"]]
    if len(explained):
        said.append(
            f"{len(explained)} {'head gains' if len(explained) == 1 else 'heads gain'} on"
            " distinct tokens only as far as frequency goes: with frequency held alike the"
            " gain falls significantly (see the verdicts)."
        )
    return said


def _power(rows: pd.DataFrame) -> str:
    """What heads without a scan could have seen (`auroc_mde`), with the plan of more rows."""
    mde = rows["auroc_mde"].astype(float)
    more = rows.get("rows_for_target", pd.Series(dtype=float)).astype(float)
    plan = ""
    if (more > 1).any():
        plan = (
            f"; about {_num(more.max())} times the evaluation rows would let every head"
            f" see AUROC {TARGET_AUROC:g}: scansnap record --power {TARGET_AUROC:g}"
            " plans them"
        )
    mde = mde[mde < 1]
    if len(mde) == 0:
        return f"none could have been seen (no power: see the verdicts{plan})"
    span = _num(mde.min()) + ("" if mde.min() == mde.max() else f" to {_num(mde.max())}")
    return f"each could have seen AUROC >= {span}{plan}"


def _head_types(summary: pd.DataFrame, entries: Sequence[Measure]) -> list[str]:
    said, none = [], []
    for step in columns("formed", entries):
        if step not in summary:
            continue
        name = step.removesuffix("_step")
        kind = name.replace("_", "-") + " head"
        formed = summary[summary[step].notna()].sort_values(step)
        if formed.empty:
            none.append(kind)
            continue
        for row in formed.head(MOST).to_dict("records"):
            said.append(
                f"Layer {int(row['layer'])} head {int(row['head'])} became a {kind} (score"
                f" {_num(row[name])}) at step {_interval(row, step)}."
            )
        if len(formed) > MOST:
            said.append(f"{len(formed) - MOST} more heads became {kind}s (see the heads table).")
    if none:
        kinds = [k.removesuffix(" head") for k in none]
        kinds = ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]
        said.append(f"No head became a {kinds} head (no significant rise of its score).")
    return said


WORDS = 35  # about the most words of one finding: a caveat for several layers is said once


def cannot_place(lo: float, hi: float, span: tuple[float, float] | None) -> bool:
    """Whether a step's interval [lo, hi] spans more than half of the run's log-step range
    `span` (first, last checkpoint): then the run cannot place it.

    >>> cannot_place(10, 800, (0, 800)), cannot_place(76, 168, (0, 250))
    (True, False)
    """
    if span is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    first, last = span
    width = math.log1p(max(hi - first, 0.0)) - math.log1p(max(lo - first, 0.0))
    return width > 0.5 * math.log1p(max(last - first, 0.0))


def _layers(layers: list) -> str:
    """ "Layer 0", "Layers 0 and 2", "Layers 0, 1 and 3"."""
    names = [str(x) for x in layers]
    if len(names) == 1:
        return f"Layer {names[0]}"
    return f"Layers {', '.join(names[:-1])} and {names[-1]}"


def _snaps(summary: pd.DataFrame, span=None) -> tuple[list[str], list[str]]:
    """Each layer's snap in a short sentence, and the caveats said once for the page (the
    layers whose attention moved by noise, and where rate and state disagree)."""
    if "snap_step" not in summary:
        return [], []
    from scansnap_lens.reading.runs import median_bounds

    said, noise, spacing, states = [], [], [], []
    for layer, rows in summary.groupby("layer", sort=True):
        steps = rows["snap_step"].astype(float).dropna()
        if steps.empty:
            reasons = rows.get("snap_reason", pd.Series(dtype=str)).dropna().unique()
            why = f" ({'; '.join(map(str, reasons))})" if len(reasons) else ""
            said.append(f"Layer {layer}: no head snapped{why}.")
            continue
        if len(rows) == 1:
            heads = "its one head"
        elif len(steps) == len(rows):
            heads = f"its {len(rows)} heads"
        else:
            heads = f"{len(steps)} of its {len(rows)} heads"
        lo, hi = (float(v) for v in median_bounds(rows, "snap_step"))
        noisy = _noisy(rows)
        if noisy == "drift":
            noise.append(layer)
        elif noisy:
            spacing.append((layer, noisy))
        if cannot_place(lo, hi, span):
            way = (
                "more seeds would place the recipe's"
                if noisy == "drift"
                else f"checkpoints between steps {_num(lo)} and {_num(hi)} would (scansnap record"
                " --steps auto)"
            )
            said.append(
                f"Layer {layer}'s snap cannot be placed from this run: somewhere in"
                f" steps {_num(lo)} to {_num(hi)} ({heads}); {way}."
            )
            continue
        bounds = f" [{_num(lo)}, {_num(hi)}]" if math.isfinite(lo) and math.isfinite(hi) else ""
        spread = f": {_num(steps.min())} to {_num(steps.max())}" if len(steps) > 1 else ""
        said.append(
            f"Layer {layer} snapped near step {_num(steps.median())}{bounds} ({heads}{spread})."
        )
        state = _states(rows)
        if state:
            states.append((layer, state))
    notes = []
    if noise:
        their = "its" if len(noise) == 1 else "their"
        notes.append(
            f"{_layers(noise)} moved mostly by step-to-step noise: {their} snap steps,"
            " read from the drift, are this run's own; more seeds, not more"
            " checkpoints, place the recipe's (see How to read it)."
        )
    if spacing:
        values = ", ".join(v for _, v in spacing)
        notes.append(
            f"{_layers([x for x, _ in spacing])} moved mostly by step-to-step noise"
            f" between checkpoints (straightness {values}; a drift gives 1, noise"
            " 0.71): compare snap steps only at the same checkpoints."
        )
    if states:
        notes.append(
            f"{_layers([x for x, _ in states])} reached half way to the last"
            f" checkpoint's attention near step {', '.join(v for _, v in states)},"
            " outside the snap's interval in most heads: rate and state disagree"
            " (see How to read it)."
        )
    return said, notes


def _noisy(rows: pd.DataFrame) -> str:
    """How a layer's attention moved by noise: "drift" where its drift resolves fewer than
    its checkpoints (its snap steps are read from the drift between those), its median
    straightness where it is under `NOISY_BELOW` at every checkpoint, else ""."""
    drift = {"drift_checkpoints", "checkpoints"} <= set(rows)
    if drift and rows["drift_checkpoints"].notna().any():
        kept = float(rows["drift_checkpoints"].median())
        total = float(rows["checkpoints"].max())
        if total - kept < max(1.0, 0.1 * (total - 1)):
            return ""
        return "drift"
    if "straightness" not in rows or rows["straightness"].isna().all():
        return ""
    straight = float(rows["straightness"].median())
    return "" if straight >= NOISY_BELOW else f"{straight:.2f}"


def _states(rows: pd.DataFrame) -> str:
    """The step at which a layer's attention was half way to its last checkpoint's, where it
    lies outside most of its heads' snap intervals (`snap.half_steps`), else ""."""
    need = {"half_distance_step", "snap_step", "snap_step_grid_lo", "snap_step_grid_hi"}
    if not need <= set(rows):
        return ""
    lo = rows.get("snap_step_lo", rows["snap_step_grid_lo"]).fillna(rows["snap_step_grid_lo"])
    hi = rows.get("snap_step_hi", rows["snap_step_grid_hi"]).fillna(rows["snap_step_grid_hi"])
    half = rows["half_distance_step"].astype(float)
    half_lo = rows.get("half_distance_step_lo", half).fillna(half)
    half_hi = rows.get("half_distance_step_hi", half).fillna(half)
    both = rows["snap_step"].notna() & half.notna()
    apart = both & ((half_hi < lo) | (half_lo > hi))
    if not both.any() or apart.sum() * 2 <= both.sum():
        return ""
    return _num(half[both].median())


def _theory(summary: pd.DataFrame) -> list[str]:
    if "population_snap" not in summary or summary["population_snap"].isna().all():
        return []
    predicted = float(summary["population_snap"].median())
    classes = ""
    if "fit_classes" in summary and summary["fit_classes"].notna().any():
        classes = f" ({int(summary['fit_classes'].max()):,} classes fit)"
    said = (
        f"The paper's population dynamics on the corpus statistics{classes} snap near step"
        f" {_num(predicted)}"
    )
    if "snap_ratio" in summary and summary["snap_ratio"].notna().any():
        said += f"; measured over predicted, median {_num(summary['snap_ratio'].median())}"
    return [said + "."]


def findings_of(
    summary: pd.DataFrame,
    entries: Sequence[Measure] = MEASURES,
    step_unit: str = "steps",
    steps: Sequence[float] | None = None,
) -> list[str]:
    """Sentences of what the summary (`summary.summarize`, one row per head) shows, each of
    about `WORDS` at most: which heads scan (or what each could have seen), which became one
    of the head types of `entries` (`catalog.measures_of` a trajectory; their "formed"
    columns) and when, when each layer snapped (or that the run cannot place it: its
    interval spans more than half of the log-step range of the run's checkpoints `steps`),
    the theory's snap where it was fit, and last the caveats of several layers, each said
    once."""
    span = None if steps is None or not len(steps) else (float(min(steps)), float(max(steps)))
    snaps, notes = _snaps(summary, span)
    said = [*_scan(summary, step_unit), *_head_types(summary, entries), *snaps]
    said += _theory(summary) + notes
    if step_unit != "steps":
        said = [s.replace(" step ", f" {step_unit.removesuffix('s')} ") for s in said]
    return said


def in_progress(traj) -> list[str]:
    """The finding that comes first while the run is still being recorded (`Trajectory.
    recording`): what the report reads is its checkpoints so far; none once it is done."""
    if getattr(traj, "recording", None) is None:
        return []
    last = int(traj.steps[-1]) if traj.num_steps else 0
    unit = traj.step_unit.removesuffix("s")
    return [
        f"Still recording (process {traj.recording}): this reads its first"
        f" {traj.num_steps} checkpoints, to {unit} {last}; report again for the rest."
    ]


def _scanning_runs(per_run: pd.DataFrame, row) -> str:
    """The runs in which head (layer, head) of the first run's numbering scans, each with its
    own number where the heads were matched by behaviour and it has another."""
    at = per_run[(per_run["layer"] == row["layer"]) & (per_run["head"] == row["head"])]
    names = []
    for run in at[at["scans"].astype(bool)].to_dict("records"):
        own = run.get("own_head", run["head"])
        names.append(run["run"] + (f", its head {int(own)}" if own != run["head"] else ""))
    return "; ".join(names)


def _names(runs: list[str], n: int) -> str:
    if len(runs) == n:
        return "every run" if n > 2 else "both runs"
    return ", ".join(runs[:-1]) + " and " + runs[-1] if len(runs) > 1 else runs[0]


def _runs_power(per_run: pd.DataFrame) -> str:
    """What the runs' heads could have seen, where no run shows a scan (`_power` over every
    run's heads; the runs that could see nothing named apart)."""
    if "auroc_mde" not in per_run:
        return ""
    seen = per_run["auroc_mde"].astype(float) < 1
    blind = [run for run, rows in seen.groupby(per_run["run"], sort=False) if not rows.any()]
    parts = [f"{_names(blind, per_run['run'].nunique())} had no power to see one"] if blind else []
    if seen.any():
        parts.append(
            _power(per_run[seen]).replace(
                "each could", "the other runs' heads could" if blind else "their heads could"
            )
        )
    return f" ({'; '.join(parts)})" if parts else ""


PARTS = {"init": "the initial weights", "data": "the data order", "rest": "neither alone"}


def unseen_group_chance(inits: int) -> float:
    """The chance that `inits` independent initialisations all miss a group of runs that
    holds a quarter of the recipe's: then the interval over runs holds the mean of the
    groups seen, not the recipe's (no interval from the runs alone can tell)."""
    return 0.75**inits


def _recipe_caveat(comparison) -> list[str]:
    """Where few initialisations stand for the recipe, what they can miss."""
    design = comparison.design
    if design is None or len(design) < 3:
        return []
    inits = design["init"].where(design["init"].notna(), design["run"]).nunique()
    if not 3 <= inits <= 5:
        return []
    return [
        f"From {inits} initialisations, a group holding a quarter of the recipe's runs"
        f" would be missed by all of them with probability"
        f" {unseen_group_chance(inits):.2f}."
    ]


def _split_said(comparison, layer: int) -> list[str]:
    """The layer's spread split (`RunComparison.split`) in a sentence: each part's share of
    the variance between runs and how far another initial weight moves a run's snap."""
    split = comparison.split
    if split is None or not len(split):
        return []
    rows = split[(split["layer"] == layer) & (split["figure"] == "snap_step_median")]
    if rows.empty:
        return []
    parts = [
        f"{PARTS[r['part']]} {100 * r['share']:.1f} % [{100 * r['share_lo']:.1f},"
        f" {100 * r['share_hi']:.1f}]"
        for r in rows.to_dict("records")
    ]
    said = (
        f"Of the spread of layer {layer}'s snap step between runs, "
        + "; ".join(parts)
        + " (shares of the variance, log-step axis)"
    )
    init = rows[rows["part"] == "init"]
    if len(init) and init["sd"].iloc[0] > 0:
        factor = math.exp(float(init["sd"].iloc[0]))
        said += (
            f": another initialisation moves a run's snap step by a factor of about"
            f" {factor:.2f} (one sd), so one run's snap is its own, not the"
            " recipe's"
        )
    said += "."
    far = rows["far_runs"].dropna() if "far_runs" in rows else pd.Series(dtype=object)
    if len(far) and far.iloc[0]:
        said += (
            f"  Left out of that split: {far.iloc[0]}, far from what their initialisation"
            " and data order predict (a run that went another way; such runs carry a"
            " share of the spread that a few runs rarely show)."
        )
    return [said]


def runs_findings_of(comparison, entries: Sequence[Measure] = MEASURES) -> list[str]:
    """Sentences of what survives across the runs of a `runs.RunComparison`: its warnings,
    the heads that scan in every run or some, per layer the head types formed in every run
    or some (with each run's formation step), each layer's snap step over runs, and how well
    the heads were matched."""
    runs, table, per_run = comparison.runs, comparison.table, comparison.per_run
    n = len(runs)
    said = list(comparison.warnings)
    if "scans_runs" in table:
        scanning = table[table["scans_runs"] > 0].sort_values("scans_runs", ascending=False)
        if scanning.empty:
            said.append(f"No head scans in any of the {n} runs" + _runs_power(per_run) + ".")
        for row in scanning.head(MOST).to_dict("records"):
            said.append(
                f"Layer {int(row['layer'])} head {int(row['head'])} scans in"
                f" {int(row['scans_runs'])} of {n} runs ({_scanning_runs(per_run, row)})."
            )
    layers = comparison.layers if comparison.layers is not None else pd.DataFrame()
    none = []
    for step in columns("formed", entries):
        name = step.removesuffix("_step")
        kind = name.replace("_", "-") + " head"
        formed_any = False
        for row in layers.to_dict("records"):
            counts = [row.get(f"{name}_heads_{run}", math.nan) for run in runs]
            having = [run for run, c in zip(runs, counts) if c > 0]
            if not having:
                continue
            formed_any = True
            at = per_run[(per_run["layer"] == row["layer"]) & per_run[step].notna()]
            when = ", ".join(
                f"{run} at step {_num(at[at['run'] == run][step].min())}" for run in having
            )
            every = "every run" if len(having) == n else f"{len(having)} of {n} runs"
            said.append(f"Layer {int(row['layer'])} has a {kind} in {every} ({when}).")
        if not formed_any and f"{name}_heads_mean" in layers:
            none.append(kind.removesuffix(" head"))
    if none:
        kinds = ", ".join(none[:-1]) + " or " + none[-1] if len(none) > 1 else none[0]
        said.append(f"No head became a {kinds} head in any run.")
    span = _runs_span(comparison)
    noisy_runs: set[str] = set()
    for row in layers.to_dict("records"):
        if pd.isna(row.get("snap_step_median_mean", math.nan)):
            continue
        layer = int(row["layer"])
        each = ", ".join(
            f"{run}: {_num(row[f'snap_step_median_{run}'])}"
            for run in runs
            if pd.notna(row.get(f"snap_step_median_{run}"))
        )
        lo, hi = row.get("snap_step_median_lo", math.nan), row.get("snap_step_median_hi", math.nan)
        at = per_run[per_run["layer"] == row["layer"]]
        noisy_runs |= {run for run in runs if _noisy(at[at["run"] == run])}
        if cannot_place(float(lo), float(hi), span):
            said.append(
                f"Layer {layer}'s snap over runs cannot be placed from these {n} runs:"
                f" somewhere in steps {_num(lo)} to {_num(hi)} ({each}); more seeds"
                " would place it."
            )
        else:
            over = f" [{_num(lo)}, {_num(hi)}]" if pd.notna(lo) else ""
            said.append(
                f"Layer {layer} snaps near step {_num(row['snap_step_median_mean'])}"
                f"{over} over runs ({each})."
            )
        groups = row.get("snap_step_median_groups")
        if isinstance(groups, str) and groups:
            said.append(
                f"Layer {layer}'s runs snap in two separate groups ({groups}): the recipe's"
                " mean lies between them, and a single run tells only its own group."
            )
        said += _split_said(comparison, layer)
    if noisy_runs:
        named = _names([run for run in runs if run in noisy_runs], n)
        said.append(
            f"In {named} the attention moved mostly by step-to-step noise between"
            " checkpoints (see each run's page): a run's snap steps are its own, and"
            " the interval over runs is for their typical (geometric mean)"
            " step."
        )
    said += _recipe_caveat(comparison)
    matching = comparison.matching
    if matching is not None:
        others = matching[matching["run"] != runs[0]]
        quality = others.groupby("layer").agg(
            similarity=("similarity", "mean"), chance=("chance", "mean")
        )
        close = [int(x) for x, q in quality.iterrows() if q.similarity - q.chance < MATCHED_BY]
        said.append(
            f"Heads are matched to {runs[0]}'s by their attention on the example prompt"
            f" (similarity {_range(quality['similarity'])} against"
            f" {_range(quality['chance'])} by chance"
            + (f"; {_layers(close).lower()} barely above it" if close else "")
            + ")."
        )
    return said


MATCHED_BY = 0.05  # a layer's similarity within this of chance: its heads' match says little


def _range(values: pd.Series) -> str:
    low, high = _num(float(values.min())), _num(float(values.max()))
    return low if low == high else f"{low} to {high}"


def _runs_span(comparison) -> tuple[float, float] | None:
    """The first and last checkpoint of the runs (their losses' steps; from summaries alone,
    step 0 to their last, ``final_step``), or None."""
    losses, per_run = comparison.losses, comparison.per_run
    if losses is not None and len(losses):
        return float(losses["step"].min()), float(losses["step"].max())
    if "final_step" in per_run and per_run["final_step"].notna().any():
        return 0.0, float(per_run["final_step"].max())
    return None
