"""Where and how much to record, decided from what the measures show or will be able to show
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

_MODULES = "placement power"
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
