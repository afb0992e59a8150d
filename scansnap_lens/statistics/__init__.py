"""Corpus statistics and token kinds: which context tokens are distinct, which common
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "context corpus groups kinds")
