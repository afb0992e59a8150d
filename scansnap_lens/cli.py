"""The ``scansnap`` command line: a thin layer over the library."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .lab import distinct_entropy, syn_small_experiment
from .theory import PhaseTransition

DEMO_SETTINGS = {"lrY1_lrZ1": (1.0, 1.0), "lrY10_lrZ1": (1.0, 10.0)}


def _demo(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    runs = syn_small_experiment(DEMO_SETTINGS, args.out, "sgd", args.steps, args.seed, "demo")
    print(f"Syn-Small lab (Y/Z model, SGD momentum 0.9, zero init, {args.steps} steps)")
    print(
        f"{'setting':<12} {'eta_Z':>6} {'eta_Y':>6} {'final loss':>11} {'entropy':>8}"
        f" {'t0 (theory)':>12}"
    )
    for label, run in runs.items():
        classes = run.classes
        lr_z, lr_y = run.lr_z[0].item(), run.lr_y[0].item()
        theory = PhaseTransition(classes.num_classes, classes.vocab_size, lr_y, lr_z)
        entropy = distinct_entropy(run)[0].mean().item()
        print(
            f"{label:<12} {lr_z:>6g} {lr_y:>6g} {run.loss[-1, 0].item():>11.2e}"
            f" {entropy:>8.3f} {theory.t0:>12.1f}"
        )
    print("entropy: of c_n over each class's distinct tokens at the end (max ln 10 = 2.303)")
    print(f"figures and CSVs in {Path(args.out).resolve()} ({time.perf_counter() - start:.1f} s)")
    return 0


def _theory(args: argparse.Namespace) -> int:
    theory = PhaseTransition(args.K, args.M, args.lr_y, args.lr_z, args.rho0)
    print(f"K={args.K} M={args.M} eta_Y={args.lr_y:g} eta_Z={args.lr_z:g}")
    print(f"scanning ends   t0'  = K ln M / eta_Y           = {theory.t0_prime:.2f}")
    print(
        f"snap            t0   = 2(1+delta') K ln M / eta_Y = {theory.t0:.2f}"
        f" (delta'={theory.delta:.4f})"
    )
    t = np.unique(np.concatenate([np.logspace(0, np.log10(args.t_max), args.points), [theory.t0]]))
    frame = theory.to_dataframe(t)
    if args.csv:
        frame.to_csv(args.csv, index=False)
        print(f"B_n(t) curve written to {args.csv}")
    else:
        print(
            frame[["t", "B", "B_integral", "xi", "chi_upper"]].to_string(
                index=False, float_format="%.4g"
            )
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scansnap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the paper's Syn-Small lab end to end and write figures")
    demo.add_argument("--out", type=Path, default=Path("demo_out"), help="output folder")
    demo.add_argument("--steps", type=int, default=100, help="training steps")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)

    theory = sub.add_parser("theory", help="predicted transition times and the B_n(t) curve")
    theory.add_argument("--K", type=int, required=True, help="number of next tokens")
    theory.add_argument("--M", type=int, required=True, help="vocabulary size")
    theory.add_argument("--lr-y", type=float, required=True, help="decoder rate eta_Y")
    theory.add_argument("--lr-z", type=float, required=True, help="attention rate eta_Z")
    theory.add_argument("--rho0", type=float, default=1.0, help="normalisation constant rho_0")
    theory.add_argument("--t-max", type=float, default=1e5, help="last time of the curve")
    theory.add_argument("--points", type=int, default=25, help="points of the curve")
    theory.add_argument("--csv", type=Path, help="write the curve to this CSV instead")
    theory.set_defaults(func=_theory)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"scansnap {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
