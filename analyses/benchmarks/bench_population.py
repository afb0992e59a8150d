"""A recipe's snap across runs (issue 75): populations of runs of one recipe, every initial
weight crossed with every data order, and how often the runs page's interval over runs holds
the mean over the whole population from a few of them, and the spread split between initial
weights and data order holds the population's.

    python analyses/benchmarks/bench_population.py           # about 6 minutes on 2 cores
    python analyses/benchmarks/bench_population.py --quick   # it runs, nothing measured

Families (each a grid of initial weights x data orders, every run read every 5 steps as the
page reads a run, `snapping` and its own bounds from `snap_step_interval`):

- ``transformer_b8``: the demo's recipe (`scansnap demo`: 1-layer attention-only, eta_Z 3,
  eta_Y 0.1, plain SGD) at batches of 8 sequences, 16 inits x 16 data orders, 600 steps;
- ``transformer_b64``: the same at the demo's batch of 64, 16 x 8, 300 steps (its runs
  snap in groups its initial weights set);
- ``yz_b8``: sampled Y/Z runs (uniform initial weights, eta_Z 1, eta_Y 0.1, batch 8, three
  queries, skewed distinct weights), 16 x 16, 1,500 steps: their single-run readings fall in
  two groups.

The truth is the population's: the geometric mean snap step over all its runs, and the split
of `resampling.run_components` over the whole grid, its far runs (`resampling.far_runs`) said
apart as the runs page does (``truth_with_far`` keeps them).  Lines (one JSON each, goal >= 0.9 at a
nominal 0.95):

- ``recipe_interval``: runs drawn as users have them (``seeds``: each its own weights and
  data, as seeds 1-9 of PolyPythias; ``inits_x2``: half as many inits, two data orders each,
  said by their seeds; ``one_init``: all from one init, said, and ``one_init_unsaid`` the
  same runs as today's page read them, every run its own), the share given an interval
  (``given``; runs that share one init give "too few") and the coverage of those given;
- ``spread_split``: crossed sub-grids (4 x 4, 6 x 3, 3 x 3) and PolyPythias' layout (the
  original, 3 data-seeds, 3 weight-seeds, 9 seeds), the coverage of each part's interval
  and its median width.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_time_resolution import batched_transformer_c_hat, sampled_c_hat

from scansnap_lens.measures.resampling import (
    far_runs,
    interval_over_runs,
    pair_variances,
    run_components,
    spread_split,
)
from scansnap_lens.measures.snap import snap_step_interval, snapping
from scansnap_lens.recording.trajectory import Trajectory

READ = 5  # every run read every 5 steps
FAMILIES = {
    "transformer_b8": {"model": "transformer", "batch": 8, "inits": 16, "orders": 16,
                       "last": 600},
    "transformer_b64": {"model": "transformer", "batch": 64, "inits": 16, "orders": 8,
                        "last": 300},
    "yz_b8": {"model": "yz", "batch": 8, "inits": 16, "orders": 16, "last": 1500},
}  # fmt: skip
QUICK = {"inits": 4, "orders": 3}


def population(family: dict) -> tuple[np.ndarray, np.ndarray]:
    """The family's runs: snap steps [I, D] and each run's own bounds [I, D, 2]."""
    inits, orders, last = family["inits"], family["orders"], family["last"]
    init_seeds = [i for i in range(inits) for _ in range(orders)]
    data_seeds = [1000 + d for _ in range(inits) for d in range(orders)]
    steps = list(range(0, last + 1, READ))
    if family["model"] == "transformer":
        c, plan = batched_transformer_c_hat(data_seeds, last, init_seeds=init_seeds,
                                            batch=family["batch"])  # fmt: skip
        c = c[steps]
    else:
        c, plan = sampled_c_hat(family["batch"], data_seeds, last, chunk=32,
                                init_seeds=init_seeds, every=READ)  # fmt: skip
    runs = inits * orders
    seen = Trajectory(plan, torch.tensor(steps), [0], list(range(runs)), c_hat=c)
    table = snapping(seen).table
    iv = snap_step_interval(seen, generator=torch.Generator().manual_seed(0))
    value = table["snap_step"].to_numpy()
    lo = np.fmin(iv["snap_step_lo"].reshape(-1).numpy(), table["snap_step_grid_lo"].to_numpy())
    hi = np.fmax(iv["snap_step_hi"].reshape(-1).numpy(), table["snap_step_grid_hi"].to_numpy())
    bounds = np.stack([lo, hi], 1)
    return value.reshape(inits, orders), bounds.reshape(inits, orders, 2)


def recipe_lines(name: str, snap: np.ndarray, bounds: np.ndarray, draws: int, rng) -> None:
    inits, orders = snap.shape
    truth = float(np.exp(np.nanmean(np.log(snap))))
    for n in (3, 6, 10):
        if n > min(inits, orders) and n > inits:
            continue
        layouts = {"seeds": None, "inits_x2": None, "one_init": None, "one_init_unsaid": None}
        for layout in layouts:
            if layout == "inits_x2" and (n % 2 or n // 2 > inits or orders < 2):
                continue
            if layout.startswith("one_init") and n > orders:
                continue
            if layout == "seeds" and n > min(inits, orders):
                continue
            given = hits = 0
            widths = []
            for _ in range(draws):
                if layout == "seeds":
                    i, d = rng.choice(inits, n, replace=False), rng.choice(orders, n, False)
                    labels = (None, None)
                elif layout == "inits_x2":
                    i = np.repeat(rng.choice(inits, n // 2, replace=False), 2)
                    d = np.concatenate([rng.choice(orders, 2, False) for _ in range(n // 2)])
                    labels = (i.tolist(), None)
                else:
                    i = np.full(n, rng.integers(inits))
                    d = rng.choice(orders, n, replace=False)
                    labels = (i.tolist(), d.tolist()) if layout == "one_init" else (None, None)
                _, _, lo, hi = interval_over_runs(snap[i, d], True, bounds=bounds[i, d],
                                                  init=labels[0], data=labels[1])  # fmt: skip
                if math.isnan(lo):
                    continue
                given += 1
                hits += lo <= truth <= hi
                widths.append((hi - lo) / truth)
            print(json.dumps({
                "bench": "population", "line": "recipe_interval", "family": name, "runs": n,
                "layout": layout, "truth": round(truth, 1), "given": round(given / draws, 3),
                "coverage": round(hits / given, 3) if given else None,
                "width_over_truth": round(float(np.median(widths)), 3) if widths else None,
                "goal": {"coverage": 0.9}, "nominal": 0.95, "draws": draws,
            }), flush=True)  # fmt: skip


def polypythias(inits: int, orders: int, rng) -> tuple[np.ndarray, np.ndarray, list, list]:
    """PolyPythias' layout on the grid: the original (i0, d0), 3 data-seeds (i0, d1-3), 3
    weight-seeds (i1-3, d0) and up to 9 seeds (each its own init and data order), the roles
    drawn at random; (init index, order index, init labels, data labels)."""
    ri, rd = rng.permutation(inits), rng.permutation(orders)
    seeds = min(9, inits - 4, orders - 4)
    i = [ri[0]] * 4 + list(ri[1:4]) + list(ri[4 : 4 + seeds])
    d = [rd[0]] + list(rd[1:4]) + [rd[0]] * 3 + list(rd[4 : 4 + seeds])
    return np.array(i), np.array(d), [int(x) for x in i], [int(x) for x in d]


def split_lines(name: str, snap: np.ndarray, draws: int, rng) -> None:
    """The split as the runs page makes it (`far_runs` said apart, `spread_split` of the
    others) against the same over the whole grid; ``with_far``: the population's split with
    its far runs kept, which a few runs cannot know."""
    inits, orders = snap.shape
    x = np.log(snap).reshape(-1)
    ii, dd = np.repeat(np.arange(inits), orders), np.tile(np.arange(orders), inits)
    shares = {}
    far = far_runs(x, ii, dd)
    for kept, values in (("with_far", x), ("typical", np.where(far, np.nan, x))):
        comps = run_components(pair_variances(values, ii, dd))
        shares[kept] = {k: v / sum(comps.values()) for k, v in comps.items()}
    truth = shares["typical"]
    layouts = [(a, b) for a, b in ((4, 4), (6, 3), (3, 3)) if a <= inits and b <= orders]
    layouts += ["polypythias"] if min(inits, orders) >= 7 else []
    for layout in layouts:
        hits = {k: 0 for k in truth}
        seen = {k: 0 for k in truth}
        widths = {k: [] for k in truth}
        method = None
        for _ in range(draws):
            if layout == "polypythias":
                i, d, li, ld = polypythias(inits, orders, rng)
            else:
                a, b = layout
                ri, rd = rng.choice(inits, a, replace=False), rng.choice(orders, b, False)
                i, d = np.repeat(ri, b), np.tile(rd, a)
                li, ld = i.tolist(), d.tolist()
            values = snap[i, d]
            values = np.where(far_runs(values, li, ld, log=True), np.nan, values)
            split = spread_split(values, li, ld, log=True, draws=2000)
            for row in split.to_dict("records"):
                part = row["part"]
                seen[part] += 1
                hits[part] += row["share_lo"] <= truth[part] <= row["share_hi"]
                widths[part].append(row["share_hi"] - row["share_lo"])
                method = row["method"]
        print(json.dumps({
            "bench": "population", "line": "spread_split", "family": name,
            "layout": layout if isinstance(layout, str) else f"{layout[0]}x{layout[1]}",
            "method": method, "truth": {k: round(v, 3) for k, v in truth.items()},
            "far_runs": int(far.sum()), "runs": inits * orders,
            "truth_with_far": {k: round(v, 3) for k, v in shares["with_far"].items()},
            "coverage": {k: round(hits[k] / seen[k], 3) for k in truth if seen[k]},
            "width": {k: round(float(np.median(widths[k])), 3) for k in truth if widths[k]},
            "goal": {"coverage": 0.9}, "nominal": 0.95, "draws": draws,
        }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small grids: it runs")
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append")
    parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args()
    for name in args.family or list(FAMILIES):
        family = {**FAMILIES[name], **(QUICK if args.quick else {})}
        if args.quick:
            family["last"] = min(family["last"], 300)
        snap, bounds = population(family)
        rng = np.random.default_rng(75)
        draws = 20 if args.quick else args.draws
        recipe_lines(name, snap, bounds, draws, rng)
        split_lines(name, snap, draws, rng)


if __name__ == "__main__":
    main()
