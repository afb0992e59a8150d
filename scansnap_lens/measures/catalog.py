"""The table of measurements: for each quantity, the function that measures it, what it needs,
the columns it gives the summary, the report's figures of it and how to read it.

`measure_all`, `summarize`, the report's CSVs, sections, figures and "How to read it" all
iterate over `MEASURES`; adding a measurement is one module plus one entry here.

>>> [m.name for m in MEASURES]  # in the summary's column order
['snapping', 'discriminative_bias', 'frequency_bias', 'sparsity', 'attention_entropy', \
'growth_factor', 'growth_bounds', 'theory_fit', 'uncertainty', 'previous_token', \
'first_token', 'induction']
>>> measure_named("growth_bounds").summary  # the columns it gives the one-row-per-head summary
('bound_ratio', 'inside')
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scansnap_lens.measures.discriminative import discriminative_bias
from scansnap_lens.measures.entropy import attention_entropy, sparsity
from scansnap_lens.measures.fit import growth_bounds, theory_fit
from scansnap_lens.measures.frequency import frequency_bias
from scansnap_lens.measures.growth import growth_factor
from scansnap_lens.measures.head_types import MIN_RISE, head_type
from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.measures.snap import snapping
from scansnap_lens.measures.uncertainty import UNCERTAINTY_COLUMNS, scan_uncertainty
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = [
    "MEASURES",
    "ROLES",
    "Measure",
    "MeasureInputs",
    "Plot",
    "columns",
    "measure_named",
    "measures_of",
]

# Where a measurement's columns are shown (`Measure.shown`): the page's first table and the
# command line's summary; the ranked heads table; the maps over [layer, head]; the atlas
# (values with their intervals); each run's values in a comparison of runs; and the step
# columns whose value means a head formed (counted per layer across runs).
ROLES = ("key", "heads", "grid", "atlas", "runs", "formed")
FIRST = ("layer", "head", "scans", "verdict")  # every head table opens with these

NEEDS_SOURCE = "needs the training corpus's statistics (source=, stats=)"


@dataclass
class MeasureInputs:
    """What a measurement may read: the trajectory, the token groups (None where none could be
    formed, `groups_reason` says why), the training corpus's statistics and the one
    `AnalysisSettings` value its settings come from (the training's rates, the classes and
    seconds the theory fit may take at most: `fit.theory_fit`)."""

    traj: Trajectory
    groups: TokenGroups | None = None
    source: object | None = None
    settings: AnalysisSettings = field(default_factory=AnalysisSettings)
    groups_reason: str = "no token groups were given"


@dataclass(frozen=True)
class Plot:
    """One figure of a measurement in the report, drawn by its `painter`: the name of a
    `viz.figures` function that `viz.figures.paint` calls as ``painter(result, plot, snaps, path)``
    (``paint_over_steps`` plots `column` per head over the checkpoints, with each head's snap
    step dotted where `snaps`; the others draw the whole measurement)."""

    name: str
    caption: str
    painter: str
    column: str | None = None
    title: str = ""
    snaps: bool = False
    limits: tuple[float, float] | None = None  # the value axis's, where it has bounds


@dataclass(frozen=True)
class Measure:
    """One entry of the table.  `summary`: the columns of its last checkpoint that join the
    one-row-per-head summary (None: every column; empty: none); `shown`: where the summary's
    columns of its quantity are shown ({role in `ROLES`: columns}; an interval's columns may
    come from another measurement); `explains`: its paragraph of the report's "How to read
    it" (HTML)."""

    name: str
    measure: Callable[[MeasureInputs], Measurement]
    needs_groups: bool = True
    needs_source: bool = False
    summary: tuple[str, ...] | None = None
    plots: tuple[Plot, ...] = field(default_factory=tuple)
    explains: str = ""
    shown: Mapping[str, tuple[str, ...]] | str = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.shown, str):  # "role: column column; role: column"
            roles = (part.split(":") for part in self.shown.split(";") if part.strip())
            object.__setattr__(self, "shown", {r.strip(): tuple(c.split()) for r, c in roles})
        unknown = set(self.shown) - set(ROLES)
        if unknown:
            raise ValueError(f"measure {self.name}: roles must be among {ROLES}, not {unknown}")

    def run(self, inputs: MeasureInputs) -> Measurement:
        """The measurement; ValueError naming what is missing where it cannot be made."""
        if self.needs_groups and inputs.groups is None:
            raise ValueError(inputs.groups_reason)
        if self.needs_source and inputs.source is None:
            raise ValueError(NEEDS_SOURCE)
        return self.measure(inputs)


MEASURES: tuple[Measure, ...] = (
    Measure(
        "snapping",
        lambda x: snapping(x.traj),
        needs_groups=False,
        explains="<b>snap_step</b>: the snapping time, the step at which the attention's rate"
        " of movement per step has fallen to half of its peak (a property of the dynamics:"
        ' training longer does not move it); empty with <b>snap_reason</b> "not yet snapped"'
        ' when the run ends before, "no scan" when the attention never moves.  Secondary, and'
        " dependent on the run's length: <b>snap_path</b>, the first checkpoint by which"
        " 90&nbsp;% of the attention's movement is done, and <b>snap_rate</b>, the checkpoint"
        " after which its movement per log-step stays under 10&nbsp;% of its peak."
        "  Rates are read over the checkpoints between which the attention moves as a drift"
        " (<b>drift_checkpoints</b> of the <b>checkpoints</b>: fewer where step-to-step"
        " noise dominates the movement between them, as in a run with small batches recorded"
        " often).  <b>straightness</b>: the movement over two intervals over the sum of the"
        " two (1 for a steady drift, 0.71 for step-to-step noise).  Functions of the state"
        " beside the rate, which depend on where the run ends: <b>half_distance_step</b>,"
        " where the attention's distance to the last checkpoint's has halved, and"
        " <b>half_displacement_step</b>, where half its net displacement from the first is"
        " done."
        "  <b>predicted_snap</b>: the theory's t0 at the effective rates (SGD: lr / (1 -"
        " momentum); none for Adam) where the training is known.",
        shown="key: snap_step half_distance_step drift_checkpoints predicted_snap; heads:"
        " snap_step; grid: snap_step; atlas:"
        " snap_step snap_step_lo snap_step_hi drift_checkpoints half_distance_step"
        " half_displacement_step; runs: snap_step snap_step_lo"
        " snap_step_hi snap_step_grid_lo snap_step_grid_hi snap_reason drift_checkpoints"
        " checkpoints straightness",
    ),
    Measure(
        "discriminative_bias",
        lambda x: discriminative_bias(x.traj, x.groups),
        plots=(
            Plot(
                "logit_change",
                "The scan: logit change of distinct (solid) and common (dashed) tokens",
                "paint_logit_change",
            ),
            Plot(
                "auroc_over_steps",
                "How each head's scan evolved: AUROC of the logit change separating distinct"
                " from common tokens, a line per head; dotted: its snap_step",
                "paint_over_steps",
                "auroc",
                "scan (AUROC) over checkpoints",
                snaps=True,
            ),
        ),
        explains="<b>bias</b>: mean change of the attention logit of a query's <i>distinct</i>"
        " tokens minus that of its <i>common</i> tokens since the first checkpoint; &gt; 0 is"
        " the scan's discriminative bias.  <b>auroc</b>: how cleanly the change separates"
        " distinct from common (0.5: not at all, 1: perfectly).",
        shown="key: bias auroc; heads: auroc bias; grid: bias auroc; atlas: bias bias_lo"
        " bias_hi auroc auroc_lo auroc_hi auroc_p auroc_n_eff auroc_mde held_auroc"
        " held_auroc_lo held_auroc_hi frequency_control; runs: bias bias_lo"
        " bias_hi auroc auroc_lo auroc_hi",
    ),
    Measure(
        "frequency_bias",
        lambda x: frequency_bias(x.traj, x.groups),
        plots=(
            Plot(
                "frequency_bias",
                "Frequency bias: Spearman correlation of the logit change with P(l|m, n)",
                "paint_over_steps",
                "spearman",
                "frequency bias",
            ),
        ),
        explains="<b>spearman</b>: rank correlation of the change of distinct tokens with"
        " P(l|m, n); &gt; 0 is the frequency bias (frequent co-occurrence gains more).",
        shown="key: spearman spearman_p; heads: spearman; runs: spearman; atlas: spearman"
        " spearman_lo spearman_hi spearman_p spearman_classes",
    ),
    Measure(
        "sparsity",
        lambda x: sparsity(x.traj, x.groups),
        plots=(
            Plot(
                "entropy",
                "Entropy of the attention over distinct tokens; dotted: snap_step",
                "paint_over_steps",
                "entropy",
                "entropy over distinct tokens",
                snaps=True,
            ),
            Plot(
                "distinct_mass",
                "Attention mass on distinct tokens; dotted: snap_step",
                "paint_over_steps",
                "distinct_mass",
                "mass on distinct tokens",
                snaps=True,
            ),
        ),
        explains="<b>entropy</b>: entropy (nats) of the attention over a class's distinct"
        " tokens, renormalised (lower is sparser); <b>distinct_mass</b>: attention on distinct"
        " tokens; <b>top_share</b>: the best distinct token's share of it (1 would be"
        " winner-takes-all).",
        shown="key: entropy distinct_mass top_share",
    ),
    Measure(
        "attention_entropy",
        lambda x: attention_entropy(x.traj),
        needs_groups=False,
        plots=(
            Plot(
                "attention_entropy",
                "Fig. 10: entropy of each head's attention row, averaged over the evaluation"
                " positions; dotted: snap_step",
                "paint_over_steps",
                "attention_entropy",
                "attention entropy (nats)",
                snaps=True,
            ),
        ),
        explains="<b>attention_entropy</b>: Fig. 10, the entropy of each head's attention row"
        " averaged over the evaluation positions (the query's own position counts when the"
        " recording includes it).",
        shown="heads: attention_entropy; grid: attention_entropy; atlas: attention_entropy",
    ),
    Measure(
        "growth_factor",
        lambda x: growth_factor(x.traj, x.groups),
        summary=(),
        explains="<b>growth_factor</b> (CSV only): Theorem 3's growth factor chi of each"
        " class's most frequent distinct token, and the deviation from its ratio law.",
    ),
    Measure(
        "growth_bounds",
        lambda x: growth_bounds(x.traj, x.groups, x.source, settings=x.settings),
        summary=("bound_ratio", "inside"),
        plots=(
            Plot(
                "growth_bounds",
                "Theorem 3: measured growth factor of each class's dominant distinct token"
                " (solid) and its bounds from Theorem 4 with rho0 from the data (band, dotted:"
                " upper)",
                "paint_growth_bounds",
            ),
        ),
        explains="<b>bound_ratio</b>: the measured logit change of each class's most frequent"
        " distinct token, ln(chi)/2, over Theorem 4's B(t) (rho0 estimated from the data);"
        " Theorem 3 puts it between f0<sup>2</sup> and 1, <b>inside</b> is the share of"
        " classes that are (without the training corpus's statistics, those of the evaluation"
        " text).",
        shown="key: bound_ratio",
    ),
    Measure(
        "theory_fit",
        lambda x: theory_fit(x.traj, x.source, x.groups, settings=x.settings),
        needs_groups=False,
        needs_source=True,
        summary=("population_snap", "snap_ratio", "rank_agreement", "dz_corr", "fit_classes"),
        plots=(
            Plot(
                "theory_fit",
                "Each head against the population dynamics on the training corpus's"
                " statistics: rank agreement of the attention over distinct tokens, correlation"
                " of logit changes",
                "paint_theory_fit",
            ),
        ),
        explains="<b>population_snap</b>: the snap step of the paper's population dynamics"
        " integrated on the training corpus's statistics at the training's own optimizer and"
        " rates (attention predicted from the statistics alone); <b>snap_ratio</b>: measured"
        " over predicted.  <b>rank_agreement</b>: Spearman correlation of predicted and"
        " measured attention over each class's distinct tokens; <b>dz_corr</b>: correlation of"
        " predicted and measured logit changes over the tracked pairs.  1 means the head does"
        " what the theory says.",
        shown="key: population_snap rank_agreement; heads: dz_corr rank_agreement; grid:"
        " dz_corr; atlas: rank_agreement dz_corr",
    ),
    Measure(
        "uncertainty",
        lambda x: scan_uncertainty(x.traj, x.groups),
        summary=UNCERTAINTY_COLUMNS,
        explains="<b>Uncertainty</b> (at the last checkpoint): <b>_lo</b>, <b>_hi</b> are 95 %"
        " intervals (Student t over <b>_n_eff</b> - 1 degrees of freedom); bias, AUROC and the"
        " matched AUROC resample queries and context tokens as crossed units (a frequent word"
        " is a common token of almost every query), spearman, entropy and snap_step the"
        " classes; none below 5 effective units (<i>too few units</i>).  <b>_p</b>: two-sided"
        " p-values (spearman: against P(l|m, n) shuffled within each class).  <b>_baseline</b>:"
        " bias and AUROC of the logit levels at the first checkpoint (the untrained head)."
        "  <b>held_auroc</b>: the AUROC with frequency held, over every pair of a distinct and"
        " a common token of a query, its ordering regressed on how far the two tokens' pair"
        " count C(m, l) and word count in the corpus the kinds came from lie apart, read"
        " where they are the same; <b>_lost</b>: the raw AUROC less it;"
        " <b>matched_auroc</b>, <b>word_matched_auroc</b>: the same control without a model,"
        " each distinct token against the common tokens of its query about as frequent as a"
        " pair or as a word (fewer pairs: shown, not used by the verdict);"
        " <b>frequency_auroc</b>: how well the pair counts alone separate the kinds."
        "  <b>verdict</b>: <i>scans</i> where bias &gt; 0 and AUROC &gt; 0.5 are significant"
        " after Holm's correction over the heads and so is the held AUROC, or, failing it,"
        " where the distinct tokens are the rarer, the frequency bias among"
        " distinct tokens (the more frequent gain more, <b>frequency_bias_p</b>: one-sided,"
        " these classes' tokens as units), which a rarity preference reverses"
        " (<b>frequency_control</b> says which); else why not: <i>no scan (could have seen"
        " AUROC &gt;= auroc_mde</i>, the AUROC at which the whole verdict says scans with 80 %"
        " power, its spread taken at that AUROC; <b>rows_for_target</b>: how many times the"
        " evaluation rows would bring it to 0.75<i>)</i>, <i>too few units</i>, <i>not beyond"
        " frequency</i> (the gain falls significantly when frequency is held, or the held"
        " AUROC's interval ends below the AUROC), or <i>cannot tell from frequency</i> (the"
        " held AUROC's interval holds both: <b>held_units_needed</b> says how many effective"
        " units would tell them apart).  The intervals cover other queries and tokens of this"
        " text for this trained model, not another training run.",
        shown="key: scans auroc_mde rows_for_target; heads: scans auroc_mde rows_for_target;"
        " atlas: scans verdict rows_for_target; runs: scans verdict auroc_mde rows_for_target",
    ),
)


def _head_type(name: str, title: str, caption: str, explains: str) -> Measure:
    """The entry of one head type (`head_types.head_type` of a rows aggregate): its score
    with the interval over rows, and its formation step, beside the snap step."""
    columns = ("", "_lo", "_hi", "_rise_p", "_step", "_step_lo", "_step_hi", "_reason")
    plot = Plot(
        name,
        caption + "; dotted: snap_step",
        "paint_over_steps",
        name,
        title,
        snaps=True,
        limits=(0.0, 1.0),
    )  # a share of attention
    step = f"{name}_step"
    return Measure(
        name,
        lambda x: head_type(x.traj, name),
        needs_groups=False,
        summary=tuple(name + c for c in columns),
        plots=(plot,),
        shown=f"key: {step}; heads: {name} {step}; grid: {name}; runs: {name} {step} {step}_lo"
        f" {step}_hi; atlas:"
        f" {name} {name}_lo {name}_hi {step} {step}_lo {step}_hi; formed: {step}",
        explains=explains
        + f"  <b>{name}_step</b>: when it formed, the step by which the score has covered half"
        " its rise from the first checkpoint to the last (interval: rows resampled), shown"
        " only where that rise is significant (Holm over the heads) and moved at least"
        f' {MIN_RISE:g} of the attention, else <b>{name}_reason</b> says why ("no rise",'
        f' "rise 0.004 below {MIN_RISE:g}"); compare it with <b>snap_step</b>.',
    )


MEASURES += (
    _head_type(
        "previous_token",
        "previous-token score",
        "Previous-token heads: attention on the previous position, A[q, q-1], a line per head",
        "<b>previous_token</b>: the attention weight of a position on the one before it,"
        " averaged over positions and then over evaluation rows (the rows are the units of"
        " its 95&nbsp;% interval <b>_lo</b>, <b>_hi</b>); near 1 is a previous-token head.",
    ),
    _head_type(
        "first_token",
        "first-token (sink) score",
        "Attention sinks: attention on position 0, a line per head",
        "<b>first_token</b>: the attention weight on position 0 (the sink a head parks its"
        " attention on when it has nothing to do), averaged as previous_token.",
    ),
    _head_type(
        "induction",
        "induction score",
        "Induction heads: attention on the token after an earlier occurrence of the current"
        " one, a line per head",
        "<b>induction</b>: the attention weight of a position on the position after the most"
        " recent earlier occurrence of its own token (the induction head's target, as in"
        " Olsson et al. 2022), averaged as previous_token; on repeated random tokens where the"
        " evaluation text has too few repeats (the trajectory says which rows it read).",
    ),
)


def measures_of(traj: Trajectory) -> tuple[Measure, ...]:
    """`MEASURES` and a head type for every other rows aggregate `traj` records (a notebook's
    own `aggregates.Aggregate`: its doc is its caption), which every page, table and
    comparison then shows like the built-in ones."""
    known = {m.name for m in MEASURES}
    own = tuple(
        _head_type(
            name,
            f"{name} score",
            f"{agg.doc or name}, a line per head",
            f"<b>{name}</b>: {html.escape(agg.doc or 'a head type of your own')}.",
        )
        for name, agg in traj.aggregates.items()
        if agg.axis == "rows" and name not in known
    )
    return MEASURES + own


def columns(role: str, entries: Sequence[Measure] = MEASURES) -> list[str]:
    """The columns `entries` show in `role` (see `ROLES`), each once, in the table's order;
    the head tables ("key", "heads", "atlas") open with `FIRST`.

    >>> columns("grid")
    ['snap_step', 'bias', 'auroc', 'attention_entropy', 'dz_corr', 'previous_token', \
'first_token', 'induction']
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    out = list(FIRST) if role in ("key", "heads", "atlas") else []
    for entry in entries:
        out += [c for c in entry.shown.get(role, ()) if c not in out]
    return out


def measure_named(name: str) -> Measure:
    """The entry of `MEASURES` called `name`."""
    for entry in MEASURES:
        if entry.name == name:
            return entry
    raise KeyError(f"no measurement {name!r}: {[m.name for m in MEASURES]}")
