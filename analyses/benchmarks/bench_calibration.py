"""The scan verdict, its intervals and its power on synthetic trajectories whose truth is known
and shaped like real text (`lab.calibration`), through the public API (`scan_uncertainty`).

    python analyses/benchmarks/bench_calibration.py [--trajectories 200] [--quick]

Prints JSON lines:

- one per null scenario (nothing depends on the token's kind: clean; a shared pool of common
  tokens with token effects of 20 % and 50 % of the variance; the same few common tokens for
  every query; unequal noise; a head that follows frequency only): the family-wise rate of
  "scans" over the trajectories (48 heads each, 30 queries), which must be at most alpha plus
  its Monte Carlo margin (two standard errors), and the rate of two-sided AUROC and bias
  p-values below 0.05 of single heads;
- one per number of queries (5, 10, 30, 100; shared pool, token effect 20 %, AUROC 0.7): the
  coverage of the 95 % intervals of bias and AUROC over the heads that got one, which must lie
  in [0.90, 0.99], and the share refused as too few units;
- one per effect (AUROC 0.6, 0.7, 0.8) and head count (48, 144): the power, the share of
  scanning heads (a quarter of all) called "scans", over 100 queries of the shared pool, with
  the median minimal detectable AUROC;
- one per classification of a corpus's tokens (the paper's kinds without the guard, the
  default guard, purity 0.9 with min_support 2) and head that follows frequency only, counted
  and classified by the real pipeline (`lab.calibration.corpus_run`: 8 heads, 12 queries):
  a head whose logit change follows the word's rarity in the corpus at 10 % and 25 % of the
  variance, one that follows its frequency at 10 %, and one that follows the pair's rarity in
  the evaluation text at 25 %, on a corpus whose topic words are tied to next tokens and (the
  paper's kinds) one where nothing is: the family-wise rate of "scans", at most alpha plus its
  margin;
- one per classification: a pure kind effect planted in one head of 8 at the minimal
  detectable AUROC the verdict printed for that layout (a run of the same corpus without it):
  the verdict's detection rate, which must lie in [0.7, 0.9];
- the demo's Syn-Medium recipe (`scansnap demo`) over 10 seeds: one verdict;
- one per row-effect scenario of the head types (skewed, very skewed, near one) and number of
  rows (5, 8, 16, 64): the coverage of the score's and the rise's 95 % intervals, the
  family-wise rate of "formed" among heads that never rise, and the coverage of the
  formation step's interval.

Seeded: the same command prints the same numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from scansnap_lens.lab.calibration import (
    HEAD_TYPE_SCENARIOS,
    SCENARIOS,
    CorpusScenario,
    corpus_run,
    crossed_run,
    head_type_run,
    head_type_truth,
)
from scansnap_lens.measures import scan_uncertainty
from scansnap_lens.measures.head_types import formation_step, head_type
from scansnap_lens.measures.resampling import ALPHA
from scansnap_lens.statistics.groups import Classification

CLASSIFICATIONS = {
    "paper_kinds": Classification(guard=False),
    "default_guard": Classification(),
    "purity_0.9_support_2": Classification(purity=0.9, min_support=2),
}
CORPUS_NULLS = {  # heads that follow frequency only
    "corpus_rarity_10": {"rarity_share": 0.10},
    "corpus_rarity_25": {"rarity_share": 0.25},
    "corpus_frequency_10": {"rarity_share": -0.10},
    "evaluation_rarity_25": {"count_share": 0.25},
}


def _tables(scenario, reps: int, heads: int, auroc=0.5, seed0: int = 0):
    layers = max(1, heads // 8) if heads % 8 == 0 else 1
    per_layer = heads // layers
    for seed in range(seed0, seed0 + reps):
        traj, groups, truth = crossed_run(
            scenario, heads=per_layer, layers=layers, auroc=_grid(auroc, layers, per_layer),
            seed=seed,
        )  # fmt: skip
        yield scan_uncertainty(traj, groups).table, truth


def _grid(auroc, layers: int, heads: int):
    if isinstance(auroc, float):
        return auroc
    return torch.as_tensor(auroc, dtype=torch.float64).reshape(layers, heads)


def null_rates(reps: int, heads: int, queries: int) -> None:
    margin = 2 * math.sqrt(ALPHA * (1 - ALPHA) / reps)
    for name, scenario in SCENARIOS.items():
        start = time.perf_counter()
        family, auroc_p, bias_p = [], [], []
        for table, _ in _tables(scenario.with_queries(queries), reps, heads):
            family.append(bool(table["scans"].any()))
            auroc_p.append(table["auroc_p"].to_numpy())
            bias_p.append(table["bias_p"].to_numpy())
        rate = float(np.mean(family))
        a, b = np.concatenate(auroc_p), np.concatenate(bias_p)
        print(json.dumps({
            "null": name, "trajectories": reps, "heads": heads, "queries": queries,
            "familywise_scans": round(rate, 4), "alpha": ALPHA, "margin": round(margin, 4),
            "within": rate <= ALPHA + margin,
            "auroc_p_below_0.05": round(float(np.nanmean(a <= 0.05)), 4),
            "bias_p_below_0.05": round(float(np.nanmean(b <= 0.05)), 4),
            "s": round(time.perf_counter() - start, 1),
        }), flush=True)  # fmt: skip


def coverage(reps: int, heads: int = 8, target: float = 0.7) -> None:
    for queries in (5, 10, 30, 100):
        start = time.perf_counter()
        hits = {"bias": [], "auroc": []}
        refused = []
        scenario = SCENARIOS["shared_pool_20"].with_queries(queries)
        for table, truth in _tables(scenario, reps, heads, auroc=target):
            given = table["auroc_lo"].notna().to_numpy()
            refused.append(1 - given.mean())
            for figure in hits:
                t = truth[figure].reshape(-1).numpy()
                inside = (table[f"{figure}_lo"] <= t) & (t <= table[f"{figure}_hi"])
                hits[figure] += list(inside.to_numpy()[given])
        cover = {k: (round(float(np.mean(v)), 4) if v else None) for k, v in hits.items()}
        print(json.dumps({
            "coverage_queries": queries, "trajectories": reps, "heads": heads, "auroc": target,
            "bias_coverage": cover["bias"], "auroc_coverage": cover["auroc"],
            "refused_too_few_units": round(float(np.mean(refused)), 4),
            "within": all(c is None or 0.90 <= c <= 0.99 for c in cover.values()),
            "s": round(time.perf_counter() - start, 1),
        }), flush=True)  # fmt: skip


def power(reps: int, queries: int) -> None:
    for heads in (48, 144):
        for target in (0.6, 0.7, 0.8):
            start = time.perf_counter()
            effect = np.full(heads, 0.5)
            effect[: heads // 4] = target
            found, mde = [], []
            scenario = SCENARIOS["shared_pool_20"].with_queries(queries)
            for table, _ in _tables(scenario, reps, heads, auroc=effect, seed0=10_000):
                found.append(table["scans"].to_numpy()[: heads // 4].mean())
                mde.append(table["auroc_mde"].median())
            print(json.dumps({
                "power_auroc": target, "heads": heads, "queries": queries,
                "trajectories": reps, "power": round(float(np.mean(found)), 4),
                "median_mde_auroc": round(float(np.median(mde)), 4),
                "s": round(time.perf_counter() - start, 1),
            }), flush=True)  # fmt: skip


def head_types(reps: int, heads: int = 8) -> None:
    """Per row-effect scenario and number of rows: the coverage of the head-type score's
    interval (at the last checkpoint; none below `head_types.MIN_ROWS` rows) and of its
    rise's, over every head that got one; the
    family-wise rate of a "formed" call among heads that never rise; and the coverage of the
    formation step's interval among the rising heads called formed, against the population
    curves (`head_type_truth`)."""
    rise = tuple([0.3] * (heads // 2) + [0.0] * (heads - heads // 2))
    for name, scenario in HEAD_TYPE_SCENARIOS.items():
        truth = head_type_truth(rise, **scenario)  # [S, H]
        true_step = formation_step(torch.arange(truth.shape[0]) * 10, truth.T)  # [H]
        for rows in (5, 8, 16, 64):
            start = time.perf_counter()
            score_hit, rise_hit, false_formed, step_hit, refused = [], [], [], [], []
            for seed in range(reps):
                traj = head_type_run(rows, heads, rise, seed=seed, **scenario)
                t = head_type(traj, "induction").final()
                lo, hi = t["induction_lo"].to_numpy(), t["induction_hi"].to_numpy()
                given = ~np.isnan(lo)
                refused.append(1 - given.mean())
                final = truth[-1].numpy()
                score_hit += list(((lo <= final) & (final <= hi))[given])
                r_lo, r_hi = t["induction_rise_lo"].to_numpy(), t["induction_rise_hi"].to_numpy()
                d = (truth[-1] - truth[0]).numpy()
                rise_hit += list(((r_lo <= d) & (d <= r_hi))[~np.isnan(r_lo)])
                formed = t["induction_reason"].to_numpy() == ""
                null = np.array(rise) == 0
                false_formed.append(bool(formed[null].any()))
                s_lo, s_hi = t["induction_step_lo"].to_numpy(), t["induction_step_hi"].to_numpy()
                ts = true_step.numpy()
                ok = formed & ~null
                step_hit += list(((s_lo <= ts) & (ts <= s_hi))[ok])
            print(json.dumps({
                "head_types": name, "rows": rows, "trajectories": reps, "heads": heads,
                "score_coverage": _share(score_hit), "rise_coverage": _share(rise_hit),
                "familywise_false_formed": round(float(np.mean(false_formed)), 4),
                "step_coverage": _share(step_hit), "steps_given": len(step_hit),
                "refused_too_few_units": round(float(np.mean(refused)), 4),
                "within": all(c is None or 0.90 <= c <= 0.99 for c in
                              (_share(score_hit), _share(rise_hit), _share(step_hit))),
                "s": round(time.perf_counter() - start, 1),
            }), flush=True)  # fmt: skip


def corpus_nulls(reps: int, heads: int = 8) -> None:
    margin = 2 * math.sqrt(ALPHA * (1 - ALPHA) / reps)
    for cname, classification in CLASSIFICATIONS.items():
        for tied in (True, False) if cname == "paper_kinds" else (True,):
            for name, shares in CORPUS_NULLS.items():
                start = time.perf_counter()
                scenario = CorpusScenario(tied=tied, **shares)
                family, tested, passed = [], 0, []
                for seed in range(reps):
                    try:
                        traj, groups, _ = corpus_run(scenario, classification, heads, seed=seed)
                        table = scan_uncertainty(traj, groups).table
                    except ValueError:  # no query with both kinds: no verdict, no "scans"
                        family.append(False)
                        continue
                    tested += 1
                    family.append(bool(table["scans"].any()))
                    passed.append(float((table["auroc_p"] < ALPHA / heads).mean()))
                rate = float(np.mean(family))
                print(json.dumps({
                    "corpus_null": name, "classification": cname, "tied": tied,
                    "trajectories": reps, "with_verdict": tested, "heads": heads,
                    "familywise_scans": round(rate, 4), "alpha": ALPHA,
                    "margin": round(margin, 4), "within": rate <= ALPHA + margin,
                    "auroc_p_below_alpha_over_heads": _share(passed),
                    "s": round(time.perf_counter() - start, 1),
                }), flush=True)  # fmt: skip


def power_at_mde(reps: int, heads: int = 8) -> None:
    for cname, classification in CLASSIFICATIONS.items():
        start = time.perf_counter()
        found, mdes = [], []
        for seed in range(reps):
            scenario = CorpusScenario(tied=True)
            null, groups, _ = corpus_run(scenario, classification, heads, seed=seed,
                                         values_seed=10**6 + seed)  # fmt: skip
            mde = float(scan_uncertainty(null, groups).table["auroc_mde"].median())
            if not 0.5 < mde < 1:
                continue
            auroc = torch.full((1, heads), 0.5)
            auroc[0, 0] = mde
            traj, groups, _ = corpus_run(scenario, classification, heads, auroc, seed=seed)
            found.append(bool(scan_uncertainty(traj, groups).table["scans"][0]))
            mdes.append(mde)
        rate = _share(found)
        print(json.dumps({
            "power_at_mde": cname, "trajectories": reps, "planted": len(found),
            "median_mde_auroc": round(float(np.median(mdes)), 4) if mdes else None,
            "detection": rate, "within": rate is not None and 0.7 <= rate <= 0.9,
            "s": round(time.perf_counter() - start, 1),
        }), flush=True)  # fmt: skip


def syn_medium_seeds(seeds: int) -> None:
    """The demo (`run_demo`: Syn-Medium, its recipe and statistics) per seed: its verdict."""
    import tempfile
    from pathlib import Path

    import pandas as pd

    from scansnap_lens.demo import run_demo

    start = time.perf_counter()
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            run_demo(Path(tmp) / f"seed{seed}", seed=seed, progress=False)
            table = pd.read_csv(Path(tmp) / f"seed{seed}" / "report" / "uncertainty.csv")
            verdicts += [v.split(" (")[0] for v in table["verdict"]]
    kinds = sorted(set(verdicts))
    print(json.dumps({
        "syn_medium_demo_seeds": seeds, "verdicts": {k: verdicts.count(k) for k in kinds},
        "one_verdict": len(kinds) == 1, "s": round(time.perf_counter() - start, 1),
    }), flush=True)  # fmt: skip


def _share(hits: list) -> float | None:
    return round(float(np.mean(hits)), 4) if hits else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trajectories", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="40 trajectories, to try it out")
    args = p.parse_args()
    reps = 40 if args.quick else args.trajectories
    torch.set_num_threads(1)  # many small problems: threads only contend
    null_rates(reps, heads=48, queries=30)
    coverage(reps)
    power(max(reps // 4, min(reps, 10)), queries=100)  # 10 at least, unless asked for fewer
    corpus_nulls(reps)
    power_at_mde(reps)
    syn_medium_seeds(min(reps, 10))
    head_types(reps)


if __name__ == "__main__":
    main()
