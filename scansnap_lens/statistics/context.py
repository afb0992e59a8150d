"""The context convention: which positions before a query count as its context.

Statistics (`corpus.CooccurrenceStats.context`) and recordings (`plan.RecordPlan.context`)
each carry one; where the two meet (token groups against a trajectory, the theory fit, the
report) they must agree on position 0, or the distinct and common tokens of the statistics
are measured over other contexts than they were counted in.

>>> Context(window=64).mismatch(Context(exclude_bos=True)) is not None
True
>>> Context(window=64).mismatch(Context()) is None  # a window is the statistics' own choice
True
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Context", "require_same"]


@dataclass(frozen=True)
class Context:
    """window: the most positions before the query (None: the whole row; recordings always
    take the whole causal context); exclude_bos: position 0 of each row is not context;
    include_self: the query's own position is context (statistics never count it)."""

    window: int | None = None
    exclude_bos: bool = False
    include_self: bool = False

    @classmethod
    def given(cls, context: Context | None, window=None, exclude_bos=False, include_self=False):
        """The context a function works in: `context`, where given (a window or flag given
        beside it must agree with it), else the one its loose arguments spell.

        >>> Context.given(Context(window=8), exclude_bos=False).window
        8
        """
        loose = cls(window, exclude_bos, include_self)
        if context is None:
            return loose
        differ = [
            f"{k} {getattr(loose, k)!r}"
            for k in ("window", "exclude_bos", "include_self")
            if getattr(loose, k) not in (None, False, getattr(context, k))
        ]
        if differ:
            raise ValueError(f"{', '.join(differ)} given beside context={context}: give one")
        return context

    def mismatch(self, recorded: Context) -> str | None:
        """What makes statistics of this context unfit for a recording of `recorded`, or None."""
        if self.exclude_bos != recorded.exclude_bos:
            counted = "leave position 0 out of" if self.exclude_bos else "count position 0 as"
            kept = "leaves it out" if recorded.exclude_bos else "counts it"
            return (
                f"the statistics {counted} context and the recording {kept} (exclude_bos"
                f" {self.exclude_bos} there, {recorded.exclude_bos} here): count and record"
                " with the same exclude_bos (exclude_bos=)"
            )
        return None


def require_same(statistics, plan) -> None:
    """Raise ValueError when `statistics` (anything with a ``context``: statistics, token
    groups; None or the lab's classes have none, so nothing to check) were counted with
    another position-0 convention than `plan` records."""
    context = getattr(statistics, "context", None)
    problem = None if context is None else context.mismatch(plan.context)
    if problem:
        raise ValueError(problem)
