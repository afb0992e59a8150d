"""Fig. 6: distinct-token entropy of c_n on Syn-Medium against eta_Y / eta_Z (the full sweep).

    python analyses/fig6_syn_medium.py --out out/fig6            # the paper's 64-cell grid
    python analyses/fig6_syn_medium.py --num-last 1 --seeds 2    # a quick look

Defaults follow the paper: lr_z in {0.5, 1, 2, 3}, ratio in {1, 2, 5, 10}, num_last in
{1, 3, 5, 10} with 2 next tokens per query, 10 seeds, 100 steps, batch 128, T = 128, SGD with
momentum 0.9 and no weight decay, PyTorch-default uniform init for Y and Z.
"""

from __future__ import annotations

import time

from _common import parser

from scansnap_lens.lab import (
    FIG6_LR_Z,
    FIG6_NUM_LAST,
    FIG6_RATIO,
    LabTraining,
    entropy_sweep,
    summarize_sweep,
)
from scansnap_lens.viz import plot_entropy_sweep


def main() -> None:
    p = parser(__doc__, "out/fig6")
    p.add_argument("--num-last", type=int, nargs="+", default=list(FIG6_NUM_LAST))
    p.add_argument("--lr-z", type=float, nargs="+", default=list(FIG6_LR_Z))
    p.add_argument("--ratio", type=float, nargs="+", default=list(FIG6_RATIO))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--num-steps", type=int, default=100)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    training = LabTraining(seeds=args.seeds, num_steps=args.num_steps)
    training.save(args.out / "training.json")  # the setting, beside the results
    per_seed = entropy_sweep(args.num_last, args.lr_z, args.ratio, training=training)
    elapsed = time.perf_counter() - start
    summary = summarize_sweep(per_seed)
    per_seed.to_csv(args.out / "fig6_per_seed.csv", index=False)
    summary.to_csv(args.out / "fig6.csv", index=False)
    plot_entropy_sweep(summary, path=args.out / "fig6.png")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    runs = len(per_seed)
    print(f"{runs} runs in {elapsed:.1f} s; wrote {args.out / 'fig6.csv'} and fig6.png")


if __name__ == "__main__":
    main()
