"""Models and their checkpoints, on either TransformerLens major
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(
    __name__, "backend checkpoints formats hub steps training tutorial"
)
