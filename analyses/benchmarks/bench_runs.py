"""Coverage of the interval over runs (`reading.runs`): how often it holds the recipe's mean,
by simulation, for few runs and run effects shaped as seeds shape them.

    python analyses/benchmarks/bench_runs.py        # about 10 seconds

Each simulated recipe has runs whose estimate = the recipe's mean + a run effect (drawn per
scenario, sd 0.3) + the run's own estimation noise (sd 0.05).  Scenarios: ``normal``;
``skewed`` (lognormal run effects, skewness about 1: a few seeds go far one way);
``heavy_tailed`` (Student's t with 3 degrees of freedom); ``one_far_run`` (normal, and one run
in ten shifted by 1.5 sd: a seed that went another way).  One JSON line per scenario, the
coverage at 2, 3, 5 and 10 runs (nominal 0.95), 4000 recipes each.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from scansnap_lens.measures.resampling import interval_over_runs

SD = 0.3
SCENARIOS = {
    "normal": lambda rng, n: rng.normal(0.0, SD, n),
    "skewed": lambda rng, n: SD * (rng.lognormal(0.0, 0.3, n) - np.exp(0.045)) / 0.3,
    "heavy_tailed": lambda rng, n: SD * rng.standard_t(3, n) / np.sqrt(3.0),
    "one_far_run": lambda rng, n: rng.normal(0.0, SD, n) + 1.5 * SD * (rng.random(n) < 0.1),
}
MEANS = {"one_far_run": 0.15 * SD}  # the recipe's mean shifts with the far runs


def main() -> None:
    recipes = 100 if "--quick" in sys.argv[1:] else 4000  # --quick: it runs, nothing measured
    rng = np.random.default_rng(0)
    for name, draw in SCENARIOS.items():
        coverage = {}
        for runs in (2, 3, 5, 10):
            hits = 0
            for _ in range(recipes):
                values = 1.0 + draw(rng, runs) + rng.normal(0.0, 0.05, runs)
                _, _, lo, hi = interval_over_runs(values)
                hits += lo <= 1.0 + MEANS.get(name, 0.0) <= hi
            coverage[f"runs_{runs}"] = round(hits / recipes, 4)
        print(json.dumps({"bench": "runs_interval", "scenario": name, "nominal": 0.95,
                          **coverage}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
