"""What a checkpoint records: one table of aggregates, the twin of `measures.catalog`.

Each `Aggregate` is, per watched head, a mean over what one forward pass gathers from the
attention at the positions it tracks, with one value per slot of its axis:

    axis      slots                                         of
    pairs     zbar's (query m, context token l) pairs       the plan    [Pz]
    triples   c_hat's (class (m, n), context token l)       the plan    [Pc]
    classes   classes (m, n)                                the plan    [K]
    queries   tracked query tokens m                        the plan    [Q]
    rows      evaluation rows (or the aggregate's own)      the tokens  [R]

A checkpoint's record is [L, H, slots] per aggregate (`CheckpointRecord`); a trajectory's is
[S, L, H, slots].  The hooks (`recording.hooks`), the checkpoint files' keys and shape checks
(`recording.storage`), `Trajectory`, the plan's query selection and the budget iterate over
`AGGREGATES`; adding an aggregate is one entry.

Two kinds of entries:

- **Plan aggregates** (pairs, triples, classes, queries) read what the plan tracks: the
  scores or the renormalised context weights of each (query position, context position) pair
  of an event (`Gathered`), and divide by a count the plan knows.
- **Position aggregates** (rows) read the attention weights A[row, q, k] at the positions
  their ``positions(x)`` function lists, and give per row the mean over its query positions
  of the summed weight on their listed keys.  A notebook's own aggregate is one of these:

>>> same = Aggregate(
...     "same_token",
...     axis="rows",
...     positions=lambda x: earlier_copies(x),
...     doc="attention on earlier copies of the query's own token",
... )
>>> x = torch.tensor([[5, 7, 5, 5]])
>>> [t.tolist() for t in same.positions(x)]  # (row, query position, key position)
[[0, 0, 0], [2, 3, 3], [0, 0, 2]]

Entries with ``optional=True`` may be missing from folders written before they existed (and
from the lab's trajectories, which compute what they can): a measure that needs one says so.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from scansnap_lens.recording.plan import RecordPlan

__all__ = [
    "AGGREGATES",
    "DEFAULT",
    "RESERVED",
    "Aggregate",
    "CheckpointRecord",
    "Gathered",
    "aggregate_named",
    "earlier_copies",
    "first_token_positions",
    "induction_positions",
    "previous_token_positions",
    "repeated_random_rows",
    "resolve",
]

# the plan's size of each plan axis
# Names a trajectory or a checkpoint record uses itself: an aggregate of one of these names
# would shadow it (tests/recording/test_trajectory.py keeps the set complete).
RESERVED = frozenset(
    {
        "plan",
        "steps",
        "layers",
        "heads",
        "step_unit",
        "skipped",
        "meta",
        "prompt",
        "prompt_pattern",
        "aggregates",
        "rows",
        "values",
        "step",
        "num_steps",
        "replace",
        "holds",
        "from_records",
        "class_slot",
        "class_attention",
        "attention",
        "logits",
        "select",
        "to_dataframe",
        "entropy_dataframe",
        "save",
        "load",
        "entries",
        "loss",
        "loss_on",
        "recording",
    }
)

AXES = {
    "pairs": "num_pairs",
    "triples": "num_triples",
    "classes": "num_classes",
    "queries": "num_queries",
    "rows": None,
}


@dataclass
class Gathered:
    """What one layer of one batch offers a plan aggregate's ``gather``: the tracked position
    pairs (``batch``, `hooks._Batch`), and, [J, H] over those pairs and the watched heads,
    the ``scores`` (at the pairs the plan holds) or the attention ``pattern`` with each
    event's ``context`` weight [E, H] (their sum over its context) and context ``entropy``
    [E, H] (nats) of the weights renormalised over the context: `weights` [J, H], or
    `weights_at` a subset of the pairs, which costs only that subset."""

    batch: object
    scores: Tensor | None = None
    pattern: Tensor | None = None
    context: Tensor | None = None
    entropy: Tensor | None = None

    @property
    def weights(self) -> Tensor:
        """[J, H] the attention weights renormalised over each event's context."""
        return self.pattern / self.context[self.batch.event]

    def weights_at(self, pairs: Tensor) -> Tensor:
        """[n, H] `weights` at `pairs` [n] (indices of the batch's pairs)."""
        return self.pattern[pairs] / self.context[self.batch.event[pairs]]


@dataclass(frozen=True)
class Aggregate:
    """One recorded quantity: per watched head, one mean per slot of `axis`.

    name: its attribute on records and trajectories; key: its tensor's name in checkpoint
    files (default: name); doc: what one value is; denominator: what its mean divides by.
    optional: folders written before it existed lack it.
    Plan aggregates: reads ("scores" or "weights"), gather(`Gathered`) -> (slot [n], values
    [n, H]) summed into the slots, count(plan) -> [slots] the divisor of each slot.
    Position aggregates (axis "rows"): positions(x [B, T]) -> (row [n], query position [n],
    key position [n]) the weights to sum per query position (each query position listed once
    or more counts once); own_rows(tokens [N, T], d_vocab) -> (rows [R, T'], words) where the
    aggregate reads rows of its own instead of the evaluation rows (None: the evaluation rows).
    """

    name: str
    axis: str
    doc: str = ""
    denominator: str = ""
    key: str = ""
    optional: bool = True
    reads: str = "weights"
    gather: Callable[[Gathered], tuple[Tensor, Tensor]] | None = field(default=None, repr=False)
    count: Callable[[RecordPlan], Tensor] | None = field(default=None, repr=False)
    positions: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]] | None = field(
        default=None, repr=False
    )
    own_rows: Callable[[Tensor, int], tuple[Tensor, str] | None] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or keyword.iskeyword(self.name):
            raise ValueError(f"an aggregate's name must be an identifier, got {self.name!r}")
        if self.name.startswith("_"):  # Python's own attributes (__class__) and private ones
            raise ValueError(
                f"an aggregate cannot be called {self.name!r}: a name that starts with '_' is"
                " Python's or the objects' own (a trajectory reads its aggregates as"
                " attributes); choose one that starts with a letter"
            )
        if self.name in RESERVED:
            raise ValueError(
                f"an aggregate cannot be called {self.name!r}: a trajectory or record has a"
                f" field of that name (reserved: {', '.join(sorted(RESERVED))}); choose another"
            )
        if self.axis not in AXES:
            raise ValueError(
                f"aggregate {self.name}: axis must be one of {list(AXES)}, got {self.axis!r}"
            )
        if self.reads not in ("scores", "weights"):
            raise ValueError(f"aggregate {self.name}: reads must be 'scores' or 'weights'")
        if self.axis == "rows":
            if self.positions is None:
                raise ValueError(
                    f"aggregate {self.name}: a rows aggregate needs positions(x) -> (row,"
                    " query position, key position)"
                )
            if self.reads != "weights":
                raise ValueError(f"aggregate {self.name}: a rows aggregate reads the weights")
        elif self.gather is None or self.count is None:
            raise ValueError(
                f"aggregate {self.name}: a {self.axis} aggregate needs gather and count (or use"
                " axis='rows' with positions)"
            )
        if not self.key:
            object.__setattr__(self, "key", self.name)
        if not self.denominator and self.axis == "rows":
            object.__setattr__(self, "denominator", "the row's query positions it reads")

    @property
    def recordable(self) -> bool:
        """Whether this object can record (one read back from a folder only names it)."""
        return _unavailable not in (self.positions, self.gather)

    def slots(self, plan: RecordPlan, rows: int | None = None) -> int:
        """The slots of one head: the plan's size of its axis, or `rows`."""
        size = AXES[self.axis]
        return getattr(plan, size) if size else int(rows or 0)

    def entry(self, rows: int | None = None, source: str | None = None) -> dict:
        """Its line in a trajectory's manifest."""
        out = {"name": self.name, "key": self.key, "axis": self.axis, "doc": self.doc}
        if self.axis == "rows":
            out["slots"] = int(rows or 0)
            out["rows"] = source or "evaluation rows"
        return out

    @classmethod
    def from_entry(cls, entry: dict) -> Aggregate:
        """The aggregate a manifest line names: a built-in entry, or a descriptor of a user's
        (it reads, it does not record)."""
        name = entry.get("name")
        if not isinstance(name, str):
            raise ValueError(f"an aggregate entry has no name ({entry!r})")
        known = _BY_NAME.get(name)
        if known is not None:
            return known
        axis, key = entry.get("axis"), entry.get("key", name)
        if axis not in AXES or not isinstance(key, str):
            raise ValueError(f"aggregate {name}: unreadable entry {entry!r}")
        if axis == "rows":
            return cls(name, axis, str(entry.get("doc", "")), key=key, positions=_unavailable)
        return cls(
            name, axis, str(entry.get("doc", "")), key=key, gather=_unavailable, count=_unavailable
        )


def _unavailable(*args):
    raise RuntimeError("this aggregate was read from a folder: pass its definition to record")


@dataclass
class CheckpointRecord:
    """Aggregates of one checkpoint; L = watched layers, H = watched heads.

    values: {aggregate name: [L, H, slots]} (`AGGREGATES`), each readable as an attribute
    (``record.zbar``); prompt_pattern: [L, H, T, T] attention weights of one example prompt,
    or None; loss: the model's mean next-token loss (nats) on the first evaluation rows
    (`hooks.loss_rows`), or None, over the positions `loss_on` says ("all" or "last").
    """

    step: int
    values: dict[str, Tensor]
    prompt_pattern: Tensor | None = None
    loss: float | None = None
    loss_on: str = "all"

    def __getattr__(self, name: str) -> Tensor:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"this record holds no {name!r} (it holds {sorted(values)})")


# -- the position aggregates' positions ------------------------------------------------------
def _rows_cols(x: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    B = x.shape[0]
    row = torch.arange(B, device=x.device).repeat_interleave(q.numel())
    return row, q.repeat(B), k.repeat(B)


def previous_token_positions(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every query position q >= 2 and its previous position q - 1 (q = 1 is left out: its
    previous position is position 0, the sink, which `first_token_positions` reads).

    >>> [t.tolist() for t in previous_token_positions(torch.zeros(1, 4, dtype=torch.long))]
    [[0, 0], [2, 3], [1, 2]]
    """
    q = torch.arange(2, x.shape[1], device=x.device)
    return _rows_cols(x, q, q - 1)


def first_token_positions(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every query position q >= 1 and position 0 (the attention sink).

    >>> [t.tolist() for t in first_token_positions(torch.zeros(1, 3, dtype=torch.long))]
    [[0, 0], [1, 2], [0, 0]]
    """
    q = torch.arange(1, x.shape[1], device=x.device)
    return _rows_cols(x, q, torch.zeros_like(q))


def _previous_occurrence(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(row, q, s) for every position q whose token occurred earlier in its row, s the most
    recent such position: one sort per batch."""
    B, T = x.shape
    pos = torch.arange(T, device=x.device).expand(B, T)
    order = torch.argsort(x.long() * T + pos, dim=1)  # by token, then position, per row
    token, at = x.gather(1, order), pos.gather(1, order)
    same = token[:, 1:] == token[:, :-1]
    row = torch.arange(B, device=x.device)[:, None].expand(B, T - 1)
    return row[same], at[:, 1:][same], at[:, :-1][same]


def induction_positions(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every position q whose token occurred earlier in its row, and the position after its
    most recent earlier occurrence s: the induction head's target s + 1.  Left out where
    s + 1 is q itself or q - 1 (the previous-token head's target).

    >>> x = torch.tensor([[9, 1, 2, 3, 1, 2, 3]])  # BOS, then "1 2 3" twice
    >>> [t.tolist() for t in induction_positions(x)]
    [[0, 0, 0], [4, 5, 6], [2, 3, 4]]
    """
    row, q, s = _previous_occurrence(x)
    keep = s + 1 < q - 1
    return row[keep], q[keep], s[keep] + 1


def earlier_copies(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every position q and each earlier position holding the same token (a duplicate-token
    head's targets); quadratic in a row's copies of one token, for a notebook's use."""
    T = x.shape[1]
    same = (x[:, :, None] == x[:, None, :]) & torch.ones(
        T, T, dtype=torch.bool, device=x.device
    ).tril(-1)
    return torch.nonzero(same, as_tuple=True)


REPEATS_PER_ROW = 4  # induction positions a row needs to count as a unit
ROWS_NEEDED = 16  # such rows a score's interval needs (`measures.head_types.MIN_ROWS`, tested)
RANDOM_ROWS = 16  # repeated-random-token rows where the evaluation text has too few repeats
RANDOM_HALF = 64  # tokens repeated in each (at most half the evaluation rows' length)


def repeated_random_rows(
    tokens: Tensor,
    vocab_size: int,
    rows: int = RANDOM_ROWS,
    half: int = RANDOM_HALF,
    seed: int = 0,
) -> tuple[Tensor, str] | None:
    """Repeated random tokens for the induction score, where the evaluation rows have fewer
    than `ROWS_NEEDED` rows with `REPEATS_PER_ROW` induction positions; else None.

    Each row keeps the first token of an evaluation row (its BOS, if it has one), then `half`
    distinct random ids of the model's vocabulary, then the same ids again (the
    induction-heads literature's test), seeded.  Returns (rows [R, 1 + 2 half], words).
    """
    tokens = torch.as_tensor(tokens)
    row, _, _ = induction_positions(tokens)
    per_row = torch.bincount(row, minlength=tokens.shape[0])
    if int((per_row >= REPEATS_PER_ROW).sum()) >= ROWS_NEEDED:
        return None
    half = max(2, min(half, (tokens.shape[1] - 1) // 2, vocab_size))
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(vocab_size, generator=g)[:half] for _ in range(rows)])
    first = tokens[torch.arange(rows) % tokens.shape[0], 0][:, None]
    out = torch.cat([first, ids, ids], 1)
    words = (
        f"repeated random tokens ({rows} rows of 2 x {half}, seed {seed}): the evaluation"
        f" rows hold too few repeats ({int((per_row >= REPEATS_PER_ROW).sum())} with"
        f" {REPEATS_PER_ROW} or more)"
    )
    return out, words


# -- the table ---------------------------------------------------------------------------
AGGREGATES: tuple[Aggregate, ...] = (
    Aggregate(
        "zbar",
        "pairs",
        "mean attention logit (score) of query m on context token l",
        "the (T, t) position pairs with x_T = m, x_t = l, t in the context of T",
        optional=False,
        reads="scores",
        gather=lambda g: (g.batch.pair_slot, g.scores),
        count=lambda plan: plan.pair_count,
    ),
    Aggregate(
        "c_hat",
        "triples",
        "the paper's c-hat: per event of class (m, n), the weights on l's context positions,"
        " renormalised over the context, summed",
        "the events N(m, n) of the class",
        key="chat",  # the name files have held since the first version
        optional=False,
        gather=lambda g: (
            g.batch.triple_slot,
            g.weights if g.batch.all_tracked else g.weights_at(g.batch.c_hat_pairs),
        ),
        count=lambda plan: plan.class_events[plan.triple_class],
    ),
    Aggregate(
        "entropy",
        "classes",
        "entropy (nats) of the context weights, renormalised, per event of the class",
        "the events N(m, n) of the class",
        optional=False,
        gather=lambda g: (
            g.batch.tracked_class,
            g.entropy[g.batch.tracked_events],
        ),
        count=lambda plan: plan.class_events,
    ),
    Aggregate(
        "query_entropy",
        "queries",
        "entropy (nats) of the context weights, renormalised, per event of the query",
        "the events of the query",
        optional=False,
        gather=lambda g: (g.batch.event_query, g.entropy),
        count=lambda plan: plan.query_events,
    ),
    Aggregate(
        "previous_token",
        "rows",
        "attention weight on the previous position, A[q, q - 1], q >= 2",
        positions=previous_token_positions,
    ),
    Aggregate(
        "first_token",
        "rows",
        "attention weight on position 0 (the sink), A[q, 0], q >= 1",
        positions=first_token_positions,
    ),
    Aggregate(
        "induction",
        "rows",
        "attention weight on the position after the most recent earlier occurrence of the"
        " query's token, A[q, s + 1] (s + 1 < q - 1)",
        positions=induction_positions,
        own_rows=repeated_random_rows,
    ),
)
_BY_NAME = {a.name: a for a in AGGREGATES}
DEFAULT = AGGREGATES  # what a recording records unless told otherwise
V1 = tuple(a for a in AGGREGATES if not a.optional)  # what every folder holds


def aggregate_named(name: str) -> Aggregate:
    """The entry of `AGGREGATES` called `name`."""
    if name not in _BY_NAME:
        raise KeyError(f"no aggregate {name!r}: {[a.name for a in AGGREGATES]}")
    return _BY_NAME[name]


def resolve(aggregates: Sequence[Aggregate | str] | None) -> tuple[Aggregate, ...]:
    """Aggregates from objects or built-in names (None: `DEFAULT`); ValueError naming a name
    given twice or a key that two share."""
    if aggregates is None:
        return DEFAULT
    out = tuple(a if isinstance(a, Aggregate) else aggregate_named(a) for a in aggregates)
    for what in ("name", "key"):
        seen = [getattr(a, what) for a in out]
        twice = sorted({v for v in seen if seen.count(v) > 1})
        if twice:
            raise ValueError(f"aggregates {twice} are given twice (each {what} once)")
    reserved = {"prompt_pattern"} & {a.key for a in out} | {"prompt_pattern"} & {
        a.name for a in out
    }
    if reserved:
        raise ValueError("'prompt_pattern' is the example prompt's tensor: name it otherwise")
    if not out:
        raise ValueError("a recording needs at least one aggregate")
    return out
