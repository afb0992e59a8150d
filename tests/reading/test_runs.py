"""Several runs compared (`reading.runs`): a planted difference between runs that the interval
over runs shows and the within-run intervals do not, its coverage by simulation, refusals of
runs that do not share a plan, and the CLI over three trained seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from scansnap_lens.lab.calibration import Scenario, crossed_run
from scansnap_lens.reading.runs import (
    RunComparison,
    check_same_runs,
    compare_runs,
    measure_runs,
    run_design,
)

PLANTED = [0.62, 0.76, 0.9]  # head 0's AUROC in each run: the runs differ
SHARED = 0.8  # head 1's AUROC in every run


@pytest.fixture(scope="module")
def three_runs():
    """Three runs of one recipe on one evaluation text (one plan, the same groups): head 0's
    scan differs between them, head 1 scans alike, heads 2-3 do not scan."""
    runs, groups = {}, None
    for r, planted in enumerate(PLANTED):
        auroc = torch.tensor([[planted, SHARED, 0.5, 0.5]])
        traj, groups, _ = crossed_run(Scenario(queries=150), heads=4, auroc=auroc, seed=0,
                                      values_seed=10 + r)  # fmt: skip
        runs[f"seed{r}"] = traj
    return runs, groups


def test_the_interval_over_runs_shows_a_difference_the_within_run_ones_do_not(three_runs):
    runs, groups = three_runs
    comparison = measure_runs(runs, groups)
    per = comparison.per_run.set_index(["run", "head"])
    table = comparison.table.set_index("head")
    # within each run, head 0's interval holds its own truth and excludes the other runs'
    for r, planted in enumerate(PLANTED):
        lo, hi = per.loc[(f"seed{r}", 0), ["auroc_lo", "auroc_hi"]]
        assert lo < planted < hi
        others = [p for i, p in enumerate(PLANTED) if i != r]
        assert not any(lo < p < hi for p in others)
    # over runs, the interval holds the recipe's mean and is far wider than a run's own
    head0 = table.loc[0]
    assert head0["auroc_lo"] < np.mean(PLANTED) < head0["auroc_hi"]
    assert head0["auroc_hi"] - head0["auroc_lo"] > 4 * 2 * head0["auroc_within"]
    # where the runs agree the two are alike
    head1 = table.loc[1]
    assert head1["auroc_lo"] < SHARED < head1["auroc_hi"]
    assert head1["auroc_hi"] - head1["auroc_lo"] < 4 * 2 * head1["auroc_within"]
    # the share of runs scanning counts each run's own verdict
    for head in range(4):
        scans = [bool(per.loc[(f"seed{r}", head), "scans"]) for r in range(3)]
        assert table.loc[head, "scans_runs"] == sum(scans)
        lo, hi = table.loc[head, ["scans_share_lo", "scans_share_hi"]]
        assert lo <= sum(scans) / 3 <= hi
        assert [table.loc[head, f"verdict_seed{r}"] for r in range(3)] == [
            per.loc[(f"seed{r}", head), "verdict"] for r in range(3)
        ]
    assert table.loc[1, "scans_runs"] == 3 and table.loc[2, "scans_runs"] == 0
    assert not any("not recorded" in w for w in comparison.warnings)
    # per layer, whichever heads they are: each run's count of scanning heads
    layer = comparison.layers.iloc[0]
    for r in range(3):
        assert layer[f"scanning_heads_seed{r}"] == per.loc[f"seed{r}", "scans"].sum()
    counts = [layer[f"scanning_heads_seed{r}"] for r in range(3)]
    assert layer["scanning_heads_mean"] == pytest.approx(np.mean(counts))
    assert layer["scanning_heads_lo"] >= 0  # a count
    assert comparison.tensor("auroc").shape == (3, 1, 4)


def test_runs_that_differ_in_plan_or_heads_are_refused_by_name(three_runs):
    runs, _ = three_runs
    other, _, _ = crossed_run(Scenario(queries=150), heads=4, seed=1)  # another text
    differ = r"runs 'seed0' and 'other' differ in their vocabulary \(804 and 806\)"
    with pytest.raises(ValueError, match=differ):
        check_same_runs({"seed0": runs["seed0"], "other": other})
    fewer = runs["seed1"].replace(heads=[0, 1, 2])
    with pytest.raises(ValueError, match=r"differ in their heads \(\[0, 1, 2, 3\] and \[0, 1, 2\]"):
        check_same_runs({"seed0": runs["seed0"], "seed1": fewer})


def _coverage(runs: int, draw, trials: int, seed: int) -> float:
    """Share of simulated recipes whose interval over `runs` runs holds the recipe's mean:
    each run's estimate = a run effect (drawn by `draw`) + within-run noise."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        effects = draw(rng, runs)
        estimates = effects + rng.normal(0.0, 0.05, runs)
        summaries = {
            f"r{i}": pd.DataFrame({"layer": [0], "head": [0], "bias": [e]})
            for i, e in enumerate(estimates)
        }
        row = compare_runs(summaries).table.iloc[0]
        hits += row["bias_lo"] <= 1.0 <= row["bias_hi"]
    return hits / trials


@pytest.mark.parametrize("runs", [2, 3, 5])
def test_the_interval_over_runs_covers_the_recipe_mean(runs):
    """Normal run effects around the recipe's mean 1.0: coverage 0.95 within the binomial
    spread of 600 trials (a normal interval in place of Student's t covers 0.82 at 3 runs)."""
    coverage = _coverage(runs, lambda rng, n: rng.normal(1.0, 0.3, n), 600, seed=runs)
    assert abs(coverage - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 600)


def test_one_run_is_too_few():
    table = compare_runs({"a": pd.DataFrame({"layer": [0], "head": [0], "bias": [1.0],
                                             "snap_step": [math.nan]})}).table  # fmt: skip
    assert math.isnan(table["bias_lo"].iloc[0])
    assert table["reason"].iloc[0] == "too few runs for bias (1 has one); no run has a snap_step"


def test_saves_and_loads(three_runs, tmp_path):
    runs, groups = three_runs
    comparison = measure_runs(runs, groups)
    loaded = RunComparison.load(comparison.save(tmp_path / "c"))
    assert loaded.runs == comparison.runs
    pd.testing.assert_frame_equal(loaded.table, comparison.table, check_dtype=False)
    assert "3 runs, 4 heads" in repr(loaded)


def _permuted(traj, order):
    """The trajectory a model with each layer's heads permuted by `order` [L, H] records:
    every per-head value moves with its head (head h of the copy is head order[l][h])."""
    index = torch.as_tensor(order)  # [L, H]

    def move(values):
        values = values[:] if not isinstance(values, torch.Tensor) else values  # a StepStack
        shape = index.shape + (1,) * (values.dim() - 3)
        return values.gather(2, index[None].reshape(1, *shape).expand_as(values))

    changes = {name: move(v) for name, v in traj.values.items()}
    return traj.replace(prompt_pattern=move(traj.prompt_pattern), **changes)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real recording of a trained-looking model (peaked attention), with its groups."""
    from _tiny import QUIET, V, tiny_model

    from scansnap_lens.models.checkpoints import in_memory
    from scansnap_lens.recording.recorder import record_trajectory
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import TokenGroups

    tokens = torch.randint(0, V, (16, 24), generator=torch.Generator().manual_seed(0))
    models = in_memory({0: tiny_model(seed=0), 10: tiny_model(seed=1), 40: tiny_model(seed=2)})
    traj = record_trajectory(models, tokens, tmp_path_factory.mktemp("t") / "t", QUIET)
    groups = TokenGroups.from_statistics(cooccurrence(tokens, V), guard=False, purity=0.5)
    return traj, groups


@pytest.mark.tl
def test_heads_of_a_permuted_run_are_matched_by_what_they_do(recorded):
    """Seeds permute a layer's heads: a run whose heads are a known permutation of another's
    is matched back exactly (similarity 1, above chance), and compared head to head its
    figures agree (no spread over runs); compared by index they do not."""
    from scansnap_lens.measures.matching import match_heads

    traj, groups = recorded
    order = [[2, 0, 1], [1, 2, 0]]  # layer 0: the copy's head 0 is head 2, ...
    runs = {"a": traj, "b": _permuted(traj, order)}
    matching, why = match_heads(runs)
    assert why == ""
    b = matching[matching["run"] == "b"]
    for li, layer in enumerate(traj.layers):
        got = b[b["layer"] == layer].set_index("head")["reference_head"]
        assert [int(got[h]) for h in range(3)] == order[li]
        rows = b[b["layer"] == layer]
        assert (rows["similarity"] > 1 - 1e-9).all() and (rows["chance"] < 0.99).all()
    by_behaviour = measure_runs(runs, groups).table
    assert np.allclose(by_behaviour["bias_sd"].dropna(), 0, atol=1e-9)
    assert np.allclose(by_behaviour["previous_token_sd"].dropna(), 0, atol=1e-9)
    by_index = measure_runs(runs, groups, match="index").table
    assert by_index["previous_token_sd"].max() > 0.01
    assert by_behaviour is not None and "heads matched by index" not in " ".join(
        measure_runs(runs, groups).warnings
    )


def test_two_runs_warn_and_intervals_over_runs_stay_possible():
    """With 2 runs the t interval (1 degree of freedom) passes the possible: counts of heads
    below 0 or above the layer's heads, snap steps past the run's end, AUROC outside
    [0, 1]; each is kept within, and the comparison says two runs say little."""
    runs = {}
    for r, (auroc, snap, count) in enumerate([(0.05, 700.0, 0), (0.98, 80.0, 2)]):
        runs[f"s{r}"] = pd.DataFrame({
            "layer": [0, 0], "head": [0, 1], "auroc": [auroc, 0.5], "snap_step": [snap, 100.0],
            "scans": [False, False], "final_step": [800, 800],
            "previous_token": [0.9 * (r == 1), 0.1], "previous_token_step": [
                300.0 if count else math.nan, 10.0 + 700 * r],
        })  # fmt: skip
    comparison = compare_runs(runs)
    table, layers = comparison.table, comparison.layers
    assert comparison.warnings and "2 runs" in comparison.warnings[0]
    assert (table["auroc_lo"] >= 0).all() and (table["auroc_hi"] <= 1).all()
    for column in ("snap_step", "previous_token_step"):
        assert (table[f"{column}_hi"].dropna() <= 800).all()
        assert (table[f"{column}_lo"].dropna() >= 0).all()
    assert (table["previous_token_hi"] <= 1).all() and (table["previous_token_lo"] >= 0).all()
    assert table["snap_step_hi"].max() == 800  # the t interval reached past the run's end
    assert (layers["previous_token_heads_hi"] <= 2).all()
    assert (layers["previous_token_heads_lo"] >= 0).all()
    assert compare_runs({**runs, "s2": runs["s0"]}).warnings == []


def test_a_scanning_head_is_named_in_each_run_by_its_own_number_too():
    """Matched by behaviour, a run's heads take the first run's numbers: the sentence names
    the runs in which the head scans and, where a run numbers it otherwise, its own number
    (the one that run's own report shows)."""
    from scansnap_lens.reading.findings import runs_findings_of

    runs = {}
    for r, own in enumerate([[0, 1], [1, 0]]):  # run s1's heads swapped
        runs[f"s{r}"] = pd.DataFrame({
            "layer": [0, 0], "head": [0, 1], "own_head": own, "auroc": [0.5, 0.9],
            "snap_step": [100.0, 100.0], "scans": [False, True], "final_step": [800, 800],
        })  # fmt: skip
    said = runs_findings_of(compare_runs(runs))
    assert "Layer 0 head 1 scans in 2 of 2 runs (s0; s1, its head 0)." in said, said


def test_the_runs_page_carries_each_runs_noise_and_power():
    """What each run's own page says (its layer's snap moved mostly by noise; no head could
    have been seen) is said where the runs are compared, naming the runs; runs without either
    add nothing."""
    from scansnap_lens.reading.findings import runs_findings_of

    def run(drift, mde):
        return pd.DataFrame({
            "layer": [0, 0], "head": [0, 1], "auroc": [0.5, 0.5], "snap_step": [300.0, 320.0],
            "scans": [False, False], "verdict": ["no scan (could have seen AUROC >= 1)"] * 2,
            "final_step": [1000, 1000], "drift_checkpoints": [drift, drift],
            "checkpoints": [101, 101], "auroc_mde": [mde, mde], "rows_for_target": [4.0, 4.0],
        })  # fmt: skip

    said = " ".join(runs_findings_of(compare_runs({"s0": run(9, 1.0), "s1": run(101, 0.7),
                                                   "s2": run(12, 1.0)})))  # fmt: skip
    assert "In s0 and s2 the attention moved mostly by step-to-step noise" in said, said
    assert "s0 and s2 had no power to see one" in said
    assert "the other runs' heads could have seen AUROC >= 0.7" in said
    assert "scansnap record --power" in said
    quiet = " ".join(runs_findings_of(compare_runs({"s0": run(101, 0.7), "s1": run(100, 0.7),
                                                    "s2": run(101, 0.7)})))  # fmt: skip
    assert "noise" not in quiet and "no power" not in quiet, quiet
    assert "Layer 0 snaps near step 310 [310, 310] over runs" in quiet, quiet
    # runs far apart on a run of 1,000 steps: the interval over them spans more than half of
    # the log-step range, and the page says the runs cannot place it, and what would
    apart = {f"s{i}": run(101, 0.7).assign(snap_step=step)
             for i, step in enumerate([3.0, 30.0, 900.0])}  # fmt: skip
    far = runs_findings_of(compare_runs(apart))
    line = next(x for x in far if x.startswith("Layer 0"))
    assert line.startswith("Layer 0's snap over runs cannot be placed from these 3 runs"), far
    assert line.endswith("more seeds would place it.") and len(line.split()) <= 35, line


PYTHIA = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *range(1000, 143001, 1000)])


def test_step_intervals_over_runs_hold_what_the_checkpoints_allow_by_head_and_by_layer():
    """Pythia's checkpoint schedule: each run's snap lies between two checkpoints that its
    estimate cannot see inside (the estimate sits near their log-middle, its interval is
    their bracket, as `snap.snap_step` gives it).  Over seeds alike to a few per cent, the t
    interval of the estimates is narrow around the bracket's middle and misses the recipe's
    true step; the head's and the layer's interval over runs hold the runs' brackets as well
    and cover it (recipes whose step lies anywhere from 270 to 900, straddling 512)."""
    from scansnap_lens.measures.resampling import interval_over_runs

    rng = np.random.default_rng(0)
    trials, hits, narrow = 300, {"head": 0, "layer": 0}, 0
    for _ in range(trials):
        mu = np.exp(rng.uniform(np.log(270), np.log(900), size=2))  # two heads of one layer
        true = mu * np.exp(rng.normal(0.0, 0.03, size=(4, 2)))  # 4 runs
        summaries = {}
        for r in range(4):
            hi = PYTHIA[np.searchsorted(PYTHIA, true[r])]
            lo = PYTHIA[np.searchsorted(PYTHIA, true[r]) - 1]
            est = np.sqrt(lo * hi) * np.exp(rng.normal(0.0, 0.02, size=2))
            summaries[f"s{r}"] = pd.DataFrame({
                "layer": [0, 0], "head": [0, 1], "snap_step": est, "snap_step_lo": lo,
                "snap_step_hi": hi, "final_step": [143000, 143000],
            })  # fmt: skip
        comparison = compare_runs(summaries)
        head = comparison.table.iloc[0]
        truth = float(np.exp(np.log(true[:, 0]).mean()))
        hits["head"] += head["snap_step_lo"] <= truth <= head["snap_step_hi"]
        _, _, lo, hi = interval_over_runs(comparison.per_run.query("head == 0")[
            "snap_step"].to_numpy(), log=True)  # fmt: skip
        narrow += lo <= truth <= hi
        layer = comparison.layers.iloc[0]
        median = float(np.exp(np.log(np.median(true, axis=1)).mean()))
        hits["layer"] += layer["snap_step_median_lo"] <= median <= layer["snap_step_median_hi"]
    assert narrow / trials < 0.3  # the estimates alone: sure of a step they cannot see
    assert hits["head"] / trials >= 0.95 and hits["layer"] / trials >= 0.95, hits


def test_a_runs_skipped_step_is_said_first(three_runs):
    """A run with a checkpoint it could not read (on_error="skip") has its steps bracketed by
    the checkpoints it has: the comparison says so before anything else."""
    from scansnap_lens.reading.findings import runs_findings_of

    runs, groups = three_runs
    error = "run/checkpoint-50/model.safetensors is truncated or corrupt"
    damaged = runs["seed1"].replace()
    damaged.skipped = [{"step": 50, "source": "run/checkpoint-50", "error": error}]
    comparison = measure_runs({**runs, "seed1": damaged}, groups, match="index")
    said = runs_findings_of(comparison)
    assert f"seed1: step 50 not recorded ({error})" in said[: len(comparison.warnings)], said


def test_a_run_with_too_few_units_still_knows_its_checkpoints():
    """Where resampling had too few units (no snap_step_lo/_hi), a run's step is still known
    only within the checkpoints that bracket it: the interval over runs holds them."""
    nan = [math.nan]
    runs = {f"s{r}": pd.DataFrame({"layer": [0], "head": [0], "snap_step": [360.0 + r],
                                   "snap_step_lo": nan, "snap_step_hi": nan,
                                   "snap_step_grid_lo": [256.0], "snap_step_grid_hi": [512.0],
                                   "final_step": [143000]})
            for r in range(3)}  # fmt: skip
    comparison = compare_runs(runs)
    head, layer = comparison.table.iloc[0], comparison.layers.iloc[0]
    exact = pytest.approx((256.0, 512.0), rel=1e-12)  # a geometric mean: exp(mean(log))
    assert (head["snap_step_lo"], head["snap_step_hi"]) == exact
    assert (layer["snap_step_median_lo"], layer["snap_step_median_hi"]) == exact
    # and where no interval was measured at all (no uncertainty columns)
    bare = {r: s.drop(columns=["snap_step_lo", "snap_step_hi"]) for r, s in runs.items()}
    layer = compare_runs(bare).layers.iloc[0]
    assert (layer["snap_step_median_lo"], layer["snap_step_median_hi"]) == exact


@pytest.mark.tl
def test_runs_trained_from_shared_initial_weights_are_read_as_such(tmp_path):
    """Two initialisations x two data orders trained with `train`: the recordings keep the
    seeds, the comparison reads which runs share what from them, counts the two inits as its
    units and splits the spread; the runs page shows both."""
    from _runs import V, syn_data
    from _tiny import QUIET

    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.report import write_runs_report

    tokens = syn_data(8, torch.Generator().manual_seed(9))
    runs = {}
    for init in (0, 1):
        for data in (0, 1):
            model = attention_only_model(V, d_model=16, n_heads=2, n_ctx=32, seed=init)
            recorder = Recorder(tmp_path / f"i{init}d{data}", tokens, QUIET)
            train(model, syn_data, num_steps=20, lr_y=0.5, lr_z=0.5, batch_size=16,
                  save_steps=[0, 5, 10, 20], loss_on="last", progress=False, seed=data,
                  on_checkpoint=recorder.on_checkpoint)  # fmt: skip
            runs[f"i{init}d{data}"] = recorder.trajectory()
    assert runs["i1d0"].meta["init_seed"] == 1 and runs["i1d0"].meta["data_seed"] == 0
    from scansnap_lens.statistics.corpus import cooccurrence

    stats = cooccurrence(syn_data(512, torch.Generator().manual_seed(1)), V)
    comparison = measure_runs(runs, source=stats, match="index")
    design = comparison.design.set_index("run")
    assert design.loc["i0d0", "init"] == design.loc["i0d1", "init"] != design.loc["i1d0", "init"]
    assert design.loc["i0d0", "data"] == design.loc["i1d0", "data"]
    assert any("from 2 initial weights and 2 data orders" in w for w in comparison.warnings)
    page = write_runs_report(comparison, tmp_path / "page").path.read_text()
    assert "What the runs share" in page and "the recording" in page
    again = RunComparison.load(tmp_path / "page")
    pd.testing.assert_frame_equal(again.design, comparison.design, check_dtype=False)


def test_the_runs_page_splits_the_spread_and_says_the_groups(tmp_path):
    """Six initialisations x two data orders whose snap steps fall in two groups set by the
    initial weights: the page says the groups, and that the initial weights hold the spread."""
    from scansnap_lens.reading.findings import runs_findings_of
    from scansnap_lens.report import write_runs_report

    rng = np.random.default_rng(0)
    steps = [118.0, 124, 121, 173, 170, 176]
    summaries, design = {}, {}
    for i, step in enumerate(steps):
        for d in range(2):
            value = step * math.exp(rng.normal(0, 0.01))
            summaries[f"i{i}d{d}"] = pd.DataFrame({
                "layer": [0], "head": [0], "snap_step": [value], "snap_step_lo": [value - 2],
                "snap_step_hi": [value + 2], "bias": [0.1 * i], "auroc": [0.6],
                "scans": [True], "verdict": ["scans"], "final_step": [400]})  # fmt: skip
            design[f"i{i}d{d}"] = (f"w{i}", f"o{d}")
    comparison = compare_runs(summaries, design=run_design(list(summaries), design))
    assert comparison.layers.loc[0, "snap_step_median_groups"] == "6 near 121, 6 near 173"
    split = comparison.split
    layer = split[(split["figure"] == "snap_step_median")].set_index("part")
    assert layer.loc["init", "share_lo"] > 0.9  # the initial weights hold the spread
    said = " ".join(runs_findings_of(comparison))
    assert "two separate groups (6 near 121, 6 near 173)" in said
    assert "the initial weights" in said and "another initialisation moves" in said
    page = write_runs_report(comparison, tmp_path / "page").path.read_text()
    assert "The spread between runs, split" in page
    again = RunComparison.load(tmp_path / "page")
    pd.testing.assert_frame_equal(again.split, comparison.split, check_dtype=False)
