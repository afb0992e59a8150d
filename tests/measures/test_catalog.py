"""The catalog of measurements declares where each quantity is shown: a head type of your own
is one `Aggregate` to record and nothing more to show."""

from __future__ import annotations

import re

import pytest
import torch
from _tiny import QUIET, V, tiny_model

from scansnap_lens.measures.catalog import MEASURES, ROLES, columns, measures_of
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.reading.heads import atlas
from scansnap_lens.reading.runs import measure_runs
from scansnap_lens.recording.aggregates import DEFAULT, Aggregate
from scansnap_lens.recording.recorder import record_trajectory
from scansnap_lens.report import write_report


def two_back(x):  # every q >= 2 reads A[q, q - 2]
    B, T = x.shape
    q = torch.arange(2, T)
    return torch.arange(B).repeat_interleave(T - 2), q.repeat(B), (q - 2).repeat(B)


DOC = "attention weight on the position two back <script>x</script>"
TWO_BACK = Aggregate("two_back", axis="rows", positions=two_back, doc=DOC)


def _run(tmp_path, name: str, seed: int):
    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(0))
    models = in_memory({0: tiny_model(seed=seed), 10: tiny_model(seed=seed + 10)})
    settings = QUIET.replace(aggregates=[*DEFAULT, TWO_BACK], queries="all")
    return record_trajectory(models, tokens, tmp_path / name, settings)


@pytest.mark.tl
def test_a_head_type_of_your_own_is_shown_wherever_the_built_in_ones_are(tmp_path):
    """Recorded with one more rows aggregate, and nothing else said anywhere: it is measured
    (score, interval, formation step), in the page's first table, the ranked heads table,
    the atlas, the map over heads, a figure over the checkpoints and "How to read it", and
    in the comparison of runs, per run and counted per layer."""
    a, b = _run(tmp_path, "a", 1), _run(tmp_path, "b", 2)
    entries = measures_of(a)
    assert [m.name for m in entries] == [*[m.name for m in MEASURES], "two_back"]
    for role, wanted in (("key", "two_back_step"), ("heads", "two_back"), ("grid", "two_back"),
                         ("atlas", "two_back_lo"), ("runs", "two_back_step"),
                         ("formed", "two_back_step")):  # fmt: skip
        assert wanted in columns(role, entries) and wanted not in columns(role), role
    report = write_report(Analysis.of(a), tmp_path / "report", views=False)
    assert {"two_back", "two_back_lo", "two_back_step"} <= set(report.summary)
    page = (tmp_path / "report" / "report.html").read_text()
    for section, column in (("Summary", "two_back_step"), ("Head atlas", "two_back")):
        table = re.search(rf"<h2>{section}.*?(<table.*?</table>)", page, re.S).group(1)
        assert column in re.findall(r"<th>(.*?)</th>", table), section
    # its doc, text of the user's (or of a manifest someone else wrote), is escaped once
    doc = "attention weight on the position two back &lt;script&gt;x&lt;/script&gt;"
    assert f"<b>two_back</b>: {doc}" in page and "<script>x" not in page
    assert report.files["figure_two_back"].exists() and report.files["figure_heads"].exists()
    assert "two_back" in atlas(report.summary, entries)
    comparison = measure_runs({"a": a, "b": b}, None)
    assert {"two_back", "two_back_step"} <= set(comparison.per_run)
    assert "two_back_heads_mean" in comparison.layers


def test_every_role_names_columns_a_measurement_gives():
    """No column is shown that no measurement's summary has (an interval's columns come from
    `uncertainty`; predicted_snap from the summary itself)."""
    given = {"predicted_snap", "layer", "head"}
    for m in MEASURES:
        given |= set(m.summary or ())
    given |= {
        "bias",
        "auroc",
        "spearman",
        "spearman_classes",
        "entropy",
        "distinct_mass",
        "top_share",
        "attention_entropy",
        "snap_step",
        "snap_step_grid_lo",
        "snap_step_grid_hi",
        "snap_reason",
        "drift_checkpoints",
        "checkpoints",
        "straightness",
        "half_distance_step",
        "half_displacement_step",
    }  # whole tables
    for role in ROLES:
        assert set(columns(role)) <= given, (role, set(columns(role)) - given)
