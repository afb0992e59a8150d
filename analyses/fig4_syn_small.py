"""Fig. 4: Syn-Small, SGD (momentum 0.9), zero init; eta_Y = eta_Z = 1 and eta_Y = 10, eta_Z = 1.

python analyses/fig4_syn_small.py --out out/fig4
"""

from __future__ import annotations

from _common import parser

from scansnap_lens.lab import distinct_entropy, syn_small_experiment


def main() -> None:
    p = parser(__doc__, "out/fig4")
    p.add_argument("--num-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    settings = {"lrY1_lrZ1": (1.0, 1.0), "lrY10_lrZ1": (1.0, 10.0)}
    runs = syn_small_experiment(settings, args.out, "sgd", args.num_steps, args.seed, "fig4")
    for label, run in runs.items():
        entropy = distinct_entropy(run)[0].tolist()
        print(f"{label}: final loss {run.loss[-1, 0]:.2e}, distinct entropy per class {entropy}")
    print(f"wrote figures and CSVs to {args.out}")


if __name__ == "__main__":
    main()
