"""Corpus statistics on Ray: shards counted as tasks with the same kernel, merged in a tree.

    pip install "scansnap-lens[ray]"

    shards = indexed_shards("pile/document", num_shards=64)      # ranges of documents
    stats = ray_cooccurrence(shards, vocab_size=50304, window=64)  # a local Ray, or address=

Counts add (`CooccurrenceStats.__add__`), so the merged statistics equal those of one process
on the whole corpus (`canonical()` forms are identical; tested).  Each worker holds one
shard's statistics; pruning (`min_count`) runs once, after the last merge, as it must.  Shards
are small callables that read their own data (a range of an indexed dataset, or rows put in
Ray's object store), so a worker never receives the corpus through the driver.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from tqdm.auto import tqdm

from .corpus import CooccurrenceStats, cooccurrence

__all__ = ["indexed_shards", "ray_cooccurrence", "row_shards"]


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "Ray is not installed: pip install 'scansnap-lens[ray]' (or pip install ray)"
        ) from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None):
    """Ray, initialised: the running instance, the cluster at `address`, or a local one."""
    ray = _ray()
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


def _read_indexed(prefix: str, start: int, stop: int):
    from .indexed import IndexedTokens

    return IndexedTokens(prefix).batches(start, stop)


def indexed_shards(prefix, num_shards: int) -> list[Callable]:
    """`num_shards` ranges of documents of an indexed dataset (``.bin`` + ``.idx``), each read
    by the worker that counts it (the files must be visible to every worker)."""
    from .indexed import IndexedTokens

    data = IndexedTokens(prefix)
    edges = np.linspace(0, data.num_documents, max(1, num_shards) + 1).round().astype(int)
    return [
        partial(_read_indexed, str(data.idx_path.with_suffix("")), int(a), int(b))
        for a, b in itertools.pairwise(edges)
        if b > a
    ]


def _get_rows(ref):
    return _ray().get(ref)


def row_shards(rows: Sequence, num_shards: int, address: str | None = None) -> list[Callable]:
    """Rows (1-D id arrays or a [N, T] tensor) cut into `num_shards` consecutive parts, each
    put once into Ray's object store."""
    ray = connect(address)
    rows = list(rows)
    edges = np.linspace(0, len(rows), max(1, num_shards) + 1).round().astype(int)
    return [
        partial(_get_rows, ray.put([np.asarray(r) for r in rows[a:b]]))
        for a, b in itertools.pairwise(edges)
        if b > a
    ]


def _count(shard: Callable, vocab_size: int, options: dict) -> CooccurrenceStats:
    return cooccurrence(shard(), vocab_size, **options)


def _merge(*parts: CooccurrenceStats) -> CooccurrenceStats:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def ray_cooccurrence(
    shards: Sequence[Callable],
    vocab_size: int,
    window: int | None = None,
    exclude_bos: bool = False,
    queries=None,
    next_tokens=None,
    min_count: int = 1,
    address: str | None = None,
    num_cpus: int | None = None,
    merge_arity: int = 2,
    progress: bool = False,
) -> CooccurrenceStats:
    """`corpus.cooccurrence` of the shards' rows, one Ray task per shard, merged in a tree of
    `merge_arity`.  `address`: a Ray cluster (default: the running instance, else a local one
    with `num_cpus`)."""
    if not shards:
        raise ValueError("no shard to count")
    if merge_arity < 2:
        raise ValueError(f"merge_arity must be >= 2, got {merge_arity}")
    ray = connect(address, num_cpus)
    options = {"window": window, "exclude_bos": exclude_bos, "queries": queries,
               "next_tokens": next_tokens, "num_proc": 1}  # fmt: skip
    count = ray.remote(_count)
    merge = ray.remote(_merge)
    level = [count.remote(shard, vocab_size, options) for shard in shards]
    bar = tqdm(total=len(level), desc="shards", unit="shard", disable=not progress)
    pending = list(level)
    while pending:  # progress as shards finish, in any order
        done, pending = ray.wait(pending, num_returns=1)
        bar.update(len(done))
    bar.close()
    while len(level) > 1:
        level = [
            merge.remote(*level[i : i + merge_arity]) for i in range(0, len(level), merge_arity)
        ]
    stats = ray.get(level[0])
    return stats.prune(min_count) if min_count > 1 else stats
