"""The report and the circuitsvis views: contents against the trajectory, and the demo's report
opened in headless Chromium (views mounted, no console errors, a screenshot)."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _browser import open_page, screenshot

from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.report import write_report
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.viz import View, attention_over_checkpoints, kinds_view, query_attention
from scansnap_lens.viz.views import default_position, page


def _mounted(dom: str, div_id: str) -> str:
    """The inner HTML that React rendered into the view's div ('' if nothing)."""
    match = re.search(
        rf'<div id="{div_id}" class="circuitsvis-view">(.*?)</div>\s*<script', dom, re.S
    )
    assert match, f"{div_id} is not in the page"
    return match.group(1)


@pytest.mark.tl
def test_demo_report_opens_in_chromium(demo_out, tmp_path):
    out, _ = demo_out
    report = out / "report" / "report.html"
    source = report.read_text()
    assert source.count("var CircuitsVis=") == 1  # the script once for the whole page
    assert not re.search(r"<script[^>]+src=", source)  # nothing loaded from elsewhere
    assert not re.search(r"<img[^>]+src=['\"]http", source)
    dom, console = open_page(report)
    assert console == [], console
    assert "Head Selector" in _mounted(dom, "view-0")  # attention_heads
    assert "colored-tokens" in _mounted(dom, "view-1")  # colored_tokens
    assert "attention @ 250" in _mounted(dom, "view-2")  # colored_tokens_multi
    png = screenshot(report, tmp_path / "report.png")
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] > 1000 and pixels.std() > 0.05  # a page, not a blank
    if os.environ.get("SCANSNAP_ARTIFACTS"):
        shutil.copy(png, os.environ["SCANSNAP_ARTIFACTS"])


def test_the_browser_check_catches_a_broken_view(tmp_path):
    """The same checks on a page whose view cannot render: they fail."""
    broken = View("NoSuchElement", {"tokens": ["a"]})
    path = tmp_path / "broken.html"
    path.write_text(page("broken", broken.fragment("view-0")))
    dom, console = open_page(path, budget_ms=3000)
    assert console and _mounted(dom, "view-0") == ""


@pytest.mark.tl
def test_report_contents_match_the_measurements(demo_out):
    out, _ = demo_out
    folder = out / "report"
    saved = json.loads((folder / "summary.json").read_text())
    summary = pd.read_csv(folder / "summary.csv")
    assert saved["summary"][0]["bias"] == pytest.approx(summary["bias"].iloc[0])
    bias = pd.read_csv(folder / "discriminative_bias.csv")
    final = bias[bias["step"] == bias["step"].max()]
    assert final["bias"].iloc[0] == pytest.approx(summary["bias"].iloc[0])
    assert np.allclose(final["dz_distinct"] - final["dz_common"], final["bias"])
    figures = ["logit_change", "frequency_bias", "entropy", "class_attention", "theory",
               "growth_bounds", "theory_fit", "predicted_attention"]  # fmt: skip
    for name in figures:
        assert (folder / "figures" / f"{name}.png").stat().st_size > 5000, name
    assert saved["not_measured"] == {}
    assert saved["steps"] == Trajectory.load(out / "trajectory").steps.tolist()
    # the theory's checks: the summary holds their last checkpoint, the page says them
    fit = pd.read_csv(folder / "theory_fit.csv")
    last = fit[fit["step"] == fit["step"].max()]
    for column in ("rank_agreement", "dz_corr", "population_snap", "snap_ratio"):
        assert summary[column].iloc[0] == pytest.approx(last[column].iloc[0]), column
    assert summary["snap_ratio"].iloc[0] == pytest.approx(
        summary["snap_step"].iloc[0] / summary["population_snap"].iloc[0]
    )
    bounds = pd.read_csv(folder / "growth_bounds_detail.csv")
    assert summary["bound_ratio"].iloc[0] == pytest.approx(bounds["bound_ratio"].median())
    page_text = (folder / "report.html").read_text()
    assert "Theory against measurement" in page_text
    assert f"rho0 = {bounds['rho0'].iloc[0]:.4g} from the data" in page_text


@pytest.mark.tl
def test_views_hold_the_recorded_attention(demo_out, tmp_path):
    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    steps = traj.steps.tolist()
    view = attention_over_checkpoints(traj, steps=[steps[0], steps[-1]])
    attention = view.props["attention"]
    assert attention.shape == (2, traj.prompt.numel(), traj.prompt.numel())
    assert torch.equal(attention[0], traj.prompt_pattern[-1, 0, 0])  # the last opens the view
    assert torch.equal(attention[1], traj.prompt_pattern[0, 0, 0])
    assert view.props["attentionHeadNames"] == [f"step {steps[-1]}", f"step {steps[0]}"]
    saved = view.save(tmp_path / "view.html")
    assert saved.read_text().count("var CircuitsVis=") == 1

    # token classes of the prompt, by hand: the query is position 31, its label position 32
    prompt = traj.prompt
    groups = TokenGroups(
        query=prompt[31:32],
        next_token=prompt[32:33],
        events=torch.tensor([1]),
        distinct=[prompt[:2].unique()],
        distinct_p=[torch.full((prompt[:2].unique().numel(),), 0.5, dtype=torch.float64)],
        common={int(prompt[31]): prompt[2:3]},
    )
    assert default_position(traj, groups) == 31
    codes = kinds_view(traj, groups).props["values"]
    expected = torch.zeros(32)
    expected[torch.isin(prompt[:32], prompt[2:3])] = -1
    expected[torch.isin(prompt[:32], prompt[:2])] = 1
    expected[31] = 0
    assert torch.equal(codes, expected)
    multi = query_attention(traj, groups, steps=[steps[-1]]).props["values"]
    assert torch.equal(multi[:, 0], expected)
    torch.testing.assert_close(multi[:, 1], traj.prompt_pattern[-1, 0, 0, 31, :32])
    with pytest.raises(ValueError, match="token_strings has 3 entries"):
        kinds_view(traj, groups, token_strings=["a", "b", "c"])
    with pytest.raises(KeyError, match=r"steps \[7\]"):
        attention_over_checkpoints(traj, steps=[7])


@pytest.mark.tl
def test_report_without_prompt_says_what_is_missing(demo_out, tmp_path):
    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    traj.prompt, traj.prompt_pattern = None, None
    groups = TokenGroups.from_synthetic(syn_medium(1))
    report = write_report(Analysis.of(traj, groups), tmp_path / "r", views=True)
    assert "views" in report.not_measured
    assert "circuitsvis-view" not in report.path.read_text()
    with pytest.raises(ValueError, match="no example prompt"):
        attention_over_checkpoints(traj)
    # a checkpoint the recording could not read (on_error="skip") is a step not measured
    error = "run/checkpoint-50/model.safetensors is truncated or corrupt"
    traj.skipped = [{"step": 50, "source": "run/checkpoint-50", "error": error}]
    report = write_report(Analysis.of(traj, groups), tmp_path / "s", views=False)
    assert report.not_measured["step 50"] == f"not recorded: {error}"
    assert html.escape(f"step 50: not recorded: {error}") in report.path.read_text()


# Token strings a hostile or careless tokenizer can hold.  circuitsvis turns spaces into
# &nbsp; before it inserts a token as HTML, so attributes are separated by "/" here.
PAYLOADS = [
    "<img/src='x'/onerror=\"document.body.setAttribute('data-pwned','img')\">",
    "<!--<script>",
    "</script><script>document.body.setAttribute('data-pwned','script')</script>",
    "\"/onmouseover=\"document.body.setAttribute('data-pwned','attr')\"/x=\"",
    "<svg/onload=\"document.body.setAttribute('data-pwned','svg')\">",
]


def _ran(dom: str) -> bool:
    return bool(re.search(r"<body[^>]*data-pwned", dom))


@pytest.mark.tl
def test_script_in_token_strings_never_runs(demo_out, tmp_path):
    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    ids = traj.prompt.unique().tolist()
    for i, token in enumerate(ids):
        traj.plan.token_strings[token] = PAYLOADS[i % len(PAYLOADS)]
    groups = TokenGroups.from_synthetic(syn_medium(1))
    title = "<script>alert(1)</script>"
    report = write_report(Analysis.of(traj, groups), tmp_path / "r", title=title)
    dom, console = open_page(report.path)
    assert not _ran(dom) and console == [], console
    assert "Head Selector" in _mounted(dom, "view-0")  # every view still renders
    assert "colored-tokens" in _mounted(dom, "view-1")
    assert "&lt;\u2060img" in dom  # a token shown as text (the props hold it as \u003c)
    assert "attention @" in _mounted(dom, "view-2")
    assert "<script>alert(1)</script>" not in report.path.read_text()

    # the check itself can fail: the same payload handed to circuitsvis unescaped runs
    raw = View("ColoredTokens", {"tokens": [PAYLOADS[0], "a"], "values": [1.0, 0.0]})
    path = tmp_path / "raw.html"
    path.write_text(page("raw", raw.fragment("view-0")))
    assert _ran(open_page(path)[0])


def _text_of(dom: str, div_id: str) -> str:
    """The text a reader sees in a mounted view (tags dropped, entities read once)."""
    import html

    inner = _mounted(dom, div_id)
    return html.unescape(re.sub(r"<[^>]+>", " ", inner)).replace("\u2060", "").replace("\xa0", " ")


def test_token_strings_show_as_themselves(tmp_path):
    """GPT-2 and Pythia tokens such as 's and n't show their characters in every view, both
    where circuitsvis inserts a token as HTML and where it shows it as text."""
    from scansnap_lens.viz.views import safe_token

    tokens = ["'s", "n't", 'say "hi"', "A&B", "<b>x", "&amp;"]
    views = [
        View("ColoredTokens", {"tokens": [safe_token(t) for t in tokens], "values": [1.0] * 6}),
        View(
            "ColoredTokensMulti",
            {
                "tokens": [safe_token(t) for t in tokens],
                "values": torch.ones(6, 1),
                "labels": ["a"],
            },
        ),
    ]
    path = tmp_path / "tokens.html"
    path.write_text(page("tokens", "\n".join(v.fragment(f"view-{i}") for i, v in enumerate(views))))
    dom, console = open_page(path)
    assert console == [], console
    for i in range(len(views)):
        text = _text_of(dom, f"view-{i}")
        for token in tokens:
            assert token in text, (token, text)
        for escaped in ("&#x27;", "&quot;", "&lt;"):
            assert escaped not in text.replace("&amp;", ""), text


@pytest.mark.tl
def test_report_from_a_relative_path_shows_in_a_notebook(demo_out, tmp_path, monkeypatch):
    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    monkeypatch.chdir(tmp_path)
    report = write_report(
        Analysis.of(traj, TokenGroups.from_synthetic(syn_medium(1))), "rel", views=False
    )
    assert (tmp_path / "rel" / "report.html").resolve().as_uri() in report._repr_html_()


@pytest.mark.tl
def test_a_full_disk_never_leaves_half_a_report(demo_out, tmp_path, monkeypatch):
    """Every file of the report goes through the atomic writer: when the disk fills up during a
    re-write, the earlier report.html, figures and CSVs stay whole and no temporary is left."""
    import errno

    from scansnap_lens import _io

    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    groups = TokenGroups.from_synthetic(syn_medium(1))
    folder = tmp_path / "r"
    write_report(Analysis.of(traj, groups), folder, views=False)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    written = []

    def full_disk(fd, data):
        temporary = Path(os.readlink(f"/proc/self/fd/{fd}"))  # .NAME.random.tmp
        written.append(temporary.with_name(temporary.name[1:].rsplit(".", 2)[0]))
        if len(written) == 3:  # the third file: half of it fits
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        os.write(fd, data)

    monkeypatch.setattr(_io, "_write_all", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_report(Analysis.of(traj, groups), folder, title="again", views=False)
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert not [p for p in after if p.name.endswith(".tmp")]
    assert set(after) == set(before)
    for path, data in after.items():  # each file is the old one or a whole new one
        assert data == before[path] or path in written[:2]
    assert after[folder / "report.html"] == before[folder / "report.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no staging folder left


@pytest.mark.tl
def test_an_interrupted_report_leaves_the_folder_as_it_was(demo_out, tmp_path, monkeypatch):
    """Ctrl-C while the figures are drawn: the folder holds what it held (a user's own file
    and the earlier report), nothing half-made, no staging folder; the next report replaces
    the report's files and keeps the user's."""
    from scansnap_lens.viz import figures

    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    groups = TokenGroups.from_synthetic(syn_medium(1))
    folder = tmp_path / "r"
    write_report(Analysis.of(traj, groups), folder, views=False)
    (folder / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(figures, "paint_over_steps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(Analysis.of(traj, groups), folder, title="again", views=False)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    monkeypatch.undo()
    report = write_report(Analysis.of(traj, groups), folder, title="again", views=False)
    assert report.path == folder / "report.html" and "again" in report.path.read_text()
    assert (folder / "notes.txt").read_text() == "mine"
    assert all(p.is_file() and p.is_relative_to(folder) for p in report.files.values())


@pytest.mark.tl
def test_the_report_draws_the_figures_viz_lists_and_a_plot_names_a_painter(demo_out, tmp_path):
    """`viz.figures.run_figures` is the one list of a run's figures: the report draws each of
    them, in its order, and no other; a catalog plot naming no painter is refused by name."""
    from scansnap_lens.measures.catalog import Plot
    from scansnap_lens.viz.figures import paint, run_figures

    out, _ = demo_out
    groups = TokenGroups.from_synthetic(syn_medium(1))
    analysis = Analysis.of(Trajectory.load(out / "trajectory"), groups)
    listed = [name for name, _, _ in run_figures(analysis, 0, 0)]
    assert {"loss", "class_attention", "attention_maps", "logit_change"} <= set(listed)
    report = write_report(analysis, tmp_path / "r", views=False)
    drawn = [k.removeprefix("figure_") for k in report.files if k.startswith("figure_")]
    failed = [k.removeprefix("figure ") for k in report.not_measured if k.startswith("figure ")]
    assert drawn == [n for n in listed if n not in failed] and set(failed) <= set(listed)
    assert not failed and len(drawn) >= 8  # the demo draws every figure it lists
    for name in ("paint_nothing", "plot_loss"):  # no function, and a function no painter
        with pytest.raises(ValueError, match=f"no painter '{name}' in viz.figures"):
            paint(None, Plot("x", "a caption", name), None, tmp_path / "x.png")


@pytest.mark.tl
def test_following_an_analysis_into_the_report_takes_at_most_30_stops(demo_out, tmp_path):
    """The report lays out a page and viz draws: the distinct package functions that code in
    report.py enters while it writes the demo's report (a function, a method or a property
    read, each once) stay at most 30, at most 10 of them report.py's own."""
    import sys

    import scansnap_lens

    package = str(Path(scansnap_lens.__file__).parent)
    here = str(Path(package) / "report.py")
    out, _ = demo_out
    groups = TokenGroups.from_synthetic(syn_medium(1))
    analysis = Analysis.of(Trajectory.load(out / "trajectory"), groups)
    stops = set()

    def entered(frame, event, arg):
        code, caller = frame.f_code, frame.f_back
        if event == "call" and caller is not None and caller.f_code.co_filename == here:
            if code.co_filename.startswith(package) and not code.co_name.startswith("<"):
                stops.add((Path(code.co_filename).name, code.co_qualname))

    sys.setprofile(entered)
    try:
        write_report(analysis, tmp_path / "r")
    finally:
        sys.setprofile(None)
    own = {s for s in stops if s[0] == "report.py"}
    assert len(stops) <= 30 and len(own) <= 10, sorted(stops)


@pytest.mark.tl
def test_the_report_measures_each_quantity_once(demo_out, tmp_path, monkeypatch):
    """`write_report` and its summary share one `measures.measure_all`: every measurement of
    the table runs once (without `source`, `theory_fit` is left out with the reason)."""
    from scansnap_lens.measures import catalog

    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    groups = TokenGroups.from_synthetic(syn_medium(1))
    calls: dict[str, int] = {}

    def counted(entry):
        def wrapper(inputs):
            calls[entry.name] = calls.get(entry.name, 0) + 1
            return entry.measure(inputs)

        return dataclasses.replace(entry, measure=wrapper)

    # every reader of the table goes through catalog.measures_of, which reads it here
    monkeypatch.setattr(catalog, "MEASURES", tuple(counted(m) for m in catalog.MEASURES))
    report = write_report(Analysis.of(traj, groups), tmp_path / "r", views=False)
    assert calls == {m.name: 1 for m in catalog.MEASURES if m.name != "theory_fit"}, calls
    assert report.not_measured["theory_fit"] == catalog.NEEDS_SOURCE
    summary = pd.read_csv(tmp_path / "r" / "summary.csv")
    table = pd.read_csv(tmp_path / "r" / "discriminative_bias.csv")
    last = table[table["step"] == table["step"].max()].reset_index(drop=True)
    assert np.allclose(summary["bias"], last["bias"]) and report.summary is not None


def test_the_query_view_picks_a_query_that_shows_the_scan():
    """Of the prompt's queries, the one whose context holds distinct and common tokens of its
    class (the last such query has only common ones: nothing to see)."""
    from types import SimpleNamespace

    prompt = torch.tensor([1, 3, 9, 7, 3, 9, 8, 0])  # query 9 at 2 (next 7) and 5 (next 8)
    groups = TokenGroups(
        query=torch.tensor([9, 9]), next_token=torch.tensor([7, 8]), events=torch.tensor([1, 1]),
        distinct=[torch.tensor([1]), torch.tensor([5])],
        distinct_p=[torch.ones(1, dtype=torch.float64)] * 2, common={9: torch.tensor([3])},
    )  # fmt: skip
    traj = SimpleNamespace(prompt=prompt, prompt_pattern=torch.zeros(1, 1, 1, 8, 8))
    assert default_position(traj, groups) == 2


def test_a_report_to_step_ten_to_the_twelve_does_not_hang(tmp_path):
    """tests/data/trajectory_v1 has a checkpoint at step 10^12: its report, with the theory's
    population dynamics, is written (it ran for ever, one optimizer step at a time)."""
    import importlib.util
    from pathlib import Path

    data = Path(__file__).parent / "data"
    spec = importlib.util.spec_from_file_location("make_v1", data / "make_trajectory_v1.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    from scansnap_lens.statistics.corpus import cooccurrence

    traj = Trajectory.load(data / "trajectory_v1")
    stats = cooccurrence(make.tokens(), traj.plan.vocab_size, window=4)
    report = write_report(Analysis.of(traj, source=stats), tmp_path / "r", views=False)
    assert "theory_fit" not in report.not_measured
    assert report.summary["rank_agreement"].notna().all()


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    """Two seeds of a user's Hugging Face Trainer run (GPT-NeoX, 2 layers x 2 heads, 12 steps,
    a checkpoint every 4, the loss logged every step), recorded and reported through the
    command line, and their runs report: {name: page}."""
    import transformers

    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.statistics.corpus import cooccurrence

    root = tmp_path_factory.mktemp("trainer")
    V = 50
    rows = torch.randint(1, V, (64, 16), generator=torch.Generator().manual_seed(0))
    rows[:, 1::2] = (rows[:, 0::2] * 7) % V  # a next token the context tells
    save_tokens(root / "eval.safetensors", rows[:32])
    cooccurrence(rows, V).save(root / "stats.safetensors")

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return {"input_ids": rows[i], "labels": rows[i]}

    trajs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = transformers.GPTNeoXConfig(
            vocab_size=V, max_position_embeddings=16, hidden_size=16, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=32, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        args = transformers.TrainingArguments(
            str(root / f"run_s{seed}"), max_steps=12, save_steps=4, logging_steps=1,
            per_device_train_batch_size=8, learning_rate=1e-2, report_to=[], use_cpu=True,
            disable_tqdm=True, seed=seed, data_seed=seed,
        )  # fmt: skip
        model = transformers.AutoModelForCausalLM.from_config(config)
        transformers.Trainer(model=model, args=args, train_dataset=Rows()).train()
        traj = root / f"traj_s{seed}"
        assert main(["record", "--checkpoints", str(root / f"run_s{seed}"), "--tokens",
                     str(root / "eval.safetensors"), "--stats", str(root / "stats.safetensors"),
                     "--out", str(traj)]) == 0  # fmt: skip
        trajs.append(str(traj))
    stats = str(root / "stats.safetensors")
    assert main(["report", trajs[0], "--stats", stats, "--out", str(root / "report")]) == 0
    assert main(["report", *trajs, "--stats", stats, "--out", str(root / "runs")]) == 0
    return {"trainer": root / "report" / "report.html", "runs": root / "runs" / "runs.html"}


@pytest.mark.tl
def test_each_page_opens_with_its_findings_and_fits_1300_pixels(demo_out, trainer_runs):
    """Read at 1,300 x 900 as a reader's browser shows them (the demo, a Trainer run and its
    two seeds): the first screen holds the findings and the heads map, nothing is wider than
    the page (wide tables scroll inside their own box), and the loss figure is there."""
    from _browser import layout

    pages = {"demo": demo_out[0] / "report" / "report.html", **trainer_runs}
    for name, path in pages.items():
        seen = layout(path, (1300, 900))
        assert seen["wide"] == [] and seen["page_width"] <= 1300, (name, seen["wide"][:5])
        assert seen["findings"] is not None and seen["findings_items"] >= 3, name
        assert seen["findings"]["top"] < seen["height"], name
        assert seen["map"] is not None and seen["map"]["bottom"] <= seen["height"], (name, seen)
        # beside the findings the [layer, head] map, and the loss with its snaps marked under
        # it: all on the first screen (the demo's one head has no map: its loss alone)
        beside, under = seen["beside"], seen["under_caption"]
        if name == "demo":
            assert "Loss over training" in beside and "snap step" in beside, beside
        else:
            assert "Head atlas" in beside or "[layer, head]" in beside, (name, beside)
            assert "loss" in under and "snap step" in under, (name, under)
            assert seen["under"]["bottom"] <= seen["height"], (name, seen["under"])
    assert "Only 2 runs" in trainer_runs["runs"].read_text()


def _findings_said(page: Path) -> list[str]:
    """The findings of a page, as a reader sees them."""
    import html as html_text

    block = re.search(r"<div class='findings'>.*?<ul>(.*?)</ul>", page.read_text(), re.S)
    return [html_text.unescape(re.sub("<[^>]+>", "", item))
            for item in re.findall(r"<li>(.*?)</li>", block.group(1), re.S)]  # fmt: skip


@pytest.mark.tl
def test_findings_are_short_lead_with_what_the_run_tells_and_never_repeat(demo_out, trainer_runs):
    """On the demo's, a Trainer run's and its two seeds' pages each finding is a few words
    (about 35 at most) and no sentence is said twice: a caveat of several layers is said once
    for the page, with a link to its explanation; the tables' verdict cells hold the
    verdict, the AUROC it could have seen in a column of its own."""
    pages = {"demo": demo_out[0] / "report" / "report.html", **trainer_runs}
    for name, path in pages.items():
        said = _findings_said(path)
        assert len(said) >= 3, (name, said)
        long = [line for line in said if len(line.split()) > 38]
        assert not long, (name, long)
        sentences = [s.strip() for line in said for s in re.split(r"(?<=[.)])\s+(?=[A-Z])", line)]
        assert len(sentences) == len(set(sentences)), (name, said)
        text = path.read_text()
        tables = text.split("<h2>Summary")[-1].split("How to read it</h2>")[0]
        assert "could have seen AUROC" not in tables, name
    run_page = trainer_runs["trainer"].read_text()
    if "moved mostly by step-to-step noise" in run_page:
        assert "href='#how-to-read'>How to read it</a>" in run_page
        assert "id='how-to-read'" in run_page
    demo = pages["demo"].read_text()
    assert "<th>verdict</th>" in demo and "<th>auroc_mde</th>" in demo
    # every run here had finished: none reads as still recording (the demo's did, its own
    # process holding the recorder's lock)
    assert not [n for n, p in pages.items() if "Still recording" in p.read_text()]


@pytest.mark.tl
def test_the_loss_figure_marks_the_snap_and_formation_steps(trainer_runs):
    """The loss of a Trainer run: the recorded evaluation loss at each checkpoint and the
    Trainer's logged loss (log_history), with each layer's snap step as a line."""
    from scansnap_lens.measures.catalog import columns, measures_of
    from scansnap_lens.viz.figures import plot_run_loss

    traj = Trajectory.load(trainer_runs["trainer"].parent.parent / "traj_s0")
    summary = pd.read_csv(trainer_runs["trainer"].parent / "summary.csv")
    assert traj.steps.tolist() == [4, 8, 12] and torch.isfinite(traj.loss).all()
    figure = plot_run_loss(traj, summary, columns("formed", measures_of(traj)))
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    logged = lines["training loss (log)"].get_xdata()
    assert sorted(logged) == list(range(1, 13))  # the Trainer logged every step
    evaluated = next(line for label, line in lines.items() if label.startswith("evaluation"))
    assert list(evaluated.get_xdata()) == [4, 8, 12]
    labels = list(lines)
    snapped = sorted(summary.dropna(subset=["snap_step"])["layer"].unique())
    assert [f"layer {layer} snap" for layer in snapped] == [x for x in labels if "snap" in x]
    # each layer's snap shaded where the checkpoints place it: the median of its heads' own
    # bounds (their interval, or the checkpoints around it where resampling had too few units)
    spans = [
        p.get_path().transformed(p.get_patch_transform()).vertices[:, 0]
        for p in figure.axes[0].patches
    ]  # x in data (a Polygon or Rectangle)
    assert len(spans) == len(snapped)
    for layer, xy in zip(snapped, spans):
        heads = summary[summary["layer"] == layer].dropna(subset=["snap_step"])
        ends = heads.reindex(columns=["snap_step_lo", "snap_step_grid_lo", "snap_step_hi",
                                      "snap_step_grid_hi"])  # fmt: skip
        own_lo = ends.iloc[:, :2].min(axis=1)
        own_hi = ends.iloc[:, 2:].max(axis=1)
        lo, hi = xy.min(), xy.max()
        assert (lo, hi) == (own_lo.median(), own_hi.median())
        assert 4 <= lo <= heads["snap_step"].median() <= hi <= 12  # within the checkpoints


@pytest.mark.tl
def test_a_terminated_or_killed_report_leaves_no_stage_and_a_blocked_move_in_nothing(
    trainer_runs, tmp_path
):
    """SIGTERM (timeout, a scheduler) mid-report, Ctrl-C ignored as in a background job: exit
    130, the report's own message, no staging folder, the folder as it was; SIGKILL leaves a
    stage, which the next report removes; a user's folder named like a report file
    (summary.json) stops the move-in before anything moves: exit 2, naming it, the folder as
    it was."""
    import signal
    import subprocess
    import sys

    from scansnap_lens.cli import main

    root = trainer_runs["trainer"].parents[1]
    folder = tmp_path / "r"
    command = ["report", str(root / "traj_s0"), "--stats", str(root / "stats.safetensors"),
               "--out", str(folder)]  # fmt: skip
    assert main(command) == 0
    (folder / "notes.txt").write_text("mine")

    def contents():
        return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def background_job():  # as `scansnap report ... &` in a script: Ctrl-C ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stopped(sig):
        process = subprocess.Popen([sys.executable, "-m", "scansnap_lens.cli", *command],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   preexec_fn=background_job)  # fmt: skip
        while not list(tmp_path.glob(".r.*.partial")):
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            time.sleep(0.02)
        # at once: a page of a saved analysis (figures kept) is written in about a second
        process.send_signal(sig)
        return process.wait(timeout=120), process.stderr.read().decode()

    before = contents()
    code, err = stopped(signal.SIGTERM)
    assert code == 130 and "Traceback" not in err, err
    assert "report: interrupted; the report folder is as it was" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"] and contents() == before
    code, _ = stopped(signal.SIGKILL)
    assert code == -signal.SIGKILL and len(list(tmp_path.glob(".r.*.partial"))) == 1
    (folder / "summary.json").unlink()
    (folder / "summary.json").mkdir()
    before = contents()
    assert main(command) == 2
    assert contents() == before and (folder / "summary.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the killed stage: gone


def test_a_report_says_its_figures_cost_once_the_second_shows_they_may_pass_ten_seconds(
    tmp_path, capsys, monkeypatch
):
    """The second figure drawn times the others (the first pays the warm-up): 4 s with 3 to
    go is said, 3 s is not."""
    from types import SimpleNamespace

    from scansnap_lens import report

    for second, said in ((4.0, "report: 3 more figures to draw, about 12 s"), (3.0, None)):
        clock = iter([0.0, 9.0, 10.0, 10.0 + second] + [20.0] * 6)
        monkeypatch.setattr(report, "time", SimpleNamespace(perf_counter=clock.__next__))
        folder = report._Folder(tmp_path, expected=5)
        (tmp_path / "figures").mkdir(exist_ok=True)
        for name in "abcde":
            folder.figure(name, name, lambda path: path.write_bytes(b"png"))
        lines = [line for line in capsys.readouterr().out.splitlines() if line]
        assert lines == ([said] if said else []) and len(folder.figures) == 5


def test_figures_of_one_axes_keep_their_labels_inside_the_shared_margins():
    """No layout pass of their own: the margins in inches hold a 7-character tick label, the
    axis labels and the title of every one-axes figure the report draws (drawn and measured)."""
    import numpy as np
    import pandas as pd
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from scansnap_lens.viz import figures

    steps = np.array([0, 9, 99, 999])
    table = pd.DataFrame({"step": np.tile(steps, 2), "layer": 0, "head": np.repeat([0, 1], 4),
                          "top_share": [-0.0025, 0.0055, 0.001, 0.002] * 2})  # fmt: skip
    curves = {"evaluation loss": (steps + 1, [8.1, 7.0, 5.5, 4.25])}
    made = [
        figures.plot_over_steps(table, "top_share", title="mass on distinct tokens"),
        figures.plot_loss_with_steps(curves, {"layer 0 snap": (50.0, 20.0, 90.0)}),
        figures.plot_growth_bounds(table.assign(chi=1.5, chi_lower=1.1, chi_upper=2.5e3)),
    ]
    for fig in made:
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        width, height = fig.bbox.width, fig.bbox.height
        for ax in fig.axes:
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            drawn = [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
            drawn += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
            for text in [*drawn, ax.yaxis.label, ax.xaxis.label, ax.title]:
                if not text.get_text():
                    continue
                box = text.get_window_extent(renderer)
                assert box.x0 >= 0 and box.y0 >= 0, (text.get_text(), box)
                assert box.x1 <= width and box.y1 <= height, (text.get_text(), box)
