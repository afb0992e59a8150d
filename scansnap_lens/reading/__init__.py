"""What a run's measurements say (docs/glossary.md): read from `measures`, never measured here
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

_MODULES = "analysis findings heads live runs"
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
