"""The paper's predictions.

- `transition`: the phase transition (Theorems 1 and 4, Appendix F): `PhaseTransition`, t0,
  B_n(t), `rho0` from data;
- `population`: attention predicted from corpus statistics alone (population dynamics).
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "B": "transition",
    "B_integral": "transition",
    "PhaseTransition": "transition",
    "Population": "population",
    "PopulationRun": "population",
    "big_gamma": "transition",
    "gamma": "transition",
    "h": "transition",
    "omega1": "transition",
    "predict": "population",
    "rho0": "transition",
    "xi": "transition",
}
_MODULES = {"population", "transition"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
