"""Fig. 5: Syn-Small with Adam at eta_Y = eta_Z = 0.1, 0.5, 1 (zero init).

python analyses/fig5_adam.py --out out/fig5
"""

from __future__ import annotations

from _common import parser

from scansnap_lens.lab import distinct_entropy, syn_small_experiment


def main() -> None:
    p = parser(__doc__, "out/fig5")
    p.add_argument("--num-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    args = p.parse_args()
    settings = {f"lr{lr:g}": (lr, 1.0) for lr in args.lr}
    runs = syn_small_experiment(settings, args.out, "adam", args.num_steps, args.seed, "fig5")
    for label, run in runs.items():
        top = run.attention()[-1, 0, 0].topk(3)
        print(
            f"{label}: final loss {run.loss[-1, 0]:.2e}, class 0 top tokens {top.indices.tolist()}"
            f" ({[round(v, 3) for v in top.values.tolist()]}),"
            f" distinct entropy {distinct_entropy(run)[0].tolist()}"
        )
    print(f"wrote figures and CSVs to {args.out}")


if __name__ == "__main__":
    main()
