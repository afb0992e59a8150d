"""Theory against measurement: Theorem 3's bounds with rho0 from data, the snapping time at
effective rates, and attention predicted from corpus statistics alone, on the Y/Z lab and on
the demo's transformer.

    python analyses/theory_against_measurement.py --out out/theory [--quick]

0. Horizon: `snap_step` of population runs cut at 3, 30 and 300 times t0 (SGD, momentum).
1. Lab, population dynamics (the theorems' own setting: plain SGD from zero, T -> infinity):
   per setting (K, M, eta_Y, eta_Z), the theory's t0, the measured `snap_step`, and the
   measured ln(chi)/2 of each class's dominant distinct token over Theorem 4's B (bound_ratio;
   Theorem 3 puts it in [f0^2, 1]) with rho0 from the data and with rho0 = 1.
2. Optimizers: sampled lab runs (T = 128) and the demo's 1-layer attention-only transformer,
   trained with SGD, SGD with momentum 0.9 (rates / 10, the same effective rates) and Adam:
   measured snap_step, t0 at the effective rates (none for Adam), and the snap of the
   population dynamics integrated with the same optimizer on the training statistics.
3. Theory fit (`measures.theory_fit`) of every run: rank agreement, logit-change correlation,
   snap ratio.

Writes horizons.csv, lab.csv, optimizers.csv, fit.csv and figures (growth bounds of the lab;
the demo runs' reports, with their theory sections, under demo_<optimizer>/) to --out.
"""

from __future__ import annotations

import time

import pandas as pd
from _common import parser

from scansnap_lens import measures, viz
from scansnap_lens.demo import run_demo
from scansnap_lens.lab.synthetic import sequence_classes, syn_medium
from scansnap_lens.lab.yz import train_yz
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.theory import PhaseTransition

LAB = {  # name -> (classes, [(eta_Y, eta_Z), ...])
    "K2": (lambda: syn_medium(1), [(2.0, 0.5), (5.0, 0.5), (1.0, 1.0)]),
    "K5": (lambda: sequence_classes(1, 5), [(2.0, 0.5), (5.0, 1.0)]),
    "K10": (lambda: sequence_classes(1, 10, num_common=20), [(2.0, 0.5)]),
}
# optimizer -> (eta_Y, eta_Z) of the lab's sampled runs and of the demo transformer
OPTIMIZERS = {
    "sgd": {"lab": (2.0, 0.5), "demo": (0.1, 3.0), "momentum": 0.0},
    "momentum": {"lab": (0.2, 0.05), "demo": (0.01, 0.3), "momentum": 0.9},
    "adam": {"lab": (0.02, 0.02), "demo": (0.003, 0.03), "momentum": 0.0},
}


def _lab_run(classes, lr_y, lr_z, steps, population, optimizer="sgd", momentum=0.0, seeds=(0,)):
    run = train_yz(
        classes, lr_z=lr_z, ratio=lr_y / lr_z, seeds=list(seeds), num_steps=steps,
        population=population, init="zero", optimizer=optimizer, momentum=momentum,
        snapshot_every=max(1, steps // 300),
    )  # fmt: skip
    return run.to_trajectory()


HORIZON = {  # name -> (classes, eta_Y, eta_Z, momentum): eta_Y = 10 eta_Z (Assumption 1)
    "K2 sgd": (lambda: syn_medium(1), 1.0, 0.1, 0.0),
    "K2 momentum": (lambda: syn_medium(1), 0.2, 0.02, 0.9),
    "K5 sgd": (lambda: sequence_classes(1, 5), 2.0, 0.2, 0.0),
    "K10 sgd": (lambda: sequence_classes(1, 10, num_common=20), 2.0, 0.2, 0.0),
}


def horizon_table(horizons=(3, 30, 300)) -> pd.DataFrame:
    """snap_step of one population run cut at horizons of h x t0: training longer (the same run
    continued) must not move it."""
    rows = []
    for name, (make, lr_y, lr_z, momentum) in HORIZON.items():
        classes = make()
        eff_y, eff_z = lr_y / (1 - momentum), lr_z / (1 - momentum)
        t0 = PhaseTransition(classes.num_classes, classes.vocab_size, eff_y, eff_z).t0
        steps = int(max(horizons) * t0) + 1
        run = train_yz(
            classes, lr_z=lr_z, ratio=lr_y / lr_z, num_steps=steps, population=True, init="zero",
            momentum=momentum, snapshot_every=max(1, round(steps / 3000)),
        )  # fmt: skip
        traj = run.to_trajectory()
        row = {"setting": name, "K": classes.num_classes, "M": classes.vocab_size,
               "eta_Y_eff": eff_y, "eta_Z_eff": eff_z, "t0": t0}  # fmt: skip
        for h in horizons:
            cut = [s for s in traj.steps.tolist() if s <= h * t0]
            snap = measures.snapping(traj.select(steps=cut)).table.iloc[0]
            row[f"snap@{h}t0"] = snap["snap_step"]
            if snap["snap_reason"]:
                row[f"why@{h}t0"] = snap["snap_reason"]
        values = [row[f"snap@{h}t0"] for h in horizons]
        finite = [v for v in values if v == v]
        row["spread"] = max(finite) / min(finite) - 1 if finite else float("nan")
        row["snap/t0"] = values[-1] / t0
        rows.append(row)
    return pd.DataFrame(rows)


def lab_bounds(horizon: float) -> tuple[pd.DataFrame, list]:
    rows, trajectories = [], []
    for name, (make, rates) in LAB.items():
        classes = make()
        groups = TokenGroups.from_synthetic(classes)
        for lr_y, lr_z in rates:
            theory = PhaseTransition(classes.num_classes, classes.vocab_size, lr_y, lr_z)
            steps = int(horizon * theory.t0)
            traj = _lab_run(classes, lr_y, lr_z, steps, population=True)
            snap = measures.snapping(traj).table["snap_step"].iloc[0]
            data = measures.growth_bounds(traj, groups, classes).detail
            one = measures.growth_bounds(traj, groups, classes, rho0_value=1.0).detail
            rows.append({
                "setting": name, "K": classes.num_classes, "M": classes.vocab_size,
                "lr_y": lr_y, "lr_z": lr_z, "steps": steps, "t0": theory.t0,
                "snap_step": snap, "snap/t0": snap / theory.t0,
                "rho0_data": data["rho0"].iloc[0], "f0_sq": data["f0_sq"].median(),
                "bound_ratio_data": data["bound_ratio"].median(),
                "inside_data": data["inside"].mean(),
                "bound_ratio_rho0_1": one["bound_ratio"].median(),
                "B_rho0_1/B_data": (one["B"] / data["B"]).median(),
            })  # fmt: skip
            trajectories.append((f"{name} eta_Y={lr_y:g} eta_Z={lr_z:g}", traj, groups, classes))
    return pd.DataFrame(rows), trajectories


def optimizers(out, demo_steps: int, lab_steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, fits = [], []
    classes = syn_medium(1)
    groups = TokenGroups.from_synthetic(classes)
    for name, setting in OPTIMIZERS.items():
        optimizer = "adam" if name == "adam" else "sgd"
        lr_y, lr_z = setting["lab"]
        traj = _lab_run(classes, lr_y, lr_z, lab_steps, False, optimizer, setting["momentum"],
                        seeds=(0, 1, 2))  # fmt: skip
        fit = measures.theory_fit(traj, classes, groups).final()
        t0 = measures.predicted_snap(traj)
        for head in range(3):
            rows.append({
                "model": "lab (T=128)", "optimizer": name, "seed": head, "lr_y": lr_y,
                "lr_z": lr_z, "snap_step": fit["snap_step"].iloc[head],
                "t0_effective": t0[head], "population_snap": fit["population_snap"].iloc[head],
            })  # fmt: skip
        fits.append(fit.assign(model="lab (T=128)", optimizer=name))

        lr_y, lr_z = setting["demo"]
        result = run_demo(
            out / f"demo_{name}", num_steps=demo_steps, lr_y=lr_y, lr_z=lr_z,
            optimizer=optimizer, momentum=setting["momentum"], progress=False, overwrite=True,
        )  # fmt: skip
        summary = result.summary.iloc[0]
        rows.append({
            "model": "demo transformer", "optimizer": name, "seed": 0, "lr_y": lr_y,
            "lr_z": lr_z, "snap_step": summary["snap_step"],
            "t0_effective": summary["predicted_snap"],
            "population_snap": summary["population_snap"],
        })  # fmt: skip
        keep = ["layer", "head", "rank_agreement", "dz_corr", "snap_step", "population_snap",
                "snap_ratio", "bound_ratio", "inside", "bias", "auroc"]  # fmt: skip
        fits.append(result.summary[keep].assign(model="demo transformer", optimizer=name))
    table = pd.DataFrame(rows)
    table["snap/t0"] = table["snap_step"] / table["t0_effective"]
    table["snap/population"] = table["snap_step"] / table["population_snap"]
    return table, pd.concat(fits, ignore_index=True)


def main() -> None:
    p = parser(__doc__, "out/theory")
    p.add_argument("--quick", action="store_true", help="shorter runs (about a minute)")
    args = p.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    pd.set_option("display.width", 200)

    horizons = horizon_table((3, 10, 30) if args.quick else (3, 30, 300))
    horizons.to_csv(out / "horizons.csv", index=False)
    print("snap_step of one run cut at several horizons (population dynamics)")
    print(horizons.round(3).to_string(index=False))

    lab, trajectories = lab_bounds(horizon=10 if args.quick else 30)
    lab.to_csv(out / "lab.csv", index=False)
    print("Lab, population dynamics (plain SGD from zero): snap and Theorem 3 bounds")
    print(lab.round(3).to_string(index=False))
    _, traj, groups, classes = trajectories[0]
    bounds = measures.growth_bounds(traj, groups, classes)
    viz.plot_growth_bounds(bounds.table, path=out / "lab_growth_bounds.png")

    table, fits = optimizers(out, demo_steps=300 if args.quick else 1000,
                             lab_steps=200 if args.quick else 600)  # fmt: skip
    table.to_csv(out / "optimizers.csv", index=False)
    fits.to_csv(out / "fit.csv", index=False)
    print("\nSnap against predictions, by optimizer (t0 at effective rates; none for Adam)")
    print(table.round(3).to_string(index=False))
    print("\nTheory fit at the last checkpoint")
    columns = ["model", "optimizer", "head", "rank_agreement", "dz_corr", "snap_ratio",
               "bound_ratio", "inside"]  # fmt: skip
    print(fits[[c for c in columns if c in fits]].round(3).to_string(index=False))
    print(f"\nwrote {out} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
