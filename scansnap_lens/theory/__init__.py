"""The paper's predictions.

- `transition`: the phase transition (Theorems 1 and 4, Appendix F): `PhaseTransition`, t0,
  B_n(t), `rho0` from data;
- `population`: attention predicted from corpus statistics alone (population dynamics).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "population transition")
