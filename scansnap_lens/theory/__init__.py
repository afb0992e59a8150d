"""The paper's predictions: the phase transition and the population dynamics
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "population transition")
