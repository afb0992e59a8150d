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

__all__, __getattr__, __dir__ = exports(__name__, "context corpus groups kinds")
