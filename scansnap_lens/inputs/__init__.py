"""Inputs: text, token files, tokenizers and corpora
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "corpus indexed text tokens")
