"""Pythia's pre-tokenized data format (.bin + .idx), read lazily, against files written by an
independent implementation (megatron-core's IndexedDatasetBuilder)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from scansnap_lens.cli import main
from scansnap_lens.inputs.indexed import IndexedTokens
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence

with warnings.catch_warnings():  # megatron warns that Apex and Transformer Engine are absent
    warnings.simplefilter("ignore")
    indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")


def write(prefix, documents, dtype=np.uint16):
    """Each document as megatron writes it: one or several sequences."""
    builder = indexed_dataset.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for parts in documents:
        tokens = np.concatenate(parts)
        builder.add_document(torch.from_numpy(tokens.astype(np.int64)), [len(p) for p in parts])
    builder.finalize(f"{prefix}.idx")
    return prefix


@pytest.fixture
def corpus(tmp_path):
    g = np.random.default_rng(0)
    documents = [
        [g.integers(0, 60, size=g.integers(3, 30)) for _ in range(g.integers(1, 4))]
        for _ in range(40)
    ]
    return write(tmp_path / "document", documents), documents


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_reads_what_megatron_wrote(dtype, tmp_path):
    g = np.random.default_rng(1)
    documents = [[g.integers(0, 30_000, size=n)] for n in (5, 1, 17)] + [
        [g.integers(0, 30_000, size=4), g.integers(0, 30_000, size=9)]
    ]
    data = IndexedTokens(write(tmp_path / f"d_{np.dtype(dtype).name}", documents, dtype))
    assert data.dtype == np.dtype(dtype)
    assert (data.num_documents, data.num_sequences, data.num_tokens) == (4, 5, 36)
    for got, parts in zip(data.documents(), documents, strict=True):
        assert got.dtype == np.int64 and np.array_equal(got, np.concatenate(parts))
    # a shard is a range of documents; either file's name works
    shard = list(IndexedTokens(f"{tmp_path}/d_{np.dtype(dtype).name}.bin").documents(1, 3))
    assert [len(d) for d in shard] == [1, 17]


def test_statistics_of_the_indexed_corpus_equal_those_of_its_documents(corpus, tmp_path):
    prefix, documents = corpus
    rows = [np.concatenate(parts) for parts in documents]
    expected = cooccurrence(rows, vocab_size=64, window=8)
    lazy = cooccurrence(IndexedTokens(prefix).batches(documents_per_batch=7), 64, window=8)
    assert lazy.canonical().to_dataframe().equals(expected.canonical().to_dataframe())
    out = tmp_path / "s.safetensors"
    args = ["stats", f"{prefix}.bin", "--out", str(out), "--window", "8", "--vocab-size", "64"]
    assert main(args) == 0
    saved = CooccurrenceStats.load(out)
    assert saved.canonical().to_dataframe().equals(expected.canonical().to_dataframe())
    assert saved.num_tokens == expected.num_tokens and saved.num_rows == len(rows)


def test_damaged_files_are_named(corpus, tmp_path, capsys):
    prefix, _ = corpus
    idx = f"{prefix}.idx"
    original = open(idx, "rb").read()
    open(idx, "wb").write(b"NOTANIDX" + original[8:])
    with pytest.raises(ValueError, match="no MMIDIDX header"):
        IndexedTokens(prefix)
    open(idx, "wb").write(original[:-16])
    with pytest.raises(ValueError, match="truncated"):
        IndexedTokens(prefix)
    open(idx, "wb").write(original)
    binary = open(f"{prefix}.bin", "rb").read()
    open(f"{prefix}.bin", "wb").write(binary[:-10])
    with pytest.raises(ValueError, match="shorter than its index"):
        IndexedTokens(prefix)
    assert main(["stats", f"{tmp_path}/missing.bin", "--out", str(tmp_path / "s")]) == 2
    assert "no .idx file at" in capsys.readouterr().err
