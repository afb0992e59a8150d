"""Statistics on a local Ray instance (2 CPUs, no dashboard): identical to one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scansnap_lens.cli import main
from scansnap_lens.corpus import CooccurrenceStats, cooccurrence
from scansnap_lens.text import encode_documents, wikitext_documents, word_level_tokenizer

ray = pytest.importorskip("ray")

FIELDS = ("query", "next_token", "events", "offsets", "token", "count")


@pytest.fixture(scope="module")
def local_ray():
    from scansnap_lens.distributed import connect

    started = not ray.is_initialized()
    connect(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


def assert_identical(a: CooccurrenceStats, b: CooccurrenceStats) -> None:
    a, b = a.canonical(), b.canonical()
    for name in FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.fingerprint, a.num_tokens, a.num_rows) == (b.fingerprint, b.num_tokens, b.num_rows)


def test_sharded_wikitext_equals_one_process(local_ray, shared_dir):
    from scansnap_lens.distributed import ray_cooccurrence, row_shards

    docs = wikitext_documents(shared_dir / "data" / "wikitext-2" / "test.txt")[:60]
    tok = word_level_tokenizer(docs)
    rows = encode_documents(tok, docs)
    V = tok.get_vocab_size()
    one = cooccurrence(rows, V, window=32, min_count=2)
    for shards, arity in ((5, 2), (3, 3)):  # uneven shards, a merge tree of 2 and of 3
        many = ray_cooccurrence(row_shards(rows, shards), V, window=32, min_count=2,
                                merge_arity=arity)  # fmt: skip
        assert_identical(one, many)


def test_ray_stats_on_an_indexed_corpus_through_the_command_line(local_ray, tmp_path):
    """`scansnap stats data.bin --ray`: the workers read their own ranges of documents."""
    from scansnap_lens.indexed import IndexedTokens

    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    g = np.random.default_rng(0)
    docs = [g.integers(0, 50, size=g.integers(3, 40)) for _ in range(50)]
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    builder.finalize(str(tmp_path / "d.idx"))
    assert IndexedTokens(tmp_path / "d").num_documents == 50
    for extra in ([], ["--ray", "--shards", "4"]):
        out = tmp_path / f"s{len(extra)}.safetensors"
        args = ["stats", str(tmp_path / "d.bin"), "--out", str(out), "--window", "8"]
        assert main([*args, "--vocab-size", "50", *extra]) == 0
    assert_identical(
        CooccurrenceStats.load(tmp_path / "s0.safetensors"),
        CooccurrenceStats.load(tmp_path / "s3.safetensors"),
    )
    assert_identical(cooccurrence(docs, 50, window=8),
                     CooccurrenceStats.load(tmp_path / "s3.safetensors"))  # fmt: skip
