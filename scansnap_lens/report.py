"""One self-contained HTML report of a trajectory: summary, figures, circuitsvis views.

    report = write_report(traj, groups, "out/report")
    report.path            # out/report/report.html: opens offline in any browser

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from scansnap_lens import measures
from scansnap_lens._io import write_text
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.context import require_same
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["Report", "write_report"]

HOW_TO_READ = """
<ul>
<li><b>bias</b>: mean change of the attention logit of a query's <i>distinct</i> tokens minus
that of its <i>common</i> tokens since the first checkpoint; &gt; 0 is the scan's
discriminative bias. <b>auroc</b>: how cleanly the change separates distinct from common
(0.5: not at all, 1: perfectly).</li>
<li><b>spearman</b>: rank correlation of the change of distinct tokens with P(l|m, n); &gt; 0 is
the frequency bias (frequent co-occurrence gains more).</li>
<li><b>entropy</b>: entropy (nats) of the attention over a class's distinct tokens,
renormalised (lower is sparser); <b>distinct_mass</b>: attention on distinct tokens;
<b>top_share</b>: the best distinct token's share of it (1 would be winner-takes-all).</li>
<li><b>snap_step</b>: the snapping time, the step at which the attention's rate of movement
per step has fallen to half of its peak (a property of the dynamics: training longer does not
move it); empty with <b>snap_reason</b> "not yet snapped" when the run ends before, "no scan"
when the attention never moves.  Secondary, and dependent on the run's length:
<b>snap_path</b>, the first checkpoint by which 90&nbsp;% of the attention's movement is done,
and <b>snap_rate</b>, the checkpoint after which its movement per log-step stays under
10&nbsp;% of its peak.  <b>predicted_snap</b>: the theory's t0 at the effective rates (SGD:
lr / (1 - momentum); none for Adam) where the training is known.</li>
<li><b>Theory against measurement.</b> <b>bound_ratio</b>: the measured logit change of each
class's most frequent distinct token, ln(chi)/2, over Theorem 4's B(t) (rho0 estimated from
the data); Theorem 3 puts it between f0<sup>2</sup> and 1, <b>inside</b> is the share of
classes that are.  <b>population_snap</b>: the snap step of the paper's population dynamics
integrated on the training corpus's statistics at the training's own optimizer and rates
(attention predicted from the statistics alone); <b>snap_ratio</b>: measured over predicted.
<b>rank_agreement</b>: Spearman correlation of predicted and measured attention over each
class's distinct tokens; <b>dz_corr</b>: correlation of predicted and measured logit changes
over the tracked pairs.  1 means the head does what the theory says.</li>
<li><b>attention_entropy</b>: Fig. 10, the entropy of each head's attention row averaged over
the evaluation positions (the query's own position counts when the recording includes it).
The heads table ranks every head by AUROC, then bias; the heads figure maps bias, AUROC,
snap_step and attention_entropy over [layer, head].</li>
</ul>
"""


# The columns a reader needs first, in the page and on the command line; every column is in
# summary.csv and explained under "How to read it".
KEY_COLUMNS = ["layer", "head", "bias", "auroc", "spearman", "entropy", "distinct_mass",
               "top_share", "snap_step", "predicted_snap", "population_snap", "rank_agreement",
               "bound_ratio"]  # fmt: skip
HEAD_COLUMNS = ["rank", "layer", "head", "auroc", "bias", "spearman", "snap_step",
                "attention_entropy", "dz_corr", "rank_agreement"]  # fmt: skip
HEAD_GRID = ("bias", "auroc", "snap_step", "attention_entropy", "dz_corr")


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
            f"{html.escape(str(self.path))}</a></p>"
            + self.summary.to_html(index=False, float_format=lambda v: f"{v:.3g}")
        )


def _figure_tag(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(caption)}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _best_head(summary: pd.DataFrame) -> tuple[int, int]:
    """The layer and head that scan most (largest final bias), else the first."""
    if "bias" in summary and summary["bias"].notna().any():
        row = summary.loc[summary["bias"].idxmax()]
    else:
        row = summary.iloc[0]
    return int(row["layer"]), int(row["head"])


def write_report(
    traj: Trajectory,
    groups: TokenGroups,
    out: str | Path,
    title: str = "scansnap_lens report",
    prediction=None,
    views: bool = True,
    token_strings=None,
    source=None,
    training: dict | None = None,
    loss_positions: int | None = None,
    checks: dict | None = None,
) -> Report:
    """Measure `traj` against `groups` and write the report folder `out`.

    prediction: the theory's snap step (see `measures.summarize`); views: include the
    circuitsvis views (they need the trajectory's example prompt); token_strings: strings of
    the prompt's tokens for the views (default: the plan's).  source: the training corpus's
    `CooccurrenceStats` (or the lab's `SequenceClasses`), for the theory's checks
    (`fit.theory_checks`: Theorem 3's bounds, attention predicted from the statistics);
    without it the bounds use the evaluation text's statistics and there is no prediction.
    training, loss_positions: see `fit.theory_fit`.  checks: the theory's checks computed
    already (``{"growth_bounds": ..., "theory_fit": ...}``), used instead of `source`.
    """
    from scansnap_lens.viz import figures
    from scansnap_lens.viz import views as cv

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: the report needs a folder (give another --out)")
    for statistics in (groups, source):  # before anything is measured or written
        require_same(statistics, traj.plan)
    figures_dir = out / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    not_measured: dict[str, str] = {}

    from scansnap_lens.measures import growth_bounds, theory_checks

    if checks is not None:
        why = {k: "not given" for k in ("growth_bounds", "theory_fit") if k not in checks}
    elif source is not None:
        checks, why = theory_checks(traj, groups, source, training, loss_positions)
    else:
        checks, why = {}, {"theory_fit": "needs the training corpus's statistics (source=)"}
        try:
            checks["growth_bounds"] = growth_bounds(traj, groups, training=training)
        except ValueError as err:
            why["growth_bounds"] = str(err)
    not_measured.update(why)
    results, why = measures.measure_all(traj, groups)  # once, shared with the summary
    not_measured.update(why)
    summary = measures.summarize(
        traj, groups, prediction, checks=checks, training=training, results=results
    )
    if "sparsity" in results and not results["sparsity"].table["sparsity_classes"].iloc[0]:
        not_measured["entropy, top_share"] = measures.SINGLE_DISTINCT
    snaps = results["snapping"]
    results.update(checks)

    def csv(name: str, frame: pd.DataFrame) -> None:
        files[name] = out / f"{name}.csv"
        write_text(files[name], frame.to_csv(index=False))

    csv("summary", summary)
    for name, result in results.items():
        csv(name, result.table)
        if result.detail is not None:
            csv(f"{name}_detail", result.detail)

    # ---- figures
    sections: list[str] = []

    def figure(name: str, caption: str, make) -> None:
        path = figures_dir / f"{name}.png"
        try:
            make(path)
        except ValueError as err:
            not_measured[f"figure {name}"] = str(err)
            return
        files[f"figure_{name}"] = path
        sections.append(_figure_tag(path, caption))

    if "discriminative_bias" in results:
        figure(
            "logit_change",
            "The scan: logit change of distinct (solid) and common (dashed) tokens",
            lambda p: figures.plot_logit_change(results["discriminative_bias"], path=p),
        )
    if "frequency_bias" in results:
        figure(
            "frequency_bias",
            "Frequency bias: Spearman correlation of the logit change with P(l|m, n)",
            lambda p: figures.plot_over_steps(
                results["frequency_bias"].table, "spearman", title="frequency bias", path=p
            ),
        )
    if "sparsity" in results:
        table = results["sparsity"].table
        figure(
            "entropy",
            "Entropy of the attention over distinct tokens; dotted: snap step (path fraction)",
            lambda p: figures.plot_over_steps(
                table, "entropy", snaps=snaps.table, title="entropy over distinct tokens", path=p
            ),
        )
        figure(
            "distinct_mass",
            "Attention mass on distinct tokens; dotted: snap step",
            lambda p: figures.plot_over_steps(
                table, "distinct_mass", snaps=snaps.table, title="mass on distinct tokens", path=p
            ),
        )
    if "attention_entropy" in results:
        entropy = results["attention_entropy"]
        figure(
            "attention_entropy",
            "Fig. 10: entropy of each head's attention row, averaged over the evaluation"
            " positions" + (" (the query's own position included)" if traj.plan.include_self
            else " (the query's own position excluded)") + "; dotted: snap step",
            lambda p: figures.plot_over_steps(
                entropy.table, "attention_entropy", snaps=snaps.table,
                title="attention entropy (nats)", path=p,
            ),
        )  # fmt: skip
    ranking = measures.rank_heads(summary)
    csv("head_ranking", ranking)
    if len(summary) > 1:
        figure(
            "heads",
            "Every head by layer: scan (bias, AUROC), snap (snap_step), attention entropy and"
            " theory fit (dz_corr: logit changes against the population dynamics)",
            lambda p: figures.plot_head_grid(
                summary, traj.layers, traj.heads, columns=HEAD_GRID, path=p
            ),
        )
    layer, head = _best_head(summary)
    # the most frequent classes that the recording tracks (the statistics hold more)
    tracked = torch.isin(groups.query * traj.plan.vocab_size + groups.next_token,
                         traj.plan.class_keys).numpy()  # fmt: skip
    order = [int(k) for k in np.argsort(-groups.events.numpy(), kind="stable") if tracked[k]][:4]
    figure(
        "class_attention",
        f"Per-token attention over training, layer {layer} head {head}"
        " (Fig. 4 layout: common tokens above the line, distinct below by increasing P)",
        lambda p: figures.plot_class_attention(traj, groups, layer, head, order, path=p),
    )
    if traj.prompt_pattern is not None:
        chosen = cv.spread_steps(traj, None, most=6)
        figure(
            "attention_maps",
            f"Attention of the example prompt at several checkpoints (layer {layer}, head {head})",
            lambda p: figures.plot_attention_maps(
                [cv.prompt_pattern(traj, s, layer, head).numpy() for s in chosen],
                chosen,
                title=f"layer {layer}, head {head}",
                path=p,
            ),
        )
    predicted = summary["predicted_snap"].to_numpy(dtype=float)
    if np.isfinite(predicted).any():
        figure(
            "theory",
            "Theory: growth factor bound and t0 (dotted) against the measured snap (dashed)",
            lambda p: _theory_figure(traj, summary, p, training),
        )

    theory_html = ""
    if "growth_bounds" in checks:
        figure(
            "growth_bounds",
            "Theorem 3: measured growth factor of each class's dominant distinct token (solid)"
            " and its bounds from Theorem 4 with rho0 from the data (band, dotted: upper)",
            lambda p: figures.plot_growth_bounds(checks["growth_bounds"].table, path=p),
        )
    if "theory_fit" in checks:
        fit = checks["theory_fit"]
        figure(
            "theory_fit",
            "Each head against the population dynamics on the training corpus's statistics:"
            " rank agreement of the attention over distinct tokens, correlation of logit changes",
            lambda p: figures.plot_theory_fit(fit.table, path=p),
        )
        figure(
            "predicted_attention",
            "Per-token attention predicted from the corpus statistics alone (population"
            " dynamics at the training's rates; same layout as the measured one above)",
            lambda p: figures.plot_class_attention(
                fit.predictions[0], groups, 0, 0, order, title="predicted", path=p
            ),
        )
    if checks:
        theory_html = _theory_section(summary, checks)

    # ---- circuitsvis views
    view_parts: list[str] = []
    if views and traj.prompt_pattern is not None:
        made = [cv.attention_over_checkpoints(traj, layer, [head], token_strings=token_strings)]
        try:
            made.append(cv.token_kinds(traj, groups, token_strings=token_strings))
            made.append(
                cv.query_attention(
                    traj, groups, layer=layer, head=head, token_strings=token_strings
                )
            )
        except ValueError as err:
            not_measured["token views"] = str(err)
        for i, view in enumerate(made):
            view_parts.append(f"<h3>{html.escape(view.title)}</h3>\n{view.fragment(f'view-{i}')}")
    elif views:
        not_measured["views"] = "the trajectory holds no example prompt"

    # ---- summary.json and the page
    files["summary_json"] = out / "summary.json"
    files["report"] = out / "report.html"
    payload = {
        "title": title,
        "steps": traj.steps.tolist(),
        "step_unit": traj.step_unit,
        "layers": traj.layers,
        "heads": traj.heads,
        "meta": traj.meta,
        "skipped": traj.skipped,
        "summary": json.loads(summary.to_json(orient="records")),
        "not_measured": not_measured,
        "files": {
            k: v.name if v.parent == out else str(v.relative_to(out)) for k, v in files.items()
        },
    }
    write_text(files["summary_json"], json.dumps(payload, indent=1))
    body = [
        f"<h1>{html.escape(title)}</h1>",
        _overview(traj, groups),
        "<h2>Summary (one row per layer and head, at the last checkpoint)</h2>",
        summary[[c for c in KEY_COLUMNS if c in summary]]
        .head(50)
        .to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="–"),
        f"<p>The first 50 heads and the main columns; all {len(summary.columns)} columns of"
        f" every head are in <code>summary.csv</code>.  Each is explained under"
        " <i>How to read it</i>; a dash is a value that could not be measured (see"
        " <i>Not measured</i> and the <code>snap_reason</code> column).</p>",
        "<h2>Heads ranked by scan (AUROC, then bias)</h2>",
        ranking[[c for c in HEAD_COLUMNS if c in ranking]]
        .head(20)
        .to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="–"),
        theory_html,
        "<h2>How to read it</h2>",
        HOW_TO_READ,
        "<h2>Figures</h2>",
        *sections,
    ]
    if view_parts:
        body += ["<h2>circuitsvis views</h2>", *view_parts]
    if not_measured:
        body.append("<h2>Not measured</h2><ul>")
        body += [f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in not_measured.items()]
        body.append("</ul>")
    write_text(files["report"], cv.page(title, "\n".join(body), head=_STYLE))
    return Report(files["report"], summary, files, not_measured)


THEORY_COLUMNS = ["layer", "head", "snap_step", "predicted_snap", "population_snap", "snap_ratio",
                  "rank_agreement", "dz_corr", "bound_ratio", "inside"]  # fmt: skip


def _spread(values: pd.Series) -> str:
    return f"median {values.median():.3g} (range {values.min():.3g} to {values.max():.3g})"


def _theory_section(summary: pd.DataFrame, checks: dict) -> str:
    """The theory against the measurement, per head, with the numbers said in words."""
    table = summary[[c for c in THEORY_COLUMNS if c in summary]]
    said = []
    if "growth_bounds" in checks:
        detail = checks["growth_bounds"].detail
        ratio = detail["bound_ratio"].dropna()
        if len(ratio):
            said.append(
                f"Theorem 3 with rho0 = {detail['rho0'].iloc[0]:.3g} from the data (K ="
                f" {int(detail['K'].iloc[0])}): at the last checkpoint the measured"
                f" ln(chi) / 2 is {_spread(ratio)} times the bound B (over {len(ratio)}"
                " class-heads);"
                f" the theorem puts it between f0^2 and 1, and"
                f" {100 * detail['inside'].mean():.0f} % of class-heads lie there."
            )
    if "theory_fit" in checks and "snap_ratio" in summary:
        r = summary["snap_ratio"].dropna()
        if len(r):
            said.append(
                f"Measured snap / snap of the population dynamics: {_spread(r)}; rank agreement"
                f" {summary['rank_agreement'].median():.3g}, logit-change correlation"
                f" {summary['dz_corr'].median():.3g} (medians over heads)."
            )
    text = "".join(f"<p>{html.escape(x)}</p>" for x in said)
    return (
        "<h2>Theory against measurement</h2>"
        + text
        + table.to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="–")
    )


def _overview(traj: Trajectory, groups: TokenGroups) -> str:
    plan = traj.plan
    steps = traj.steps.tolist()
    items = {
        "checkpoints": f"{len(steps)} ({traj.step_unit} {steps[0]} to {steps[-1]})",
        "layers / heads": f"{traj.layers} / {traj.heads}",
        "tracked": f"{plan.num_queries} queries, {plan.num_classes} classes (m, n)",
        "token groups": f"{groups.num_classes} classes with distinct tokens ({groups.source})",
        "skipped checkpoints": str(len(traj.skipped)),
    }
    items.update({k: str(v) for k, v in traj.meta.items() if not isinstance(v, dict | list)})
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items.items()
    )
    return f"<table class='overview'>{rows}</table>"


def _theory_figure(traj: Trajectory, summary: pd.DataFrame, path: Path, training=None):
    from scansnap_lens.viz import figures

    theories = {(t.lr_y, t.lr_z): t for t in measures.theory_of(traj, training) if t is not None}
    theories = list(theories.values())  # one curve per distinct pair of rates
    snap = float(summary["snap_step"].iloc[0])
    measured = [snap] if len(theories) == 1 and math.isfinite(snap) else []
    last = max(float(traj.steps[-1]), max(t.t0 for t in theories)) * 2
    t = np.logspace(0, math.log10(max(last, 10.0)), 200)
    return figures.plot_growth_factor(theories, t, path=path, measured=measured)


_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
table.overview th { text-align: left; background: #f4f4f4; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; }
figcaption { font-size: 0.9em; color: #444; }
</style>"""
