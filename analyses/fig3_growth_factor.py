"""Fig. 3: growth factor chi(t) <= exp(2 B_n(t)) for eta_Z = 0.5 and several eta_Y (K=10, M=1000).

python analyses/fig3_growth_factor.py --out out/fig3
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import parser

from scansnap_lens.theory import PhaseTransition
from scansnap_lens.viz import plot_growth_factor


def main() -> None:
    p = parser(__doc__, "out/fig3")
    p.add_argument("--lr-z", type=float, default=0.5)
    p.add_argument("--lr-y", type=float, nargs="+", default=[0.5, 1.0, 2.0, 5.0, 10.0])
    p.add_argument("--K", type=int, default=10)
    p.add_argument("--M", type=int, default=1000)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    theories = [PhaseTransition(args.K, args.M, lr_y, args.lr_z) for lr_y in args.lr_y]
    t = np.logspace(0, 5, 400)
    plot_growth_factor(theories, t, path=args.out / "fig3.png")
    pd.concat([th.to_dataframe(t) for th in theories]).to_csv(args.out / "fig3.csv", index=False)
    for th in theories:
        print(
            f"eta_Y={th.lr_y:<5g} t0'={th.t0_prime:8.1f}  t0={th.t0:8.1f}"
            f"  B_int(1e5)={th.B_integral(1e5):.3f}"
        )
    print(f"wrote {args.out / 'fig3.png'} and fig3.csv")


if __name__ == "__main__":
    main()
