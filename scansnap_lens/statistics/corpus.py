"""Co-occurrence statistics of a corpus: N(m, n), C(m, n, l) and P(l | m, n).

An *event* at position T of a row needs a context token and a next token: query m = x_T,
next n = x_{T+1}, context x_t for max(first, T - W) <= t <= T - 1, where ``first`` is the row's
first position, or its second when the BOS position is excluded.  Events never cross rows, so
a row is a document (rows may have different lengths).

    N(m, n)    = number of events with (x_T, x_{T+1}) = (m, n)       -> ``events``
    C(m, n, l) = occurrences of l in the contexts of those events   -> ``count``

Storage is sparse: one entry per class (m, n) seen and per distinct triple (m, n, l), in CSR
form (``offsets`` into ``token`` / ``count``), never a dense [V, V, V] or [V * V, V] array.
Counts add, so statistics of shards merge with ``+`` into those of the concatenated corpus.
`count_corpus` counts a corpus however it is given (`inputs.corpus.Corpus`) in one process or
in parts (Ray); `cooccurrence` is its kernel over rows in memory or batches.

>>> rows = torch.tensor([[0, 1, 2, 1, 3], [2, 2, 1, 3, 0]])
>>> stats = cooccurrence(rows, vocab_size=4, window=2)
>>> stats.events_of(1, 3), stats.context_counts(1, 3)
(2, (tensor([1, 2]), tensor([1, 3])))
>>> (stats + stats).events_of(1, 3)
4
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numba
import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import make_folder, read_tensors, write_tensors
from scansnap_lens.statistics._counting import (
    distinct_per_class,
    fill_triples,
    find_events,
    merge_triples,
)
from scansnap_lens.statistics.context import Context

if TYPE_CHECKING:
    from scansnap_lens.inputs.corpus import Corpus

__all__ = ["CooccurrenceStats", "cooccurrence", "count_corpus", "rows_fingerprint"]

FORMAT = "scansnap_lens.CooccurrenceStats/1"
_MASK64 = (1 << 64) - 1


@dataclass
class CooccurrenceStats:
    """Sparse co-occurrence counts; build with `count_corpus` (or its kernel `cooccurrence`).

    Attributes:
        vocab_size: V, token ids lie in [0, V).
        window: W, the most context positions before the query (0: the whole row).
        exclude_bos: whether the first position of each row was kept out of the context.
        query, next_token, events: [K] the classes (m, n), sorted, and N(m, n).
        offsets: [K + 1] where the triples of each class start in ``token`` / ``count``.
        token, count: [Pc] context token l and C(m, n, l); within a class the tokens come in
            order of first occurrence (``canonical()`` sorts them).
        num_tokens, num_rows: size of the corpus counted.
        fingerprint: order-free hash of the rows (merging combines it like the counts).
        tracked_queries, tracked_next: the subsets tracked, or None for all tokens.
        tokenizer: name of the tokenizer, if known.
        min_count: triples with a count below this were pruned (1: nothing pruned).
    """

    vocab_size: int
    window: int
    exclude_bos: bool
    query: Tensor
    next_token: Tensor
    events: Tensor
    offsets: Tensor
    token: Tensor
    count: Tensor
    num_tokens: int = 0
    num_rows: int = 0
    fingerprint: str = "0" * 16
    tracked_queries: Tensor | None = None
    tracked_next: Tensor | None = None
    tokenizer: str | None = None
    min_count: int = 1
    _index: dict[tuple[int, int], int] | None = field(default=None, repr=False, compare=False)
    # {Classification: TokenGroups} of these statistics, each made once (`from_statistics`),
    # and the lock a caller takes to make or read one (one may be made in the background)
    _groups: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _groups_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def __reduce__(self):
        """Pickled as numpy arrays: Ray's object store then hands them to the next task
        without a copy (pickle protocol 5 buffers), where torch tensors would be copied."""
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("_index", "_groups", "_groups_lock")
        }
        arrays = {k: v.numpy() for k, v in values.items() if isinstance(v, Tensor)}
        return _from_arrays, ({k: v for k, v in values.items() if k not in arrays}, arrays)

    # ----------------------------------------------------------------- accessors
    @property
    def num_classes(self) -> int:
        return int(self.query.numel())

    @property
    def context(self) -> Context:
        """The context convention these statistics were counted with."""
        return Context(window=self.window or None, exclude_bos=bool(self.exclude_bos))

    @property
    def num_triples(self) -> int:
        return int(self.token.numel())

    @property
    def triple_class(self) -> Tensor:
        """[Pc] the class index of every triple."""
        return torch.repeat_interleave(torch.arange(self.num_classes), torch.diff(self.offsets))

    @property
    def total_context(self) -> Tensor:
        """[K] sum over l of C(m, n, l): the context positions counted for each class."""
        return torch.zeros(self.num_classes, dtype=torch.long).index_add_(
            0, self.triple_class, self.count
        )

    def class_index(self, query: int, next_token: int) -> int:
        """Index of class (m, n); KeyError if it never occurs."""
        if self._index is None:
            self._index = {
                (m, n): i
                for i, (m, n) in enumerate(zip(self.query.tolist(), self.next_token.tolist()))
            }
        try:
            return self._index[(int(query), int(next_token))]
        except KeyError:
            raise KeyError(f"class (query={query}, next={next_token}) does not occur") from None

    def events_of(self, query: int, next_token: int) -> int:
        """N(m, n)."""
        return int(self.events[self.class_index(query, next_token)])

    def context_counts(self, query: int, next_token: int) -> tuple[Tensor, Tensor]:
        """(tokens l, C(m, n, l)) of one class."""
        i = self.class_index(query, next_token)
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.token[lo:hi], self.count[lo:hi]

    def p_context(self, query: int, next_token: int, dense: bool = False):
        """P(l | m, n): (tokens, probabilities), or a dense [V] tensor with ``dense=True``."""
        tokens, counts = self.context_counts(query, next_token)
        probs = counts.double() / counts.sum()
        if not dense:
            return tokens, probs
        return torch.zeros(self.vocab_size, dtype=torch.float64).index_put_((tokens,), probs)

    def classes(self) -> pd.DataFrame:
        """One row per class (m, n): events N(m, n), context positions and distinct tokens."""
        return pd.DataFrame(
            {
                "query": self.query.numpy(),
                "next": self.next_token.numpy(),
                "events": self.events.numpy(),
                "context": self.total_context.numpy(),
                "distinct_context_tokens": torch.diff(self.offsets).numpy(),
            }
        )

    def next_tokens_of(self, query: int) -> tuple[Tensor, Tensor]:
        """(next tokens n, N(m, n)) of query m, most frequent first."""
        rows = (self.query == int(query)).nonzero().flatten()
        order = self.events[rows].argsort(descending=True, stable=True)
        return self.next_token[rows[order]], self.events[rows[order]]

    def top_next(self, query: int, k: int = 10) -> tuple[Tensor, Tensor]:
        """The ``k`` most frequent next tokens of query m and their counts."""
        tokens, counts = self.next_tokens_of(query)
        return tokens[:k], counts[:k]

    def query_counts(self) -> tuple[Tensor, Tensor]:
        """(query tokens m, number of events), most frequent first."""
        ids, inverse = self.query.unique(return_inverse=True)
        totals = torch.zeros(ids.numel(), dtype=torch.long).index_add_(0, inverse, self.events)
        order = totals.argsort(descending=True, stable=True)
        return ids[order], totals[order]

    def to_dataframe(self, decode=None) -> pd.DataFrame:
        """Long form: one row per triple (query, next, token, count, events, p)."""
        cls = self.triple_class
        total = self.total_context[cls]
        frame = pd.DataFrame(
            {
                "query": self.query[cls].numpy(),
                "next": self.next_token[cls].numpy(),
                "token": self.token.numpy(),
                "count": self.count.numpy(),
                "events": self.events[cls].numpy(),
                "p": (self.count.double() / total).numpy(),
            }
        )
        if decode is not None:
            for col in ("query", "next", "token"):
                frame[f"{col}_str"] = [decode(int(i)) for i in frame[col]]
        return frame

    def canonical(self) -> CooccurrenceStats:
        """The same statistics with the tokens of every class in ascending order."""
        order = torch.from_numpy(np.lexsort((self.token.numpy(), self.triple_class.numpy())))
        return replace(self, token=self.token[order], count=self.count[order], _index=None)

    def __repr__(self) -> str:
        return (
            f"CooccurrenceStats({int(self.events.sum()):,} events, {self.num_classes:,} classes"
            f" (m, n), {self.num_triples:,} co-occurrences, V={self.vocab_size},"
            f" window={self.window or None}, tokenizer={self.tokenizer!r})"
        )

    # ----------------------------------------------------------------- algebra
    def _check_compatible(self, other: CooccurrenceStats) -> None:
        if not isinstance(other, CooccurrenceStats):
            raise TypeError(f"cannot merge statistics with {type(other).__name__}")
        for name in ("vocab_size", "window", "exclude_bos"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                raise ValueError(f"cannot merge statistics with different {name}: {a} != {b}")
        for name in ("tracked_queries", "tracked_next"):
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                raise ValueError(f"cannot merge statistics with different {name}")
        if self.min_count != 1 or other.min_count != 1:
            raise ValueError("cannot merge pruned statistics: merge first, then prune")

    def __add__(self, other: CooccurrenceStats) -> CooccurrenceStats:
        """The statistics of both corpora: counts add, class by class, in one linear pass."""
        self._check_compatible(other)
        V = self.vocab_size
        a_keys = (self.query * V + self.next_token).numpy()
        b_keys = (other.query * V + other.next_token).numpy()
        keys = np.union1d(a_keys, b_keys)  # classes stay sorted by (m, n)
        in_a, in_b = _positions(a_keys, keys), _positions(b_keys, keys)
        events = np.zeros(len(keys), np.int64)
        events[in_a >= 0] += self.events.numpy()[in_a[in_a >= 0]]
        events[in_b >= 0] += other.events.numpy()[in_b[in_b >= 0]]
        offsets, token, count = merge_triples(
            in_a,
            in_b,
            self.offsets.numpy(),
            self.token.numpy(),
            self.count.numpy(),
            other.offsets.numpy(),
            other.token.numpy(),
            other.count.numpy(),
            V,
            4 * numba.get_num_threads(),
        )
        fingerprint = (int(self.fingerprint, 16) + int(other.fingerprint, 16)) & _MASK64
        return replace(
            self,
            query=torch.from_numpy(keys // V),
            next_token=torch.from_numpy(keys % V),
            events=torch.from_numpy(events),
            offsets=torch.from_numpy(offsets),
            token=torch.from_numpy(token),
            count=torch.from_numpy(count),
            num_tokens=self.num_tokens + other.num_tokens,
            num_rows=self.num_rows + other.num_rows,
            fingerprint=f"{fingerprint:016x}",
            tokenizer=self.tokenizer or other.tokenizer,
            _index=None,
        )

    def prune(self, min_count: int) -> CooccurrenceStats:
        """Drop triples with C(m, n, l) < ``min_count`` (N(m, n) is kept)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        keep = self.count >= min_count
        if self.count.numel() and not keep.any():
            raise ValueError(
                f"min_count {min_count} prunes every co-occurrence (the most frequent is counted"
                f" {int(self.count.max())} times): give a smaller min_count="
            )
        per_class = torch.zeros(self.num_classes, dtype=torch.long).index_add_(
            0, self.triple_class, keep.long()
        )
        return replace(
            self,
            offsets=torch.cat([torch.zeros(1, dtype=torch.long), per_class.cumsum(0)]),
            token=self.token[keep],
            count=self.count[keep],
            min_count=max(min_count, self.min_count),
            _index=None,
        )

    # ----------------------------------------------------------------- files
    def save(self, path: str | Path) -> Path:
        """Write a safetensors file with the tensors and JSON metadata."""
        path = Path(path)
        make_folder(path.parent)
        tensors = {
            name: getattr(self, name).contiguous()
            for name in ("query", "next_token", "events", "offsets", "token", "count")
        }
        for name in ("tracked_queries", "tracked_next"):
            if getattr(self, name) is not None:
                tensors[name] = getattr(self, name).contiguous()
        meta = {
            "vocab_size": self.vocab_size,
            "window": self.window,
            "exclude_bos": self.exclude_bos,
            "num_tokens": self.num_tokens,
            "num_rows": self.num_rows,
            "fingerprint": self.fingerprint,
            "tokenizer": self.tokenizer,
            "min_count": self.min_count,
        }
        return write_tensors(path, tensors, {"format": FORMAT, "meta": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path) -> CooccurrenceStats:
        header, tensors = read_tensors(path, FORMAT, "statistics file")
        meta = _checked(path, header, tensors)
        return cls(
            query=tensors["query"],
            next_token=tensors["next_token"],
            events=tensors["events"],
            offsets=tensors["offsets"],
            token=tensors["token"],
            count=tensors["count"],
            tracked_queries=tensors.get("tracked_queries"),
            tracked_next=tensors.get("tracked_next"),
            **meta,
        )


_META_TYPES = {
    "vocab_size": int,
    "window": int,
    "exclude_bos": bool,
    "num_tokens": int,
    "num_rows": int,
    "fingerprint": str,
    "min_count": int,
}


def _checked(path, header: dict, tensors: dict) -> dict:
    """The metadata of a statistics file, after checking that its tensors agree with each other
    (a hand-edited or foreign file is refused with what is wrong, before any kernel indexes
    past an array)."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{path} is not a valid statistics file: {why}")

    try:
        meta = json.loads(header.get("meta", ""))
    except json.JSONDecodeError:
        raise bad("its metadata is not JSON") from None
    if not isinstance(meta, dict):
        raise bad("its metadata is not a JSON object")
    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise bad(f"{key} must be {kind.__name__}, got {meta[key]!r}")
    if "vocab_size" not in meta:
        raise bad("its metadata lacks vocab_size")
    unknown = set(meta) - {*_META_TYPES, "tokenizer"}
    if unknown:
        raise bad(f"unknown metadata {sorted(unknown)}")
    names = ("query", "next_token", "events", "offsets", "token", "count")
    missing = [n for n in names if n not in tensors]
    if missing:
        raise bad(f"it lacks the tensors {missing}")
    for name in (*names, "tracked_queries", "tracked_next"):
        t = tensors.get(name)
        if t is not None and (t.dtype != torch.int64 or t.ndim != 1):
            raise bad(f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    C, P, V = tensors["query"].numel(), tensors["token"].numel(), meta["vocab_size"]
    offsets = tensors["offsets"]
    if tensors["next_token"].numel() != C or tensors["events"].numel() != C:
        raise bad("query, next_token and events differ in length")
    if tensors["count"].numel() != P:
        raise bad("token and count differ in length")
    if offsets.numel() != C + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != P:
        raise bad(f"offsets must run from 0 to {P} over {C} classes")
    if (torch.diff(offsets) < 0).any():
        raise bad("offsets decrease")
    for name in ("query", "next_token", "token"):
        t = tensors[name]
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
            raise bad(f"{name} ids lie outside [0, vocab_size={V})")
    if (tensors["count"] < 0).any() or (tensors["events"] < 0).any():
        raise bad("negative counts")
    return meta


# --------------------------------------------------------------------- building
def _as_rows(tokens) -> list[np.ndarray]:
    if isinstance(tokens, Tensor):
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ValueError(f"token tensor must be [batch, seq], got shape {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {tokens.dtype}")
        return list(tokens.cpu().numpy().astype(np.int64, copy=False))
    if isinstance(tokens, np.ndarray) and tokens.ndim == 2:
        return list(tokens.astype(np.int64, copy=False))
    return [np.asarray(row, dtype=np.int64).ravel() for row in tokens]


def _is_row(x) -> bool:
    if isinstance(x, Tensor | np.ndarray):
        return x.ndim == 1
    return isinstance(x, list | tuple) and all(np.isscalar(v) for v in x[:1])


def rows_fingerprint(rows: Sequence[np.ndarray]) -> int:
    """The order-free fingerprint of token rows (a sum of each row's hash): what statistics
    and plans compare to know they were made from the same text."""
    total = 0
    for row in rows:
        digest = hashlib.blake2b(np.ascontiguousarray(row).tobytes(), digest_size=8).digest()
        total = (total + int.from_bytes(digest, "little")) & _MASK64
    return total


def _mask(ids, vocab_size: int, name: str) -> tuple[np.ndarray, Tensor | None]:
    if ids is None:
        return np.ones(vocab_size, np.bool_), None
    ids = torch.as_tensor(list(ids) if not isinstance(ids, Tensor) else ids, dtype=torch.long)
    ids = ids.flatten().unique()
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size})")
    mask = np.zeros(vocab_size, np.bool_)
    mask[ids.numpy()] = True
    return mask, ids


def _count_rows(
    rows: list[np.ndarray],
    vocab_size: int,
    window: int,
    exclude_bos: bool,
    masks: tuple[np.ndarray, np.ndarray],
    num_proc: int,
) -> CooccurrenceStats:
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    flat = np.concatenate(rows) if rows else np.empty(0, np.int64)
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            row = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(flat == bad)), "right"))
            raise ValueError(
                f"token id {bad} (row {row}) is outside the vocabulary [0, {vocab_size})"
            )
    flat = flat.astype(np.int32 if vocab_size < 2**31 else np.int64)
    row_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    positions, starts = find_events(flat, row_starts, window, int(exclude_bos), *masks)
    classes = flat[positions].astype(np.int64) * vocab_size + flat[positions + 1]
    order = np.argsort(classes, kind="stable")
    positions, starts, classes = positions[order], starts[order], classes[order]
    keys, first, events = np.unique(classes, return_index=True, return_counts=True)
    bounds = np.append(first, len(classes)).astype(np.int64)
    blocks = max(1, min(len(keys), 8 * num_proc))
    previous = numba.get_num_threads()
    numba.set_num_threads(max(1, min(num_proc, numba.config.NUMBA_NUM_THREADS)))
    try:
        distinct = distinct_per_class(flat, positions, starts, bounds, vocab_size, blocks)
        offsets = np.concatenate([[0], np.cumsum(distinct)]).astype(np.int64)
        token, count = fill_triples(flat, positions, starts, bounds, vocab_size, blocks, offsets)
    finally:
        numba.set_num_threads(previous)
    return CooccurrenceStats(
        vocab_size=vocab_size,
        window=window,
        exclude_bos=exclude_bos,
        query=torch.from_numpy(keys // vocab_size),
        next_token=torch.from_numpy(keys % vocab_size),
        events=torch.from_numpy(events.astype(np.int64)),
        offsets=torch.from_numpy(offsets),
        token=torch.from_numpy(token.astype(np.int64)),
        count=torch.from_numpy(count),
        num_tokens=int(lengths.sum()),
        num_rows=len(rows),
        fingerprint=f"{rows_fingerprint(rows):016x}",
    )


def _from_arrays(values: dict, arrays: dict) -> CooccurrenceStats:
    import warnings

    with warnings.catch_warnings():  # a read-only buffer of Ray's store: never written to
        warnings.simplefilter("ignore", UserWarning)
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return CooccurrenceStats(**values, **tensors)


def _positions(keys: np.ndarray, union: np.ndarray) -> np.ndarray:
    """[K] the index of each of `union`'s keys in the sorted `keys`, -1 where absent."""
    if len(keys) == 0:
        return np.full(len(union), -1, np.int64)
    at = np.searchsorted(keys, union).clip(max=len(keys) - 1)
    return np.where(keys[at] == union, at, -1).astype(np.int64)


def cooccurrence(
    tokens: Tensor | np.ndarray | Iterable,
    vocab_size: int | None = None,
    window: int | None = None,
    exclude_bos: bool = False,
    queries: Iterable[int] | Tensor | None = None,
    next_tokens: Iterable[int] | Tensor | None = None,
    min_count: int = 1,
    num_proc: int | None = None,
    tokenizer: str | None = None,
    chunk_tokens: int = 4_000_000,
    progress: bool = False,
    context: Context | None = None,
) -> CooccurrenceStats:
    """Count events and co-occurrences.

    Args:
        tokens: a LongTensor [batch, seq] of rows, a list of 1-D rows (documents of any length),
            or an iterable of such batches (counted chunk by chunk and merged).
        vocab_size: V; default 1 + the largest id (required for an iterable of batches).
        window: W >= 1, the most context positions before the query; None: the whole row.
        exclude_bos: keep the first position of every row out of the context.
        queries, next_tokens: count only events whose query / next token is in these sets.
        min_count: prune triples counted fewer times (after counting everything).
        num_proc: threads for the counting kernel (default: all cores).
        chunk_tokens: batches are gathered into chunks of about this many tokens.
        context: the window and position-0 convention as one value (`Context`), instead of
            `window` and `exclude_bos`.
    """
    context = Context.given(context, window, exclude_bos)
    window, exclude_bos = context.window, context.exclude_bos
    if window is not None and window < 1:
        raise ValueError(f"window W must be >= 1 (or None for the whole row), got {window}")
    if vocab_size is not None and (
        isinstance(vocab_size, bool)
        or not isinstance(vocab_size, int | np.integer)
        or vocab_size < 1
    ):
        raise ValueError(f"vocab_size must be a positive integer (or None), got {vocab_size!r}")
    num_proc = num_proc or numba.config.NUMBA_NUM_THREADS
    if isinstance(tokens, Tensor) and tokens.ndim == 2:
        need = 3 + int(exclude_bos)
        if tokens.shape[1] < need:
            raise ValueError(
                f"rows of length {tokens.shape[1]} are too short to hold an event"
                f" (need >= {need}: context, query and next token)"
            )
    if isinstance(tokens, Tensor | np.ndarray) or (
        isinstance(tokens, list | tuple) and all(_is_row(r) for r in tokens)
    ):
        chunks: Iterable = [_as_rows(tokens)]
    else:
        if vocab_size is None:
            raise ValueError("vocab_size is required when counting an iterable of batches")
        chunks = _chunked(tokens, chunk_tokens)
    stats = None
    for rows in tqdm(chunks, desc="co-occurrence", unit="chunk", disable=not progress):
        if not rows:
            continue
        if vocab_size is None:
            vocab_size = int(max((int(r.max()) for r in rows if r.size), default=-1) + 1)
        masks = (
            _mask(queries, vocab_size, "queries"),
            _mask(next_tokens, vocab_size, "next_tokens"),
        )
        part = _count_rows(
            rows, vocab_size, window or 0, exclude_bos, (masks[0][0], masks[1][0]), num_proc
        )
        part.tracked_queries, part.tracked_next = masks[0][1], masks[1][1]
        stats = part if stats is None else stats + part
    if stats is None or stats.num_tokens == 0:
        raise ValueError("empty corpus: no tokens to count")
    if stats.num_classes == 0:
        raise ValueError(
            "no event in the corpus: every row is too short (an event needs a context token,"
            " the query and the next token) or no query/next token is tracked"
        )
    stats.tokenizer = tokenizer
    return stats.prune(min_count) if min_count > 1 else stats


def _chunked(batches: Iterable, chunk_tokens: int):
    rows, size = [], 0
    for batch in batches:
        for row in _as_rows(batch):
            rows.append(row)
            size += len(row)
        if size >= chunk_tokens:
            yield rows
            rows, size = [], 0
    if rows:
        yield rows


# --------------------------------------------------------------------- the entry point
def count_corpus(
    corpus: Corpus | Tensor | Sequence,
    context: Context | None = None,
    *,
    queries: Iterable[int] | None = None,
    next_tokens: Iterable[int] | None = None,
    min_count: int = 1,
    execute: Callable | None = None,
    shards: int = 8,
    progress: bool = False,
) -> CooccurrenceStats:
    """The co-occurrence statistics of a corpus: the one way to count one.

    corpus: an `inputs.corpus.Corpus` (text, token files, indexed data, a ``datasets``
    dataset), or rows in memory.  context: the window and the position-0 convention
    (`Context`; default the whole row, BOS counted).  queries, next_tokens, min_count: see
    `cooccurrence`.  execute: how to count in parts, e.g. ``partial(distributed.
    ray_cooccurrence, address=...)``: called as ``execute(corpus.shards(shards), vocab_size,
    window=..., exclude_bos=..., queries=..., next_tokens=..., progress=...)`` and identical to
    counting in one process (default: here, in one process).

    >>> stats = count_corpus(torch.tensor([[0, 1, 2, 3]]), Context(window=2))
    >>> stats.num_classes, stats.num_triples, stats.context.window
    (2, 3, 2)
    """
    from scansnap_lens.inputs.corpus import Corpus

    context = context or Context()
    if context.include_self:
        raise ValueError("statistics never count the query's own position as its context")
    if not isinstance(corpus, Corpus):
        corpus = Corpus.of(rows=list(corpus))
    options = {
        "window": context.window,
        "exclude_bos": context.exclude_bos,
        "queries": queries,
        "next_tokens": next_tokens,
        "progress": progress,
    }
    if execute is None:
        rows, vocab_size = corpus.batches()
        stats = cooccurrence(rows, vocab_size, **options)
    else:
        vocab_size = corpus.vocab_size
        if vocab_size is None and corpus.kind == "indexed":  # 1 + its largest id
            vocab_size = corpus.batches()[1]
        if vocab_size is None:
            raise ValueError(
                "counting a dataset of token ids in parts needs its vocabulary size (vocab_size=)"
            )
        stats = execute(corpus.shards(shards), vocab_size, **options)
    stats.tokenizer = corpus.tokenizer_name
    return stats.prune(min_count) if min_count > 1 else stats
