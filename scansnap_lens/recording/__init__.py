"""Recording attention over checkpoints (its modules, one concept each: docs/architecture.md)."""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(
    __name__, "aggregates budget fused hooks plan recorder settings storage suite sweep trajectory"
)
