"""Corpus statistics and token kinds: which context tokens are distinct, which common.

- `context`: the context convention (window, BOS, self) shared by statistics and recordings;
- `corpus`: co-occurrence statistics N(m, n), C(m, n, l), P(l | m, n), and `count_corpus`,
  the one way to count a corpus (in one process, or in parts on Ray);
- `kinds`: `TokenKind`, the one vocabulary of token kinds, and `token_kinds`, which decides
  from the statistics which context tokens are distinct and which common (`TokenKinds`);
- `groups`: `TokenGroups`, the distinct tokens of each class and the common tokens of each
  query that the measurements compare, and `Classification`, the one set of settings (and
  defaults) from statistics to groups.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "COMMON": "kinds",
    "Classification": "groups",
    "Context": "context",
    "CooccurrenceStats": "corpus",
    "DISTINCT": "kinds",
    "TokenGroups": "groups",
    "TokenKind": "kinds",
    "TokenKinds": "kinds",
    "UNDETERMINED": "kinds",
    "cooccurrence": "corpus",
    "count_corpus": "corpus",
    "rows_fingerprint": "corpus",
    "require_same": "context",
    "token_kinds": "kinds",
}
_MODULES = {"context", "corpus", "groups", "kinds"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
