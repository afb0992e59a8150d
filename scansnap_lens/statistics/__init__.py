"""Corpus statistics and token kinds: which context tokens are distinct, which common.

- `context`: the context convention (window, BOS, self) shared by statistics and recordings;
- `corpus`: co-occurrence statistics N(m, n), C(m, n, l), P(l | m, n);
- `kinds`: `TokenKind`, the one vocabulary of token kinds;
- `classification`: `classify`, distinct and common tokens decided from the statistics;
- `groups`: `TokenGroups`, the distinct tokens of each class and the common tokens of each
  query that the measurements compare.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "COMMON": "classification",
    "Context": "context",
    "CooccurrenceStats": "corpus",
    "DISTINCT": "classification",
    "TokenGroups": "groups",
    "TokenKind": "kinds",
    "TokenLabels": "classification",
    "UNDETERMINED": "classification",
    "classify": "classification",
    "cooccurrence": "corpus",
    "cooccurrence_from_dataset": "corpus",
    "dataset_batches": "corpus",
    "open_dataset": "corpus",
    "require_same": "context",
}
_MODULES = {"classification", "context", "corpus", "groups", "kinds"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
