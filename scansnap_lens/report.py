"""One self-contained HTML report of a trajectory: summary, figures, circuitsvis views; and
one of several runs compared (`write_runs_report`).

    report = write_report(Analysis.of(traj, groups, source=stats), "out/report")
    report.path            # out/report/report.html: opens offline in any browser
    write_runs_report(reading.measure_runs({"seed0": a, "seed1": b}, groups), "out/runs")

Beside ``report.html`` the folder holds ``summary.json`` (the summary rows, the trajectory's
meta data, what could not be measured and why), one CSV per measurement, and the figures as
PNG files.  In the HTML the figures are embedded and the circuitsvis script is included once
for the whole page, so the report needs no network and no other file.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from scansnap_lens._io import make_folder, staged_folder, write_bytes, write_text
from scansnap_lens.measures.catalog import columns
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.reading.findings import runs_findings_of
from scansnap_lens.reading.heads import atlas, rank_heads
from scansnap_lens.recording.budget import duration
from scansnap_lens.viz.figures import (
    plot_loss_with_steps,
    plot_runs,
    plot_runs_maps,
    run_figures,
    shown_classes,
)
from scansnap_lens.viz.views import page, run_views

__all__ = ["Report", "write_report", "write_runs_report"]

HOW_TO_READ_HEADS = (
    "The heads table ranks every head by AUROC, then bias, with its snap_step beside the head"
    " types' scores and formation steps; the heads figure maps bias, AUROC, snap_step, the"
    " induction, previous-token and first-token scores, attention_entropy and dz_corr over"
    " [layer, head]."
)


def number(value: float) -> str:
    """The one rounding of a number on the page and the command line: 4 significant digits."""
    return f"{value:.4g}"


def table_html(frame: pd.DataFrame) -> str:
    """A table in its own box, which scrolls sideways where the table is wider than the page."""
    table = frame.to_html(index=False, float_format=number, na_rep="–")
    return f"<div class='table'>{table}</div>"


BESIDE_VERDICT = ("auroc_mde", "rows_for_target")  # what a verdict's reason says, in numbers


def with_intervals(summary: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """`columns` of the summary for reading: a value with an interval (``VALUE_lo``,
    ``VALUE_hi``) shows as "value [lo, hi]"; a verdict (``verdict``, a run's ``verdict_RUN``)
    as its kind without its reason ("no scan (could have seen ...)" -> "no scan"), with the
    numbers of the reason (`BESIDE_VERDICT`) beside it: their words are in the findings and
    uncertainty.csv."""
    if "verdict" in columns:
        at = columns.index("verdict") + 1
        rest = [c for c in columns if c not in BESIDE_VERDICT]
        columns = [*rest[:at], *[c for c in BESIDE_VERDICT if c in columns], *rest[at:]]
    shown = summary[[c for c in columns if c in summary]].copy()
    for c in [c for c in shown if c == "verdict" or c.startswith("verdict_")]:
        shown[c] = shown[c].astype(str).str.split(" \\(").str[0].where(shown[c].notna())
    for c in shown.columns:
        lo, hi = f"{c}_lo", f"{c}_hi"
        if lo not in summary or not pd.api.types.is_float_dtype(shown[c]):
            continue
        shown[c] = [
            "–"
            if pd.isna(v)
            else number(v)
            if pd.isna(a) or pd.isna(b)
            else f"{number(v)} [{number(a)}, {number(b)}]"
            for v, a, b in zip(summary[c], summary[lo], summary[hi])
        ]
    return shown


@dataclass
class Report:
    """A written report: the HTML file, the summary table and every file beside it."""

    path: Path
    summary: pd.DataFrame
    files: dict[str, Path] = field(default_factory=dict)
    not_measured: dict[str, str] = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        return self.summary

    def _repr_html_(self) -> str:
        return (
            f"<p>Report: <a href='{html.escape(self.path.resolve().as_uri())}'>"
            f"{html.escape(str(self.path))}</a></p>" + table_html(self.summary)
        )


class _Folder:
    """The report folder as it fills: files written, figures made, what could not be made."""

    def __init__(self, out: Path, drawn: dict | None = None, expected: int = 0):
        self.out = out
        self.expected = expected  # figures this page may draw, to say their cost
        self.timed: list[float] = []  # seconds of each figure drawn here
        self.files: dict[str, Path] = {}
        self.figures: dict[str, str] = {}  # name: its HTML
        self.not_measured: dict[str, str] = {}
        self.drawn = drawn or {}  # an earlier report's figures of the same analysis
        self.failed: dict[str, str] = {}  # figure name: why it could not be drawn

    def figure(self, name: str, caption: str, make) -> None:
        """Draw `make(path)` into figures/NAME.png (an earlier page's where it drew it), or
        say why it could not be drawn.  After the second figure drawn (the first pays
        matplotlib's warm-up), the others' cost is said where it may pass 10 s."""
        path = self.out / "figures" / f"{name}.png"
        earlier = self.drawn.get(name)
        try:
            if isinstance(earlier, str):
                raise ValueError(earlier)
            if earlier is not None:
                write_bytes(path, earlier)
            else:
                start = time.perf_counter()
                make(path=path)
                self.timed.append(seconds := time.perf_counter() - start)
                left = self.expected - len(self.timed)
                if len(self.timed) == 2 and seconds * left > 10:
                    cost = duration(seconds * left)
                    tqdm.write(f"report: {left} more figures to draw, about {cost}")
        except (ValueError, KeyError) as err:  # a missing column: the figure is left out
            self.not_measured[f"figure {name}"] = self.failed[name] = str(err).strip("'")
            return
        self.files[f"figure_{name}"] = path
        data, said = base64.b64encode(path.read_bytes()).decode("ascii"), html.escape(caption)
        self.figures[name] = (
            f"<figure><img src='data:image/png;base64,{data}' alt='{said}'>"
            f"<figcaption>{said}</figcaption></figure>"
        )

    def page(
        self,
        title: str,
        findings: tuple[str, str, list[str], str],
        aside: tuple[str, str],
        sections: list[str],
        after: list[str],
        left_out: str,
        script: bool = True,
    ) -> str:
        """A whole page of this folder, a run's or the runs': first the title, `findings` (a
        lead line, the heading, the sentences, a note under them) and beside them the `aside`
        figures (a map, and the loss under it; the loss alone where there is no map: one head,
        or no figure to map), then the `sections`, the other figures, what comes `after` them,
        and what was left out and why under the heading `left_out` (nothing where nothing
        was).  "How to read it" in a finding links to that section."""
        lead, heading, lines, note = findings
        maps, curve = (self.figures.pop(name, "") for name in aside)
        link = f"<a href='#{HOW_TO_READ_ID}'>How to read it</a>"
        said = "".join(
            f"<li>{html.escape(line).replace('How to read it', link)}</li>" for line in lines
        )
        missing = "".join(
            f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in self.not_measured.items()
        )
        body = [
            f"<h1>{html.escape(title)}</h1>{lead}<div class='findings'><div>"
            f"<h2>{html.escape(heading)}</h2><ul>{said}</ul>{note}</div>"
            f"<div class='aside'>{maps}{curve}</div></div>",
            *sections,
            "<h2>Figures</h2>",
            *self.figures.values(),
            *after,
            f"<h2>{left_out}</h2><ul>{missing}</ul>" if missing else "",
        ]
        return page(title, "\n".join(body), _STYLE, script=script)


def write_report(
    analysis: Analysis,
    out: str | Path,
    title: str | None = None,
    views: bool = True,
    token_strings=None,
) -> Report:
    """Write the report folder `out` of an `Analysis` (`Analysis.of(traj, groups, ...)`).

    title: default "scansnap_lens: " and what the trajectory recorded (its meta's source or
    model; a folder by its name, as a reader calls the run); views: include the circuitsvis
    views (they need the trajectory's example prompt); token_strings: strings of the prompt's
    tokens for the views (default: the plan's).  The report is written whatever could not be
    measured (``Report.not_measured`` and the page say what was left out and why).  It is made
    in a folder beside `out` and moved in at the end: an interrupted report leaves `out` as it
    was.
    """
    if not isinstance(analysis, Analysis):
        raise TypeError(
            "write_report takes an Analysis (Analysis.of(traj, groups, source=...)), got"
            f" {type(analysis).__name__}"
        )
    out, traj, summary, results = Path(out), analysis.traj, analysis.summary, analysis.results
    if title is None:
        what = traj.meta.get("source") or traj.meta.get("model")
        if what and Path(str(what)).is_absolute():
            what = Path(str(what)).name or what
        title = f"scansnap_lens: {what}" if what else "scansnap_lens report"
    # the head the one-head figures and views show: the one that scans most, else the first
    scans = "bias" in summary and summary["bias"].notna().any()
    best = summary.loc[summary["bias"].idxmax()] if scans else summary.iloc[0]
    layer, head = int(best["layer"]), int(best["head"])
    figures = run_figures(analysis, layer, head)
    drawn = analysis.drawn_figures()  # by an earlier page of this analysis
    with staged_folder(out) as stage:
        make_folder(stage / "figures")
        folder = _Folder(stage, drawn, expected=len(figures))
        folder.not_measured.update(analysis.not_measured)
        tables = {"summary": summary}
        for entry in analysis.entries:
            if entry.name in results:
                tables[entry.name] = results[entry.name].table
                tables[f"{entry.name}_detail"] = results[entry.name].detail
        ranking = None
        if {"auroc", "bias"} & set(summary):
            tables["head_ranking"] = ranking = rank_heads(summary)
        else:
            folder.not_measured["head ranking"] = "needs auroc or bias (discriminative_bias)"
        for name, frame in tables.items():
            if frame is not None:
                folder.files[name] = write_text(stage / f"{name}.csv", frame.to_csv(index=False))
        for name, caption, draw in figures:
            folder.figure(name, caption, draw)
        view_html, missing = ("", {})
        if views:
            view_html, missing = run_views(traj, analysis.groups, layer, head, token_strings)
        folder.not_measured.update(missing)
        folder.files["summary_json"] = stage / "summary.json"
        folder.files["report"] = stage / "report.html"
        settings = analysis.settings_used()
        payload = {
            "title": title,
            "settings": settings,
            "theory_limits": analysis.theory_limits,
            "steps": traj.steps.tolist(),
            "step_unit": traj.step_unit,
            "layers": traj.layers,
            "heads": traj.heads,
            "meta": traj.meta,
            "skipped": traj.skipped,
            "recording": traj.recording,
            "summary": json.loads(summary.to_json(orient="records")),
            "not_measured": folder.not_measured,
            "files": {k: str(v.relative_to(stage)) for k, v in folder.files.items()},
        }
        write_text(folder.files["summary_json"], json.dumps(payload, indent=1))
        body = _page(analysis, title, ranking, folder, view_html, settings)
        write_text(folder.files["report"], body)
    files = {k: out / v.relative_to(stage) for k, v in folder.files.items()}
    if not drawn:  # kept for the next page of this analysis
        figures = {
            k.removeprefix("figure_"): v for k, v in files.items() if k.startswith("figure_")
        }
        analysis.keep_figures(figures, folder.failed)
    return Report(files["report"], summary, files, folder.not_measured)


def _page(analysis: Analysis, title, ranking, folder: _Folder, view_html, settings) -> str:
    summary, limits = analysis.summary, analysis.theory_limits
    results, entries = analysis.results, analysis.entries
    legend = ""
    if "uncertainty" in results:  # what the intervals and the verdict mean, at their levels
        a = results["uncertainty"].table.attrs
        correction = "Holm" if a["correction"] == "holm" else "Benjamini-Hochberg"
        legend = (
            f"<p class='legend'>[lo, hi]: {100 * a['level']:.0f} % interval (Student t with"
            " n_eff - 1 degrees of freedom; for bias and AUROC queries and context tokens are"
            " crossed units, for spearman, entropy and snap_step classes are the units; none"
            f" below n_eff {a['min_units']:g}: <i>too few units</i>).  <b>scans</b>: bias &gt;"
            " 0 and AUROC &gt; 0.5, each significant, and not explained by token frequency"
            f" (see <b>verdict</b>), at {a['alpha']:g} over the {a['heads']} heads tested"
            f" ({correction}).  <b>auroc_mde</b>: the AUROC the recording could have detected"
            " with 80 % power.  The intervals cover other queries and tokens of this text for"
            " this trained model, not another training run.</p>"
        )
    sections = [
        "<h2>Summary (one row per layer and head, at the last checkpoint)</h2>",
        table_html(with_intervals(summary, columns("key", entries)).head(50)),
        legend,
        f"<p>The first 50 heads and the main columns; all {len(summary.columns)} columns of"
        f" every head are in <code>summary.csv</code>.  Each is explained under"
        " <i>How to read it</i>; a dash is a value that could not be measured (see"
        " <i>Not measured</i> and the <code>snap_reason</code> column).</p>",
    ]
    if ranking is not None:
        sections += [
            "<h2>Heads ranked by scan (AUROC, then bias)</h2>",
            table_html(with_intervals(ranking, ["rank", *columns("heads", entries)]).head(20)),
        ]
    if len(summary) > 1:
        table = atlas(summary, entries)
        shown = [c for c in table.columns if not c.endswith(("_lo", "_hi")) and c != "snap_step"]
        sections += [
            "<h2>Head atlas</h2>",
            "<p>Every layer and head: the verdict (and why a head does not scan, or what it"
            " could have seen), bias and AUROC with their intervals, AUROC's p-value, effective"
            " units and minimal detectable effect, the AUROC with frequency held and how token"
            " frequency was ruled out, the frequency bias (spearman) with its interval, p-value"
            " and the number of classes it averages, the snap step (or why there is none), the"
            " theory's fit and the attention entropy; the figure <i>heads</i> maps them.</p>",
            table_html(with_intervals(table, shown)),
        ]
    if {"growth_bounds", "theory_fit"} & set(results) or limits:
        sections.append(_theory_section(summary, results, limits))
    sections += [
        f"<h2 id='{HOW_TO_READ_ID}'>How to read it</h2>",
        # one paragraph per measurement the analysis made, then the heads' figures
        "<ul>"
        + "".join(f"<li>{m.explains}</li>" for m in entries if m.explains)
        + f"<li>{HOW_TO_READ_HEADS}</li></ul>",
    ]
    after = ["<h2>circuitsvis views</h2>", view_html] if view_html else []
    after += ["<h2>Settings</h2>", _overview(analysis, settings)]
    findings = ("", "Findings", analysis.findings, SETTINGS_AT_THE_END)
    return folder.page(title, findings, ("heads", "loss"), sections, after, "Not measured")


SETTINGS_AT_THE_END = "<p>Each is measured below; the settings are at the end.</p>"


HOW_TO_READ_ID = "how-to-read"


THEORY_COLUMNS = [
    "layer",
    "head",
    "snap_step",
    "predicted_snap",
    "population_snap",
    "snap_ratio",
    "rank_agreement",
    "dz_corr",
    "bound_ratio",
    "inside",
]


def _theory_section(summary: pd.DataFrame, checks: dict, limits: list[str]) -> str:
    """The theory against the measurement, per head, with the numbers said in words, and
    what the theory can and cannot say of this training (`rates.theory_limits`)."""
    table = summary[[c for c in THEORY_COLUMNS if c in summary]]
    said = []
    spread = "median {} (range {} to {})".format
    if "growth_bounds" in checks:
        detail = checks["growth_bounds"].detail
        ratio = detail["bound_ratio"].dropna()
        if len(ratio):
            within = spread(*map(number, (ratio.median(), ratio.min(), ratio.max())))
            said.append(
                f"Theorem 3 with rho0 = {number(detail['rho0'].iloc[0])} from the data (K ="
                f" {int(detail['K'].iloc[0])}): at the last checkpoint the measured"
                f" ln(chi) / 2 is {within} times the bound B (over {len(ratio)}"
                " class-heads);"
                f" the theorem puts it between f0^2 and 1, and"
                f" {100 * detail['inside'].mean():.0f} % of class-heads lie there."
            )
    if "theory_fit" in checks and "snap_ratio" in summary:
        r = summary["snap_ratio"].dropna()
        if len(r):
            within = spread(*map(number, (r.median(), r.min(), r.max())))
            said.append(
                f"Measured snap / snap of the population dynamics: {within}; rank agreement"
                f" {number(summary['rank_agreement'].median())}, logit-change correlation"
                f" {number(summary['dz_corr'].median())} (medians over heads)."
            )
    text = "".join(f"<p>{html.escape(x)}</p>" for x in [*limits, *said])
    return "<h2>Theory against measurement</h2>" + text + table_html(table)


def _overview(analysis: Analysis, settings: dict) -> str:
    traj, groups = analysis.traj, analysis.groups
    plan = traj.plan
    steps = traj.steps.tolist()
    items = {
        "checkpoints": f"{len(steps)} ({traj.step_unit} {steps[0]} to {steps[-1]})",
        "layers / heads": f"{traj.layers} / {traj.heads}",
        "recorded": f"{plan.num_queries} queries (their logits zbar); {plan.num_classes} of"
        " their classes (m, n) with their attention per token (c_hat)",
        "aggregates": "; ".join(
            name + ("" if name not in traj.rows else f" ({traj.rows[name]})")
            for name in traj.values
        ),
        "token groups": "none (see Not measured)"
        if groups is None
        else f"{groups.num_classes} classes of the {groups.source} statistics have distinct"
        f" tokens; {len(shown_classes(traj, groups, most=None))} of them are recorded",
        "skipped checkpoints": str(len(traj.skipped)),
    }
    if steps[0] > 0:  # a Trainer run saved without step 0, say: dz starts from there
        items["first checkpoint"] = (
            f"{traj.step_unit} {steps[0]}, not an untrained model: every change (dz) and the"
            " baselines are measured from it"
        )
    if settings["classification"] is not None:
        window = settings["window"]
        items["classification"] = (
            analysis.classification.describe()
            + f"; statistics window {'whole rows' if window is None else window}"
        )
    if "uncertainty" in settings:
        u = settings["uncertainty"]
        items["uncertainty"] = (
            f"{100 * u['level']:.0f} % intervals, verdicts at {u['alpha']:g} ({u['correction']}"
            f" over the heads), at least {u['min_units']:g} effective units"
        )
        items["scan's units"] = "the recorded queries with both kinds"
        if u.get("queries") is not None:
            items["scan's units"] = (
                f"{u['queries']} recorded queries hold both distinct and common tokens"
            )
        if shared := u.get("shared") or []:  # the tokens the verdict leaves out, and why
            limit = (settings["classification"] or {}).get("max_shared", "max_shared")
            shown = ", ".join(repr(traj.plan.decode(t)) for t in shared[:12])
            more = f" and {len(shared) - 12} more" if len(shared) > 12 else ""
            items["scan's units"] += (
                f"; left out, as distinct and as common: {len(shared)} tokens that the corpus"
                f" makes distinct for more than {limit} times as many queries as the median"
                f" distinct token ({shown}{more}), decided from the statistics before any"
                " attention is read: one token distinct for a third of the queries would make"
                " the verdict rest on it alone (max_shared, 0 keeps them)"
            )
    items.update({k: str(v) for k, v in traj.meta.items() if not isinstance(v, dict | list)})
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items.items()
    )
    return f"<table class='overview'>{rows}</table>"


_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
table.overview th { text-align: left; background: #f4f4f4; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; }
div.table { max-width: 100%; overflow-x: auto; }
div.table td { white-space: nowrap; }
div.findings { display: flex; gap: 1.5em; align-items: flex-start; }
div.findings > div { flex: 1 1 45%; } div.findings > div.aside { flex: 1 1 55%; }
div.findings figure { margin: 0 0 1em 0; }
div.aside img { max-height: 38vh; }
div.findings li { margin: 0.3em 0; }
figcaption { font-size: 0.9em; color: #444; }
</style>"""


# ------------------------------------------------------------------ several runs
RUNS_COLUMNS = [
    "layer",
    "head",
    "scans_share",
    "bias",
    "bias_within",
    "auroc",
    "auroc_within",
    "snap_step",
    "snap_step_within",
]
HOW_TO_READ_RUNS = (
    "Each run is one unit.  A run's own interval (<i>within</i>: the median half-width of the"
    " runs' intervals) resamples the queries and context tokens of that one trained model; the"
    " interval over runs (<i>mean [lo, hi]</i>) is Student's t on the runs' estimates with"
    " runs - 1 degrees of freedom, for the mean of runs of this recipe (another seed, the"
    " deduped twin); runs that share their initial weights (what the runs share, below) count"
    " as one unit, and runs that all share them give none (they tell that initialisation, not"
    " the recipe); steps on the log-step axis (a geometric mean) and holding the mean of the"
    " runs' own brackets (a run's step is known no better than its checkpoints place it; a"
    " layer's median step, the median of its heads' brackets), each kept within what the"
    " figure can be (AUROC and head-type scores in [0, 1], steps within the runs, counts"
    " within the layer's heads).  Where the"
    " interval over runs is much wider than the within-run one, the runs differ beyond what"
    " each knows of itself: a figure of one run is that run's, not the recipe's.  scans_share"
    ' is the share of runs whose verdict is "scans", with its Clopper-Pearson interval;'
    " each run's verdict is in its column.  Fewer than 2 runs with a value give no interval"
    " (the reason column says so)."
)


def write_runs_report(comparison, out: str | Path, title: str | None = None) -> Report:
    """Write several runs' comparison (`reading.measure_runs`) into the folder `out`:
    ``runs.html`` (what survives across the runs, the across-run tables, how heads were
    matched, each run's verdicts, the figures), the comparison's CSVs (`RunComparison.save`)
    and the figures as PNG files.  Made beside `out` and moved in, as `write_report`."""
    out = Path(out)
    with staged_folder(out) as stage:
        report = _write_runs_report(comparison, stage, title)
    files = {k: out / v.relative_to(stage) for k, v in report.files.items()}
    return Report(files["report"], report.summary, files, report.not_measured)


def _over_runs(frame: pd.DataFrame, figures: list[str]) -> pd.DataFrame:
    """`frame` with each figure's mean over runs as "mean [lo, hi]" under the figure's name."""
    renamed = frame.rename(columns={f"{f}_mean": f for f in figures})
    dropped = ("_lo", "_hi", "_sd", "_n")
    kept = [c for c in renamed.columns if not c.endswith(dropped) and "verdict_" not in c]
    return with_intervals(renamed, kept)


def _runs_loss_figure(comparison, path: Path):
    losses = comparison.losses
    curves = {
        run: (rows["step"].tolist(), rows["loss"].tolist())
        for run, rows in losses.groupby("run", sort=False)
    }
    marks = {}
    layers = comparison.layers if comparison.layers is not None else pd.DataFrame()
    for row in layers.to_dict("records"):
        if pd.notna(row.get("snap_step_median_mean")):
            ends = ("_mean", "_lo", "_hi")  # the step over runs within its interval
            marks[f"layer {int(row['layer'])} snap"] = tuple(
                float(row.get(f"snap_step_median{end}", math.nan)) for end in ends
            )
    return plot_loss_with_steps(curves, marks, path=path)


def _runs_figures(comparison, folder: _Folder) -> None:
    """The runs page's figures: each figure over runs, the losses, the map of one figure."""
    for column in ("bias", "auroc", "snap_step"):
        folder.figure(
            f"runs_{column}",
            f"{column} of every head in every run (colours, with each run's own interval) and"
            " the mean over runs with its interval over runs (black)",
            partial(plot_runs, comparison, column),
        )
    if comparison.losses is not None:
        folder.figure(
            "runs_loss",
            "Each run's evaluation loss at its checkpoints, with each layer's snap step (the"
            " median over its heads, averaged over runs; dashed) and its interval over runs"
            " (shaded)",
            partial(_runs_loss_figure, comparison),
        )
    mapped = next(
        (
            c
            for c in ("bias", "snap_step")
            if c in comparison.per_run and comparison.per_run[c].notna().any()
        ),
        "bias",
    )
    folder.figure(
        f"runs_map_{mapped}",
        f"{mapped} over [layer, head], one panel per run on one scale (heads matched as the"
        " table below says; heads that scan ringed)",
        partial(plot_runs_maps, comparison, mapped),
    )


SPLIT_NOTE = (
    "How the spread between runs splits: <i>init</i> is the variance the initial weights"
    " alone move, <i>data</i> the data order's, <i>rest</i> what neither moves alone (their"
    " interaction, nondeterminism), each as a share of the variance between runs that differ"
    " in both, with its 95 % interval (generalised pivots: exact where the runs form a"
    " balanced grid, <i>anova</i>; from the kinds of pairs, <i>pairs</i>, otherwise) and"
    " <i>sd</i> its spread on the log-step axis for steps.  A part the runs cannot tell apart"
    " (no two runs share a data order) is counted in the rest.  Runs far from what their"
    " initial weights and data order predict (<i>far_runs</i>: a standardised residual of"
    " the additive fit beyond what 99 % of normal runs of the design show) are left out of"
    " the split and named: the shares are the typical runs'."
)


def _shared_html(comparison) -> list[str]:
    """What the runs share (`RunComparison.design`) and the spread split, where known."""
    design, split = comparison.design, comparison.split
    if design is None or (design["said"] == "its own").all():
        return []
    out = ["<h2>What the runs share</h2>", table_html(design)]
    if split is not None and len(split):
        shown = with_intervals(
            split, ["layer", "head", "figure", "part", "share", "sd", "df", "method", "far_runs"]
        )
        out += [
            "<h2>The spread between runs, split</h2>",
            f"<p>{SPLIT_NOTE}</p>",
            table_html(shown),
        ]
    return out


def _write_runs_report(comparison, out: Path, title: str | None) -> Report:
    make_folder(out / "figures")
    folder = _Folder(out, expected=5)
    comparison.save(out)
    for name in (
        "runs.json",
        "per_run.csv",
        "across_runs.csv",
        "across_runs_layers.csv",
        "matching.csv",
        "design.csv",
        "split.csv",
    ):
        if (out / name).is_file():
            folder.files[name.split(".")[0]] = out / name
    _runs_figures(comparison, folder)
    title = title or f"scansnap_lens: {len(comparison.runs)} runs compared"
    table = comparison.table
    # each run's verdict; their reasons are in per_run.csv
    verdicts = with_intervals(
        table, ["layer", "head", *[c for c in table if c.startswith("verdict_")]]
    )
    figures = [c.removesuffix("_mean") for c in table.columns if c.endswith("_mean")]
    shown = _over_runs(table, figures)
    if "scans_share" in table:
        shown["scans_share"] = [
            f"{int(k)}/{int(n)} [{number(a)}, {number(b)}]"
            for k, n, a, b in zip(
                table["scans_runs"], table["runs"], table["scans_share_lo"], table["scans_share_hi"]
            )
        ]
    order = [c for c in RUNS_COLUMNS if c in shown]
    shown = shown[order + [c for c in shown.columns if c not in order and c != "scans_runs"]]
    layers = comparison.layers
    layer_html = []
    if layers is not None and len(layers):
        per_layer = [f.removesuffix("_mean") for f in layers.columns if f.endswith("_mean")]
        layer_html = [
            "<h2>Across runs, per layer (whichever heads they are)</h2>",
            table_html(_over_runs(layers, per_layer)[["layer", "runs", *per_layer]]),
        ]
    shared_html = _shared_html(comparison)
    matched = "<p>Heads are compared by index.</p>"
    if comparison.matching is not None:
        matched = (
            "<h2>How heads were matched</h2><p>Each head of a run is compared with the head of"
            f" {html.escape(comparison.runs[0])} whose attention on the example prompt at the"
            " last checkpoint is closest (mean total variation over positions, one head each:"
            " the Hungarian method per layer).  <i>similarity</i> is 1 minus that distance;"
            " <i>chance</i> the mean similarity of all pairs of the layer's heads: a match"
            " near chance says the heads do nothing this prompt tells apart.</p>"
            + table_html(comparison.matching[comparison.matching["run"] != comparison.runs[0]])
        )
    runs = "<p>Runs: " + ", ".join(html.escape(r) for r in comparison.runs) + "</p>"
    sections = [
        *layer_html,
        *shared_html,
        "<h2>Across runs (one row per matched head)</h2>",
        table_html(shown),
        f"<p>{HOW_TO_READ_RUNS}</p>",
        matched,
        "<h2>Each run's verdict</h2>",
        table_html(verdicts),
    ]
    findings = (runs, "What holds across the runs", runs_findings_of(comparison), "")
    aside = (next((k for k in folder.figures if k.startswith("runs_map")), ""), "runs_loss")
    body = folder.page(title, findings, aside, sections, [], "Not drawn", script=False)
    folder.files["report"] = out / "runs.html"
    write_text(folder.files["report"], body)
    return Report(folder.files["report"], table, folder.files, folder.not_measured)
