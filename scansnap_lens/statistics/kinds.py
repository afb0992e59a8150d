"""The one vocabulary of token kinds, used by every module that labels tokens.

>>> TokenKind.DISTINCT, TokenKind.COMMON
(<TokenKind.DISTINCT: 1>, <TokenKind.COMMON: 2>)
>>> TokenKind.DISTINCT.label
'distinct'
>>> [k.label for k in TokenKind]
['undetermined', 'distinct', 'common', 'query', 'next']

Context tokens are *distinct* (they occur before one next token of their query only) or
*common* (before several); *undetermined* means not judged (too rare, or not a context token
at all).  The synthetic laboratory also marks the query and next tokens themselves.  Label
tensors hold these integer codes; compare against the enum, never against bare numbers.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["TokenKind"]


class TokenKind(IntEnum):
    UNDETERMINED = 0
    DISTINCT = 1
    COMMON = 2
    QUERY = 3
    NEXT = 4

    @property
    def label(self) -> str:
        """The lower-case name used in tables and figures."""
        return self.name.lower()
