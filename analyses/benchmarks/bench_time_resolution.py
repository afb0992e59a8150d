"""Do the step intervals hold what the checkpoints allow?  Coverage of the snap step's and the
formation step's intervals where the truth is known at every step, seen through the
checkpoint grids users have.

    python analyses/benchmarks/bench_time_resolution.py          # about 40 minutes on 2 cores
    python analyses/benchmarks/bench_time_resolution.py --quick  # small: it runs, no goal

- **Snap steps**: population Y/Z runs of the lab (`lab.yz.train_yz`, 3 queries x 2 next
  tokens with random distinct and common weights per batch of runs, eta_Z drawn log-uniform
  in [1, 12], eta_Y = eta_Z / 10), kept at every step to 1,500; the truth is `snapping`'s
  snap step on every step.  (Sampled runs jitter from step to step, which a per-step rate
  counts as movement: their "truth at every step" would depend on the grid.)
- **Formation steps**: planted head-type scores over 32 rows (row effects Beta(1, 9) x 0.3,
  noise sd 0.03), rising by 0.2-0.6 along a sigmoid in log(1 + step) centred at a step drawn
  log-uniform in [20, 800]; the truth is `formation_step` of the rows' population mean at
  every step.

Each run is then seen only at the checkpoints of five grids over [0, 1500]: ``uniform``
(every 125), ``log`` (0 and 12 log-spaced), ``pythia`` (0, 1, 2, 4, ..., 512, then every 250:
Pythia's schedule, scaled), ``gap`` (every 25 but none in (100, 500)) and ``dense`` (every 10:
how narrow the intervals are where the checkpoints resolve the steps).  One JSON line per
quantity and grid: the coverage of the 95 % interval (goal >= 0.9), the runs the grid resolved
(a snap seen, a rise significant), and the median width over the step.

**Noisy runs** (``--noisy``): sampled Y/Z runs of the lab (plain SGD, batch 8 and 32 of
16-token sequences, eta_Z = 1, eta_Y = 0.1, to step 2,000), whose attention moves by a drift
and by minibatch noise; the truth is the *expected* trajectory's snap: `snapping` of the mean
c_hat over other seeds of the same recipe, every 10 steps.  Each run is seen at Pythia's
schedule, 13 log-spaced checkpoints, every 125, every 25 and every step.  One JSON line per
batch size and grid: the median estimate over the truth (goal 0.8-1.25), the coverage of the
95 % interval (goal >= 0.9), the median checkpoints the drift resolves
(`snap.drift_knots`), and the median of the state companions over the truth.

The same for a **small transformer** (``--transformer``): the demo's recipe (`scansnap demo`:
a 1-layer attention-only model on Syn-Medium, eta_Z = 3, eta_Y = 0.1, plain SGD) with batches of
8 sequences, kept at every step to step 1,000 (the 128-seed mean snaps near 160; to 250
it has not yet), each seed its own run (trained and read in one
batched forward, `batched_transformer_c_hat`, equal to the `Recorder`'s c_hat: tested); the
truth is `snapping` of the mean c_hat over 128 other seeds.  Its grids are the same fractions
of the run: Pythia's, log, every 62, every 12 and every step.  Each seed of it snaps sharply at
a step its initial weights set (4 inits: 124-163) and its batches move a little, so its lines
come twice: against the recipe's mean over seeds, and with the truth given the initial weights
(4 inits x 25 runs, each against the mean over 48 other batch orders from the same weights).

**A family of noisy recipes** (``--family N``, issue 74): N recipes drawn at random
(`family_config`: SGD or Adam, rates over two decades, their ratio 5-50, batches 4-64, 2-6
queries, skewed distinct weights), 8 runs each against the snap of the mean over
``--truth-runs`` other runs from the same start (default 128, trained 16 at a time), kept
only where that mean's snap is the same read every 5, 10, 25 and 50 steps; each recipe's line
says how the truth moves as runs are added (``truth_by_runs``).  ``--cache DIR`` keeps each
draw there, so another reading is checked on the same family in minutes.

**Placed recordings** (`planning.placement`), each run alone, at a budget of 40 recordings
against the log grid of 40 (``log40``): ``placed`` (checkpoints at every step exist, as hub
revisions or a folder would hold them: a coarse pass, then the checkpoints that split each
unresolved bracket, `record --steps auto`) and ``online`` (a training run's
`AdaptiveSchedule`, which cannot go back; snap steps only).  One JSON line each: the coverage
of the 95 % interval and of the checkpoints' bracket alone, the share of runs whose bracket
places the step within 10 % of itself (``within_10pct``, the goal of placement), the median
bracket width over the step and the recordings used.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from scansnap_lens._io import make_folder, read_tensors, write_tensors
from scansnap_lens.lab.synthetic import sequence_classes, sequence_sampler, syn_medium
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.measures.head_types import formation_step, head_type
from scansnap_lens.measures.snap import head_movement, snap_step_interval, snapping
from scansnap_lens.models.steps import select_steps
from scansnap_lens.models.training import initial_weights
from scansnap_lens.planning.placement import (
    AdaptiveSchedule,
    coarse_steps,
    next_steps,
    step_brackets,
)
from scansnap_lens.reading.findings import cannot_place
from scansnap_lens.recording.plan import RecordPlan, plan_recording
from scansnap_lens.recording.trajectory import Trajectory

LAST = 1500


def grids() -> dict[str, list[int]]:
    log = sorted({0, *np.unique(np.geomspace(1, LAST, 12).round().astype(int)).tolist()})
    pythia = sorted({0, *(2**k for k in range(10)), *range(750, LAST + 1, 250)})
    gap = [s for s in range(0, LAST + 1, 25) if not 100 < s < 500]
    return {"uniform": list(range(0, LAST + 1, 125)), "log": log, "pythia": pythia, "gap": gap,
            "dense": list(range(0, LAST + 1, 10))}  # fmt: skip


def snap_runs(runs: int, seed: int) -> tuple[Trajectory, torch.Tensor]:
    """A trajectory of `runs` Y/Z runs (one "head" each) at every step, and each one's truth."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.sort(torch.rand(10, generator=g) + 0.05).values
    classes = sequence_classes(num_queries=3, next_per_query=2, distinct_weights=weights,
                               common_weight=float(0.5 + torch.rand(1, generator=g)))  # fmt: skip
    lr_z = torch.exp(torch.rand(runs, generator=g) * math.log(12.0))
    run = train_yz(classes, lr_z=lr_z, lr_y=lr_z / 10, seeds=list(range(seed, seed + runs)),
                   momentum=0.0, num_steps=LAST, snapshot_every=1,
                   population=True)  # fmt: skip
    traj = run.to_trajectory()
    keep = [s for s in traj.steps.tolist() if s <= LAST]
    traj = traj.select(steps=keep)
    truth = torch.as_tensor(snapping(traj).table["snap_step"].to_numpy())
    return traj, truth


def planted(runs: int, seed: int, steps: list[int], rows: int = 32):
    """Head-type scores of `runs` planted heads at `steps` and every head's truth."""
    rng = np.random.default_rng(seed)
    formed = np.exp(rng.uniform(math.log(20), math.log(800), runs))
    width = rng.uniform(0.3, 0.8, runs)
    rise = rng.uniform(0.2, 0.6, runs)
    every = np.arange(LAST + 1, dtype=np.float64)

    def curve(t):  # [S, H] the rise's shape
        return 1 / (1 + np.exp(-(np.log1p(t)[:, None] - np.log1p(formed)[None]) / width))

    mean = 0.3 * 0.1 + rise * curve(every)  # the rows' population mean, Beta(1, 9) x 0.3
    truth = formation_step(torch.arange(LAST + 1), torch.from_numpy(mean.T))
    t = np.asarray(steps, dtype=np.float64)
    base = 0.3 * rng.beta(1, 9, (rows, runs))
    noise = rng.normal(0, 0.03, (len(t), rows, runs))
    score = np.clip(base[None] + rise * curve(t)[:, None] + noise, 0, 1)  # [S, N, H]
    plan = RecordPlan.from_counts(
        2, torch.tensor([0]), torch.tensor([1]), torch.tensor([1]), torch.tensor([0]),
        torch.tensor([0]), torch.tensor([1]),
    )  # fmt: skip
    values = torch.from_numpy(score).permute(0, 2, 1)[:, None].float()  # [S, 1, H, N]
    traj = Trajectory(plan, torch.tensor(steps), [0], list(range(runs)), induction=values)
    return traj, truth


def summary(name: str, grid: str, truth, value, lo, hi) -> dict:
    ok = np.isfinite(truth) & np.isfinite(value) & np.isfinite(lo) & np.isfinite(hi)
    covered = (lo[ok] <= truth[ok]) & (truth[ok] <= hi[ok])
    inside = (lo[ok] <= value[ok]) & (value[ok] <= hi[ok])
    return {
        "bench": "time_resolution", "quantity": name, "grid": grid, "runs": len(truth),
        "resolved": int(ok.sum()), "coverage": round(float(covered.mean()), 3) if ok.any()
        else None, "value_inside": bool(inside.all()), "goal": 0.9,
        "median_width_over_step": round(float(np.median((hi - lo)[ok] / truth[ok])), 3)
        if ok.any() else None,
    }  # fmt: skip


BUDGET = 40


def placed(one: Trajectory, budget: int = BUDGET) -> list[int]:
    """The steps `record_placed` chooses among every step of `one`, within `budget`."""
    available = one.steps.tolist()
    chosen = set(coarse_steps(available, budget))
    while picks := next_steps(step_brackets(one.select(steps=sorted(chosen))), available,
                              chosen, budget - len(chosen)):  # fmt: skip
        chosen |= {s for s, _ in picks}
    return sorted(chosen)


def online(one: Trajectory, budget: int = BUDGET) -> list[int]:
    """The steps an `AdaptiveSchedule` records in a run whose every step is `one`'s."""
    schedule = AdaptiveSchedule(recorder=None, budget=budget, last_step=LAST)
    steps, moves = [0], []
    while steps[-1] < LAST:
        nxt, _ = schedule.choose(steps, moves)
        moves.append(head_movement(one.plan, one.c_hat[steps[-1]], one.c_hat[nxt]))
        steps.append(nxt)
    return steps


def placement_lines(batches: int, per_batch: int) -> None:
    """The snap and formation steps of runs recorded by placement against the log grid."""
    rows: dict = {}
    for b in range(batches):
        dense, truth = snap_runs(per_batch, seed=1000 * b)
        for h in range(per_batch):
            one = dense.select(heads=[dense.heads[h]])
            for how, steps in (("log40", select_steps(one.steps.tolist(), f"log:{BUDGET}")),
                               ("placed", placed(one)), ("online", online(one))):  # fmt: skip
                sub = one.select(steps=steps)
                table = snapping(sub).table
                iv = snap_step_interval(sub, generator=torch.Generator().manual_seed(b))
                rows.setdefault(("snap_step", how), []).append([
                    float(truth[h]), float(table["snap_step"][0]),
                    float(iv["snap_step_lo"][0, 0]), float(iv["snap_step_hi"][0, 0]),
                    float(table["snap_step_grid_lo"][0]), float(table["snap_step_grid_hi"][0]),
                    len(steps)])  # fmt: skip
        traj, truth = planted(per_batch, 5000 + b, list(range(LAST + 1)))
        for h in range(per_batch):
            one = traj.select(heads=[traj.heads[h]])
            for how, steps in (("log40", select_steps(one.steps.tolist(), f"log:{BUDGET}")),
                               ("placed", placed(one))):  # fmt: skip
                sub = one.select(steps=steps)
                final = head_type(sub, "induction").final()
                score = torch.as_tensor(sub.induction[:]).double().nanmean(-1).permute(1, 2, 0)
                _, lo, hi = formation_step(sub.steps, score, grid=True)
                rows.setdefault(("formation_step", how), []).append([
                    float(truth[h]), *(float(final[f"induction_step{e}"].iloc[0])
                                       for e in ("", "_lo", "_hi")),
                    float(lo.reshape(-1)[0]), float(hi.reshape(-1)[0]), len(steps)])  # fmt: skip
    for (quantity, how), found in rows.items():
        truth, value, lo, hi, glo, ghi, used = np.array(found).T
        line = summary(quantity, how, truth, value, lo, hi)
        ok = np.isfinite(value) & np.isfinite(glo)
        line.update({
            "budget": BUDGET, "recordings_median": int(np.median(used)),
            "grid_coverage": round(float(((glo <= truth) & (truth <= ghi))[ok].mean()), 3),
            "within_10pct": round(float(((value - glo <= 0.1 * value)
                                         & (ghi - value <= 0.1 * value))[ok].mean()), 3),
            "median_grid_width_over_step": round(float(np.median(((ghi - glo) / value)[ok])), 3),
        })  # fmt: skip
        print(json.dumps(line), flush=True)


NOISY_LAST = 2000


def noisy_grids(last: int) -> dict[str, list[int]]:
    """Pythia's schedule (0, 1, 2, 4, ... then every eighth of the run), 13 log-spaced steps,
    every sixteenth and every eightieth of the run (125 and 25 of 2,000) and every step."""
    log = sorted({0, *np.unique(np.geomspace(1, last, 13).round().astype(int)).tolist()})
    late, spaced = 3 * last // 8, last // 8
    pythia = sorted({0, *(2**k for k in range(12) if 2**k < late),
                     *range(late, last + 1, spaced), last})  # fmt: skip
    coarse, fine = last // 16, last // 80
    every = {f"every{k}": list(range(0, last + 1, k)) for k in (coarse, fine)}
    return {"pythia": pythia, "log": log, **every, "every": list(range(last + 1))}


def sampled_c_hat(
    batch: int,
    seeds: list[int],
    last: int,
    chunk: int = 64,
    init_seeds: list[int] | None = None,
    every: int = 1,
):
    """c_hat [S, 1, R, Pc] of sampled Y/Z runs (one per seed) every `every` steps, and their
    plan; with `init_seeds`, each run starts from uniform weights of its own init seed
    (`train_yz`), else all from zero."""
    g = torch.Generator().manual_seed(0)
    weights = torch.sort(torch.rand(10, generator=g) + 0.05).values
    classes = sequence_classes(num_queries=3, next_per_query=2, distinct_weights=weights,
                               common_weight=1.0)  # fmt: skip
    parts, plan = [], None
    for k in range(0, len(seeds), chunk):
        inits = None if init_seeds is None else init_seeds[k : k + chunk]
        run = train_yz(classes, lr_z=1.0, lr_y=0.1, seeds=seeds[k : k + chunk], momentum=0.0,
                       init_seeds=inits, init="zero" if inits is None else "uniform",
                       num_steps=last, snapshot_every=every, batch_size=batch,
                       seq_len=16)  # fmt: skip
        traj = run.to_trajectory()
        parts.append(traj.c_hat[:].clone())
        plan = traj.plan
        del run, traj
    return torch.cat(parts, 2), plan


def noisy_lines(runs: int, truth_seeds: int, batches=(8, 32), last: int = NOISY_LAST) -> None:
    """The snap steps of sampled Y/Z runs against their expected trajectory's, per grid."""
    for batch in batches:
        c, plan = sampled_c_hat(batch, list(range(10_000, 10_000 + runs + truth_seeds)), last)
        _noisy_grid_lines(c, plan, runs, {"model": "yz", "batch": batch}, last)


def transformer_lines(runs: int, truth_seeds: int, last: int = 1000) -> None:
    """The same for the demo's transformer at batch 8, kept at every step: each seed its own
    initial weights and batches; the truth the mean over other seeds (the recipe's)."""
    c, plan = batched_transformer_c_hat(list(range(runs + truth_seeds)), last)
    _noisy_grid_lines(c, plan, runs, {"model": "transformer", "batch": 8}, last)


def transformer_init_lines(inits: int, runs: int, truth_runs: int, last: int = 1000) -> None:
    """The demo's transformer again, each truth given the initial weights: per init, ``runs``
    runs (batch orders) against the snap of the mean over ``truth_runs`` others from the same
    initial weights (``truth`` below: the median over inits, ``truth_spread``: each init's)."""
    per = runs + truth_runs
    init_seeds = [i for i in range(inits) for _ in range(per)]
    c, plan = batched_transformer_c_hat([50_000 + k for k in range(inits * per)], last,
                                        init_seeds=init_seeds)  # fmt: skip
    parts, truths = [], []
    for i in range(inits):
        group = c[:, :, i * per : (i + 1) * per]
        parts.append(group[:, :, :runs])
        truths.append(np.repeat(_expected_snap(group[:, :, runs:], plan, last)[None], runs, 0))
    what = {"model": "transformer", "batch": 8, "truth_given": "initial weights",
            "inits": inits}  # fmt: skip
    _grid_lines(torch.cat(parts, 2), plan, np.concatenate(truths), what, last, truth_runs)


FAMILY_LAST = 2000


def family_config(rng: np.random.Generator) -> dict:
    """One noisy recipe drawn at random (issue 74's family): the optimizer (plain SGD or Adam),
    eta_Z log-uniform over two decades of its own range, eta_Z / eta_Y log-uniform in [5, 50],
    the batch log-uniform in 4..64 sequences of 16 tokens, 2-6 queries of 2 next tokens each,
    and distinct weights skewed as u^k (k in [1, 4], u uniform) over the common weight."""
    adam = bool(rng.random() < 0.4)
    low = 3e-3 if adam else 0.2
    return {
        "optimizer": "adam" if adam else "sgd",
        "lr_z": float(low * 100 ** rng.random()),
        "ratio": float(np.exp(rng.uniform(math.log(5), math.log(50)))),
        "batch": round(math.exp(rng.uniform(math.log(4), math.log(64)))),
        "queries": int(rng.integers(2, 7)),
        "skew": float(rng.uniform(1, 4)),
        "common_weight": float(rng.uniform(0.5, 1.5)),
        "weights_seed": int(rng.integers(1 << 30)),
    }


def family_c_hat(config: dict, seeds: list[int], last: int, every: int = 1):
    """c_hat [S, 1, R, Pc] every `every` steps of sampled Y/Z runs of one `family_config`
    recipe (one per seed, all from the zero start: a run differs from another by its batches
    only), and their plan."""
    g = torch.Generator().manual_seed(config["weights_seed"])
    weights = torch.sort(torch.rand(10, generator=g, dtype=torch.float64) ** config["skew"]
                         + 0.02).values  # fmt: skip
    classes = sequence_classes(num_queries=config["queries"], next_per_query=2,
                               distinct_weights=weights,
                               common_weight=config["common_weight"])  # fmt: skip
    run = train_yz(classes, lr_z=config["lr_z"], lr_y=config["lr_z"] / config["ratio"],
                   seeds=seeds, optimizer=config["optimizer"], momentum=0.0,
                   num_steps=last, snapshot_every=every, batch_size=config["batch"],
                   seq_len=16)  # fmt: skip
    traj = run.to_trajectory()
    return traj.c_hat[:].clone(), traj.plan


# runs a call: 264 runs at every step of 2,000 at once passed 24 GB, and 32 a call once
TRUTH_CHUNK = 16
TRUTH_EVERY = 5  # the truth is read every 5 steps at the finest: kept no finer (a third less time)


def family_mean_c_hat(config: dict, seeds: list[int], last: int) -> dict[int, torch.Tensor]:
    """{n: the mean c_hat [S', 1, 1, Pc] of the first n runs, every `TRUTH_EVERY` steps} for
    n = 16, 32, 64, ... up to len(seeds) (the runs trained `TRUTH_CHUNK` at a time, their c_hat
    summed): how the expected trajectory's estimate moves as runs are added."""
    total, means = None, {}
    for k in range(0, len(seeds), TRUTH_CHUNK):
        part, _ = family_c_hat(config, seeds[k : k + TRUTH_CHUNK], last, TRUTH_EVERY)
        summed = part.double().sum(2, keepdim=True)
        total = summed if total is None else total + summed
        n = min(k + TRUTH_CHUNK, len(seeds))
        if n & (n - 1) == 0 or n == len(seeds):  # 16, 32, 64, ... and all
            means[n] = (total / n).float()
    return means


FAMILY_SPACINGS = (5, 10, 25, 50)  # the truth read at each spacing under a quarter of it
SETTLED = 1.2  # and the same at all of them within this factor


def _snap_every(mean, plan, last: int, spacing: int) -> float:
    """The snap of a mean c_hat [S', 1, 1, Pc] (every `TRUTH_EVERY` steps) read every
    `spacing` steps (a multiple of it)."""
    steps = list(range(0, last + 1, spacing))
    rows = [s // TRUTH_EVERY for s in steps]
    expected = Trajectory(plan, torch.tensor(steps), [0], [0], c_hat=mean[rows])
    return float(snapping(expected).table["snap_step"][0])


def _settled_snap(mean, plan, last: int) -> np.ndarray | None:
    """The snap of a mean c_hat [S', 1, 1, Pc] read every 5, 10, 25 and 50 steps
    (`FAMILY_SPACINGS`, those under a quarter of the step read), or None where it is not
    settled: not snapped, before step 20, fewer than two spacings, or they disagree by more
    than `SETTLED` (a mean over finitely many runs still moves by noise)."""
    found = [(k, _snap_every(mean, plan, last, k)) for k in FAMILY_SPACINGS]
    fine = [v for k, v in found if np.isfinite(v) and 4 * k <= v]
    if len(fine) < 2 or min(fine) < 20 or max(fine) > SETTLED * min(fine):
        return None
    return np.array(fine)


def _stays_snapped(mean, plan, last: int, truth: float, spacing: int = 50) -> bool:
    """Whether the mean's rate of movement, read every `spacing` steps, stays under half its
    peak from a spacing past its snap `truth` to the end; where it rises back, the truth is a
    dip between two phases of movement, not attention that froze."""
    rows = torch.arange(0, last + 1, spacing) // TRUTH_EVERY
    m = mean[rows, 0, 0]
    rate = head_movement(plan, m[:-1], m[1:]).numpy()
    after = np.arange(spacing, last + 1, spacing) > truth + spacing
    return not bool((rate[after] > 0.5 * rate.max()).any())


def family_draw(config: dict, runs: int, truth_runs: int, last: int, cache: Path | None):
    """(c_hat [S, 1, runs, Pc] every step, plan, `family_mean_c_hat` over `truth_runs` others)
    of one recipe; with `cache`, read from that file when it holds this recipe, else written
    there (a safetensors file through the package's one writer): a new reading is then
    checked on the same family in minutes, not hours."""
    plan = family_c_hat(config, [0], 1)[1]  # the plan is the recipe's classes'
    tag = json.dumps(config, sort_keys=True)
    if cache is not None and cache.is_file():
        meta, tensors = read_tensors(cache, FAMILY_FORMAT, "family draw")
        means = {k[5:]: v for k, v in tensors.items() if k.startswith("mean_")}
        shape = (last // TRUTH_EVERY + 1, 1, 1, plan.num_triples)
        if (meta.get("config") != tag or "runs" not in tensors
                or tensors["runs"].shape != (last + 1, 1, runs, plan.num_triples)
                or str(truth_runs) not in means or not all(k.isdigit() for k in means)
                or any(v.shape != shape for v in means.values())):  # fmt: skip
            raise ValueError(f"{cache} holds another recipe, run length or truth: remove it")
        return tensors["runs"], plan, {int(k): v for k, v in means.items()}
    c, _ = family_c_hat(config, list(range(runs)), last)
    means = family_mean_c_hat(config, list(range(runs, runs + truth_runs)), last)
    if cache is not None:
        tensors = {"runs": c, **{f"mean_{n}": m for n, m in means.items()}}
        write_tensors(cache, tensors, {"format": FAMILY_FORMAT, "config": tag})
    return c, plan, means


FAMILY_FORMAT = "scansnap_lens.bench.family_draw"


def family_lines(configs: int, runs: int, truth_runs: int, last: int = FAMILY_LAST,
                 seed: int = 74, cache: str | None = None) -> None:  # fmt: skip
    """Issue 74's check: `configs` recipes drawn at random (`family_config`; a draw whose
    expected trajectory's snap is not settled, `_settled_snap`, is drawn again and counted),
    `runs` runs each against the snap of the mean over `truth_runs` other runs from the same
    start (the median of its settled reads; ``truth_by_runs``: the same mean's snap every 5
    steps over the first 16, 32, 64, ... of them, how far the truth still moves).  One line per
    recipe (per grid: the median estimate over the truth, the share of intervals holding it,
    `run_intervals`, and the share of runs that placed a snap, with why the others did not:
    no snap, or an interval over half the run's log-steps, which the findings read as "cannot
    be placed from this run", `findings.cannot_place`),
    then one per grid over the family: the median and worst of the recipes' medians, the
    share of all runs' intervals holding their truth (and of the placed runs'), and the worst
    recipe named.  The state companions (``half_distance_step``, ``half_displacement_step``)
    likewise, each against the mean's read every `TRUTH_EVERY` steps (they are
    grid-invariant).  The family's lines come twice: over every recipe, and over those whose
    truth stays snapped (`_stays_snapped`: no second phase of movement after it).  `cache`: a
    folder keeping each draw (`family_draw`)."""
    if cache:
        make_folder(cache)
    rng = np.random.default_rng(seed)
    found: dict[str, list] = {g: [] for g in noisy_grids(last)}
    found_states: dict[tuple, list] = {(n, g): [] for n in STEPS_READ[1:] for g in found}
    stays: list[bool] = []
    drawn = 0
    for k in range(configs):
        while True:
            drawn += 1
            c = means = None  # a redrawn recipe's runs go before the next are trained
            config = family_config(rng)
            name = f"family_{seed}_{drawn}_{runs}_{truth_runs}.safetensors"
            c, plan, means = family_draw(config, runs, truth_runs, last,
                                         Path(cache) / name if cache else None)  # fmt: skip
            truths = _settled_snap(means[truth_runs], plan, last)
            if truths is not None:
                break
        truth = float(np.median(truths))
        expected = snapping(Trajectory(plan, torch.arange(0, last + 1, TRUTH_EVERY), [0], [0],
                                       c_hat=means[truth_runs])).table  # fmt: skip
        states = {n: float(expected[n][0]) for n in STEPS_READ[1:]}  # grid-invariant: every 5
        stays.append(_stays_snapped(means[truth_runs], plan, last, truth))
        line = {"bench": "time_resolution", "quantity": "snap_step_family", "recipe": k,
                **config, "truth": round(truth, 1), "truth_stays_snapped": stays[-1],
                "truth_by_spacing": [round(float(t), 1) for t in truths],
                "truth_by_runs": {n: round(_snap_every(m, plan, last, 5), 1)
                                  for n, m in means.items()}}  # fmt: skip
        for grid, steps in noisy_grids(last).items():
            seen = Trajectory(plan, torch.tensor(steps), [0], list(range(runs)),
                              c_hat=c[steps])  # fmt: skip
            table = snapping(seen).table
            read = run_intervals(seen, table, k)
            value, lo, hi, _ = read["snap_step"]
            span = (float(steps[0]), float(steps[-1]))
            wide = np.array([cannot_place(a, z, span) for a, z in zip(lo, hi)], dtype=bool)
            why = sorted(set(table["snap_reason"]) - {""}) + ["interval over half the run"] * any(
                wide & np.isfinite(value)
            )
            value = np.where(wide, np.nan, value)
            value, lo, hi = value / truth, lo / truth, hi / truth
            covered = (lo <= 1) & (1 <= hi)
            found[grid].append((k, value, covered))
            median = float(np.nanmedian(value)) if np.isfinite(value).any() else None
            knots = float(np.median(table["drift_checkpoints"]))
            line[grid] = {"median_over_truth": median and round(median, 3),
                          "coverage": round(float(covered.mean()), 3),
                          "placed": round(float(np.isfinite(value).mean()), 3),
                          "coverage_of_placed": round(float(covered[np.isfinite(value)].mean()), 3)
                          if np.isfinite(value).any() else None,
                          "not_placed_because": why,
                          "drift_checkpoints": knots,
                          **{f"{n}_median_over_truth": _ratio(np.nanmedian(read[n][0]) / t)
                             for n, t in states.items()},
                          **{f"{n}_coverage": round(float(((read[n][1] <= t)
                                                           & (t <= read[n][2])).mean()), 3)
                             for n, t in states.items()}}  # fmt: skip
            for n, t in states.items():
                found_states[(n, grid)].append((read[n][1] <= t) & (t <= read[n][2]))
        print(json.dumps(line), flush=True)
    kept = [k for k, stayed in enumerate(stays) if stayed]
    for which, recipes in (("all", range(len(stays))), ("truth_stays_snapped", kept)):
        for grid, rows in found.items():
            if recipes:
                states = {n: [found_states[(n, grid)][k] for k in recipes] for n in STEPS_READ[1:]}
                head = {"grid": grid, "recipes_read": which, "drawn": drawn, "runs_each": runs,
                        "truth_runs": truth_runs}  # fmt: skip
                _family_line(head, [rows[k] for k in recipes], states)


def _family_line(head: dict, rows: list, states: dict) -> None:
    """One line over recipes: `rows` (recipe, estimate / truth [R], covered [R]) of one grid,
    `states` {name: [covered [R]]} of the state companions."""
    medians = np.array([np.nanmedian(v) if np.isfinite(v).any() else np.nan
                        for _, v, _ in rows])  # fmt: skip
    off = np.abs(np.log(np.where(np.isfinite(medians), medians, 1e-3)))
    worst = int(np.argmax(off))
    coverage = np.concatenate([c for _, _, c in rows])
    placed = np.isfinite(np.concatenate([v for _, v, _ in rows]))
    some = np.isfinite(medians)
    print(json.dumps({
        "bench": "time_resolution", "quantity": "snap_step_family", **head,
        "recipes": len(rows),
        "median_of_medians_over_truth": _ratio(np.nanmedian(medians)),
        "recipes_within_0.8_1.25": round(float(((medians >= 0.8) & (medians <= 1.25))
                                               .mean()), 3),
        "worst_recipe": rows[worst][0], "worst_median_over_truth": _ratio(medians[worst]),
        "coverage": round(float(coverage.mean()), 3),
        "worst_recipe_coverage": round(float(min(c.mean() for _, _, c in rows)), 3),
        "placed": round(float(placed.mean()), 3),
        "coverage_of_placed": round(float(coverage[placed].mean()), 3) if placed.any()
        else None,
        "recipes_none_placed": int((~some).sum()),
        "placing_recipes_within_0.8_1.25": round(float(((medians[some] >= 0.8)
            & (medians[some] <= 1.25)).mean()), 3) if some.any() else None,
        "goal": {"median_over_truth": [0.8, 1.25], "coverage": 0.9},
        **{f"{n}_coverage": round(float(np.concatenate(c).mean()), 3)
           for n, c in states.items()},
    }), flush=True)  # fmt: skip


def _ratio(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None


SPACINGS = (1, 2, 5, 10)  # the truth read at each: a mean over seeds still carries noise


def _expected_snap(c, plan, last: int) -> np.ndarray:
    """[4] the snap of the mean of c_hat [S, 1, R, Pc] over its runs, read every 1, 2, 5 and
    10 steps (`SPACINGS`; every 5 at most under 500 steps): the truth is the last, its
    spread over the four how well the mean over finitely many seeds knows it."""
    mean = c.double().mean(2, keepdim=True).float()
    out = []
    for k in SPACINGS:
        steps = list(range(0, last + 1, min(k, 10 if last >= 500 else 5)))
        expected = Trajectory(plan, torch.tensor(steps), [0], [0], c_hat=mean[steps])
        out.append(float(snapping(expected).table["snap_step"][0]))
    return np.array(out)


def _noisy_grid_lines(c, plan, runs: int, what: dict, last: int) -> None:
    """Runs 0..runs-1 of c_hat [S, 1, R, Pc] against the snap of the mean over the others."""
    truth = np.repeat(_expected_snap(c[:, :, runs:], plan, last)[None], runs, 0)
    _grid_lines(c[:, :, :runs], plan, truth, what, last, c.shape[2] - runs)


STEPS_READ = ("snap_step", "half_distance_step", "half_displacement_step")


def run_intervals(seen: Trajectory, table, seed: int) -> dict[str, tuple]:
    """{name: (value, lo, hi, few) [R]} for `STEPS_READ`, each run as the findings read it: the
    interval of `snap_step_interval`, or where the run has too few classes to resample
    (``few``: the demo's 4) the knots' bracket alone, as a run's own bounds are over runs."""
    iv = snap_step_interval(seen, generator=torch.Generator().manual_seed(seed))
    out = {}
    for name in STEPS_READ:
        value = table[name].to_numpy()
        lo, hi = (iv[f"{name}_{e}"].reshape(-1).numpy() for e in ("lo", "hi"))
        few = np.isnan(lo) & np.isfinite(value)
        lo = np.where(few, table[f"{name}_grid_lo"].to_numpy(), lo)
        hi = np.where(few, table[f"{name}_grid_hi"].to_numpy(), hi)
        out[name] = value, lo, hi, few
    return out


def _grid_lines(c, plan, truths: np.ndarray, what: dict, last: int, truth_runs: int) -> None:
    """One line per grid: each run of c_hat [S, 1, R, Pc] against its truth, the last of its
    row of `truths` [R, 4] (`_expected_snap`); ``coverage_of_range``: the share of intervals
    that meet the row's range.  Where a run has too few classes to resample (the demo's 4),
    its interval is the knots' bracket alone, as a run's own bounds are over runs
    (``bracket_only``: the share of such runs)."""
    runs = c.shape[2]
    truth, low, high = truths[:, -1], np.nanmin(truths, 1), np.nanmax(truths, 1)
    for grid, steps in noisy_grids(last).items():
        seen = Trajectory(plan, torch.tensor(steps), [0], list(range(runs)), c_hat=c[steps])
        table = snapping(seen).table
        value, lo, hi, few = run_intervals(seen, table, 0)["snap_step"]
        ratio = value / truth
        q = {x: round(float(np.nanquantile(ratio, x)), 3) if np.isfinite(ratio).any() else None
             for x in (0.1, 0.5, 0.9)}  # fmt: skip
        print(json.dumps({
            "bench": "time_resolution", "quantity": "snap_step_noisy", **what, "grid": grid,
            "checkpoints": len(steps), "runs": runs, "truth_runs": truth_runs,
            "truth": round(float(np.median(truth)), 1),
            "truth_spread": sorted({round(float(t), 1) for t in truth}),
            "truth_by_spacing": sorted({tuple(round(float(t), 1) for t in r) for r in truths}),
            "median_over_truth": q[0.5], "q10_over_truth": q[0.1],
            "q90_over_truth": q[0.9], "snapped": round(float(np.isfinite(value).mean()), 3),
            "coverage": round(float(((lo <= truth) & (truth <= hi)).mean()), 3),
            "coverage_of_range": round(float(((lo <= high) & (low <= hi)).mean()), 3),
            "width_over_truth": round(float(np.nanmedian((hi - lo) / truth)), 3),
            "bracket_only": round(float(few.mean()), 3),
            "goal": {"median_over_truth": [0.8, 1.25], "coverage": 0.9},
            "drift_checkpoints_median": float(np.median(table["drift_checkpoints"])),
            "straightness_median": round(float(table["straightness"].median()), 3),
            **{f"{n}_over_truth": round(float(np.nanmedian(table[n] / truth)), 3)
               if table[n].notna().any() else None
               for n in ("half_distance_step", "half_displacement_step")},
        }), flush=True)  # fmt: skip


def transformer_c_hat(seeds: list[int], last: int, folder):
    """c_hat [S, 1, R, Pc] of the demo's recipe at batch 8, one run per seed, recorded at every
    step, and the plan (the demo's: seed 0's evaluation tokens for every run)."""
    from tqdm.auto import tqdm

    from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.recording.settings import RecordingSettings

    classes = syn_medium()
    sample = sequence_sampler(classes)
    queries = classes.query.unique().tolist()
    tokens = sample(32, torch.Generator().manual_seed(2))
    plan = plan_recording(tokens, classes.vocab_size, queries=queries, exclude_bos=False)
    parts = []
    for seed in tqdm(seeds, desc="transformer seeds"):
        model = attention_only_model(classes.vocab_size, d_model=32, n_heads=1, n_ctx=64,
                                     seed=seed, normalization_type=None)  # fmt: skip
        recorder = Recorder(f"{folder}/seed{seed}", tokens,
                            RecordingSettings(progress=False, overwrite=True), plan)  # fmt: skip
        train(model, sample, num_steps=last, lr_y=0.1, lr_z=3.0, batch_size=8, save_steps=1,
              loss_on="last", seed=seed, progress=False,
              on_checkpoint=recorder.on_checkpoint)  # fmt: skip
        parts.append(recorder.trajectory().c_hat[:].clone())
    return torch.cat(parts, 2), plan


def batched_transformer_c_hat(
    seeds: list[int],
    last: int,
    chunk: int = 128,
    init_seeds: list[int] | None = None,
    batch: int = 8,
):
    """What `transformer_c_hat` gives, for many seeds at once: the same models (each seed's
    `initial_weights`, no positions, no LayerNorm), each trained on its own seed's batches by
    plain SGD (eta_Z on W_Q, W_K and their biases), written as one batched forward of
    ``chunk`` models; c_hat of each step is the recorder's definition (`aggregates`: per event
    of a tracked class, the context weights renormalised, summed into (class, l), over N(m, n))
    on the same evaluation tokens.  `test_benchmarks` holds it to the recorder's values.
    ``init_seeds`` (one per seed): each run's initial weights from these, its batches from
    ``seeds`` (default: both from ``seeds``, as `train` does); ``batch``: sequences a step
    (the demo's is 64)."""
    init_seeds = seeds if init_seeds is None else init_seeds
    classes = syn_medium()
    sample = sequence_sampler(classes)
    queries = classes.query.unique().tolist()
    tokens = sample(32, torch.Generator().manual_seed(2))
    plan = plan_recording(tokens, classes.vocab_size, queries=queries, exclude_bos=False)
    flat, slot = _c_hat_reads(plan, tokens)
    count = plan.class_events[plan.triple_class].double()
    parts = []
    for k in range(0, len(seeds), chunk):
        parts.append(_train_batched(seeds[k : k + chunk], last, sample, tokens, flat, slot,
                                    plan.num_triples, count, classes.vocab_size,
                                    init_seeds[k : k + chunk], batch))  # fmt: skip
    return torch.cat(parts, 2), plan


def _c_hat_reads(plan, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where c_hat reads a renormalised pattern [B, T, T] flattened (its flat index) and which
    triple slot each read adds to, for the evaluation tokens `x` [B, T]."""
    B, T = x.shape
    first, own = int(plan.exclude_bos), int(plan.include_self)
    flats, slots = [], []
    for b in range(B):  # once per benchmark: the tokens are fixed
        for t in range(first + 1, T - 1):
            c = plan.class_slot(int(x[b, t]), int(x[b, t + 1]))
            if c is None:
                continue
            start = max(first, t - plan.window) if plan.window else first
            ctx = torch.arange(start, t + own)
            s = plan.triple_slot(c, x[b, ctx])
            flats.append((b * T + t) * T + ctx[s >= 0])
            slots.append(s[s >= 0])
    return torch.cat(flats), torch.cat(slots)


def _train_batched(
    seeds, last, sample, tokens, flat, slot, num_slots, count, V, init_seeds, batch=8
):
    d_model, lr_y, lr_z = 32, 0.1, 3.0  # the demo's recipe
    fields = dict(n_layers=1, d_model=d_model, n_heads=1, d_head=d_model, d_vocab=V, n_ctx=64,
                  normalization_type=None)  # fmt: skip
    inits = [initial_weights(fields, s) for s in init_seeds]
    names = ["embed.W_E", *(f"blocks.0.attn.{n}" for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q",
             "b_K", "b_V", "b_O")), "unembed.W_U", "unembed.b_U"]  # fmt: skip
    w = {n.split(".")[-1]: torch.stack([i[n] for i in inits]).requires_grad_() for n in names}
    rates = {n: lr_z if n in ("W_Q", "W_K", "b_Q", "b_K") else lr_y for n in w}
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    R, scale = len(seeds), math.sqrt(d_model)
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()

    def pattern(x: torch.Tensor, last_only: bool) -> torch.Tensor:  # x [R, B, T] -> [R, B, t, T]
        e = w["W_E"][torch.arange(R)[:, None, None], x]  # [R, B, T, D]
        q_in = e[:, :, -1:] if last_only else e
        q = torch.einsum("rbtd,rde->rbte", q_in, w["W_Q"][:, 0]) + w["b_Q"][:, None]
        k = torch.einsum("rbtd,rde->rbte", e, w["W_K"][:, 0]) + w["b_K"][:, None]
        scores = torch.einsum("rbqe,rbke->rbqk", q, k) / scale
        mask = causal[-1:, : x.shape[2]] if last_only else causal[: x.shape[2], : x.shape[2]]
        return scores.masked_fill(~mask, -math.inf).softmax(-1), e

    c_hat = torch.zeros(last + 1, 1, R, num_slots)
    own = torch.zeros(tokens.shape[1], tokens.shape[1], dtype=torch.bool)

    def record(step: int) -> None:
        with torch.no_grad():
            a, _ = pattern(tokens.expand(R, -1, -1), last_only=False)  # [R, B, T, T]
            ctx = a.masked_fill(own, 0.0)  # the query's own position is not context
            a = a.reshape(R, -1)[:, flat] / ctx.sum(-1).reshape(R, -1)[:, flat // a.shape[-1]]
            total = torch.zeros(R, num_slots, dtype=torch.float64).index_add_(1, slot, a.double())
            c_hat[step, 0] = (total / count.clamp_min(1)).float()

    own.fill_diagonal_(True)
    record(0)
    for step in range(1, last + 1):
        x = torch.stack([sample(batch, g) for g in gens])  # [R, B, T + 1]
        a, e = pattern(x[:, :, :-1], last_only=True)  # [R, B, 1, T]
        v = torch.einsum("rbtd,rde->rbte", e, w["W_V"][:, 0]) + w["b_V"][:, None]
        z = torch.einsum("rbqk,rbke->rbqe", a, v)[:, :, 0]  # [R, B, e]
        resid = e[:, :, -1] + torch.einsum("rbe,red->rbd", z, w["W_O"][:, 0]) + w["b_O"][:, None]
        logits = torch.einsum("rbd,rdv->rbv", resid, w["W_U"]) + w["b_U"][:, None]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, :, -1].flatten())
        grads = torch.autograd.grad(loss * R, list(w.values()))  # each model's batch mean
        with torch.no_grad():
            for (n, p), g in zip(w.items(), grads):
                p.sub_(rates[n] * g)
        record(step)
    return c_hat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="8 runs a quantity: it runs")
    parser.add_argument(
        "--noisy",
        action="store_true",
        help="only the noisy Y/Z runs (100 a batch size and grid, ~25 minutes)",
    )
    parser.add_argument(
        "--transformer",
        type=int,
        default=0,
        metavar="SEEDS",
        help="only the noisy transformer: SEEDS runs against 128 other seeds, then 4 initial"
        " weights x SEEDS/4 runs against 48 batch orders each (~15 minutes at 100)",
    )
    parser.add_argument(
        "--family",
        type=int,
        default=0,
        metavar="RECIPES",
        help="only issue 74's family: RECIPES noisy recipes drawn at random, 8 runs each"
        " against the mean of --truth-runs others",
    )
    parser.add_argument(
        "--truth-runs",
        type=int,
        default=128,
        metavar="N",
        help="with --family: runs behind each recipe's truth (trained 16 at a time; about"
        " 3 minutes a recipe at 128 on 2 cores)",
    )
    parser.add_argument(
        "--seed", type=int, default=74, help="with --family: the seed the recipes are drawn with"
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="with --family: keep each draw's runs and truth in DIR and read them from there"
        " when present (5-15 MB a draw: 0.8 GB for the 73 draws of 36 recipes; a new reading of"
        " the family then takes minutes)",
    )
    args = parser.parse_args()
    if args.family:
        family_lines(args.family, 8, args.truth_runs, seed=args.seed, cache=args.cache)
        return
    if args.noisy or args.transformer:
        if args.noisy:
            noisy_lines(100, 128)
        if args.transformer:
            transformer_lines(args.transformer, 128)
            transformer_init_lines(4, args.transformer // 4, 48)
        return
    batches, per_batch = (1, 8) if args.quick else (10, 20)
    torch.manual_seed(0)
    found = {g: {"truth": [], "value": [], "lo": [], "hi": []} for g in grids()}
    for b in range(batches):
        dense, truth = snap_runs(per_batch, seed=1000 * b)
        for grid, steps in grids().items():
            sub = dense.select(steps=steps)
            interval = snap_step_interval(sub, generator=torch.Generator().manual_seed(b))
            found[grid]["truth"].append(truth.numpy())
            found[grid]["value"].append(snapping(sub).table["snap_step"].to_numpy())
            found[grid]["lo"].append(interval["snap_step_lo"].reshape(-1).numpy())
            found[grid]["hi"].append(interval["snap_step_hi"].reshape(-1).numpy())
    for grid, f in found.items():
        print(json.dumps(summary("snap_step", grid, *(np.concatenate(f[k]) for k in f))),
              flush=True)  # fmt: skip
    for grid, steps in grids().items():
        parts = []
        for b in range(batches):
            traj, truth = planted(per_batch, 5000 + b, steps)
            final = head_type(traj, "induction").final()
            parts.append([truth.numpy(), *(final[f"induction_step{e}"].to_numpy()
                                           for e in ("", "_lo", "_hi"))])  # fmt: skip
        print(json.dumps(summary("formation_step", grid, *map(np.concatenate, zip(*parts)))),
              flush=True)  # fmt: skip
    placement_lines(batches, per_batch)
    if args.quick:
        noisy_lines(4, 4, batches=(8,), last=1000)
        transformer_lines(4, 4, last=80)
        transformer_init_lines(2, 2, 2, last=80)
    else:
        noisy_lines(100, 128)
        transformer_lines(100, 128)
        transformer_init_lines(4, 25, 48)


if __name__ == "__main__":
    main()
