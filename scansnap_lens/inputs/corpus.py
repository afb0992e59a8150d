"""A training corpus as users name it, read in one place: text files, token files, indexed
datasets (Pythia's ``.bin`` + ``.idx``) or a ``datasets`` dataset.

`Corpus.of` decides what the inputs are and reads nothing yet; `Corpus.batches` reads the
rows (lazily where the format allows) for one process, `Corpus.shards` cuts them into parts
that workers read themselves (each a picklable callable returning rows).  Counting is
`statistics.corpus.count_corpus`, with Ray as an execution option of it.

>>> corpus = Corpus.of(rows=[np.array([1, 2, 3, 4]), np.array([5, 6, 7])])
>>> corpus.kind, corpus.vocab_size, [len(r) for r in corpus.batches()[0]]
('rows', 8, [4, 3])
>>> [len(shard()) for shard in corpus.shards(2)]
[1, 1]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from scansnap_lens.inputs.tokens import TOKEN_SUFFIXES, TokenizerLike, codec, load_tokenizer

__all__ = ["Corpus", "dataset_batches"]

INDEXED_SUFFIXES = (".bin", ".idx")


@dataclass
class Corpus:
    """What `of` found: `kind` ("text", "tokens", "indexed", "dataset" or "rows"), the
    vocabulary size where known (given, the tokenizer's, or 1 + the largest id of rows in
    memory), and the tokenizer that encodes text (loaded from `tokenizer`, or a word-level one
    built from the text: `built_tokenizer`, which the caller may save)."""

    kind: str
    paths: list[Path] = field(default_factory=list)
    vocab_size: int | None = None
    tokenizer: object | None = None
    tokenizer_name: str | None = None
    built_tokenizer: bool = False
    dataset: str | None = None
    split: str = "train"
    column: str = "input_ids"
    text_column: str | None = None
    documents: str = "paragraph"
    rows: list | None = None  # rows in memory (text encoded, token files read, or given)

    @classmethod
    def of(
        cls,
        paths: Sequence[str | Path] = (),
        *,
        dataset: str | None = None,
        split: str = "train",
        column: str = "input_ids",
        text_column: str | None = None,
        tokenizer: str | None = None,
        documents: str = "paragraph",
        max_vocab: int | None = None,
        vocab_size: int | None = None,
        rows=None,
    ) -> Corpus:
        """The corpus of `paths` (text files, token files, or ``.bin``/``.idx`` indexed
        datasets, one kind at a time), of a ``datasets`` `dataset` (a ``save_to_disk``
        folder or a hub name: its token `column`, or its `text_column` encoded with
        `tokenizer`), or of `rows` in memory.  `tokenizer`: a tokenizer.json or a hub name
        for text (default: a word-level tokenizer of at most `max_vocab` words built from the
        text)."""
        given = sum(x is not None and x != () and x != [] for x in (paths, dataset, rows))
        if given != 1:
            raise ValueError(
                "give one corpus: files (text, token or indexed files), a dataset (dataset=),"
                " or rows in memory (rows=)"
            )
        if rows is not None:
            rows = [np.asarray(r, dtype=np.int64) for r in rows]
            top = max((int(r.max()) for r in rows if r.size), default=-1)
            return cls("rows", vocab_size=vocab_size or top + 1, rows=rows)
        if dataset is not None:
            if text_column and not tokenizer:
                raise ValueError("text_column= needs tokenizer=")
            tok = load_tokenizer(tokenizer) if text_column else None
            vocab = vocab_size or (None if tok is None else codec(tok).vocab_size)
            name = None if tokenizer is None else str(tokenizer)
            return cls(
                "dataset",
                vocab_size=vocab,
                tokenizer=tok,
                tokenizer_name=name,
                dataset=str(dataset),
                split=split,
                column=column,
                text_column=text_column,
            )
        paths = [Path(p) for p in paths]
        indexed = [p for p in paths if p.suffix in INDEXED_SUFFIXES]
        if indexed:
            if len(indexed) != len(paths):
                raise ValueError("give indexed datasets (.bin/.idx) on their own")
            prefixes = list(dict.fromkeys(p.with_suffix("") for p in indexed))  # a.bin, a.idx
            size, name = _named_tokenizer(tokenizer, vocab_size, 0)
            return cls("indexed", prefixes, vocab_size=size or None, tokenizer_name=name)
        files = [p for p in paths if str(p).endswith(TOKEN_SUFFIXES)]
        if files and len(files) != len(paths):
            raise ValueError("give either text files or token files, not both")
        if files:
            from scansnap_lens.inputs.tokens import read_tokens

            rows = [r.numpy() for f in files for r in read_tokens(f)]
            top = max((int(r.max()) for r in rows if r.size), default=-1)
            size, name = _named_tokenizer(tokenizer, vocab_size, top + 1)
            return cls("tokens", files, vocab_size=size, rows=rows, tokenizer_name=name)
        from scansnap_lens.inputs.text import read_documents, word_level_tokenizer
        from scansnap_lens.inputs.tokens import encode

        docs = [d for p in paths for d in read_documents(p, documents)]
        built = not tokenizer
        tok = (
            word_level_tokenizer(docs, max_vocab=max_vocab) if built else load_tokenizer(tokenizer)
        )
        return cls(
            "text",
            paths,
            vocab_size=vocab_size or codec(tok).vocab_size,
            tokenizer=tok,
            tokenizer_name=None if built else str(tokenizer),
            built_tokenizer=built,
            documents=documents,
            rows=encode(tok, docs),
        )

    def batches(self) -> tuple[Iterable, int | None]:
        """(the rows to count, as rows or an iterable of batches of rows; the vocabulary size,
        for an indexed dataset 1 + its largest id where none was given)."""
        if self.rows is not None:
            return self.rows, self.vocab_size
        if self.kind == "indexed":
            from scansnap_lens.inputs.indexed import IndexedTokens

            data = [IndexedTokens(p) for p in self.paths]
            vocab = self.vocab_size or max(d.max_id() for d in data) + 1
            return (batch for d in data for batch in d.batches()), vocab
        batches, _, _ = dataset_batches(
            open_dataset(self.dataset, self.split), self.column, self.text_column, self.tokenizer
        )
        return batches, self.vocab_size

    def shards(self, num_shards: int) -> list[Callable]:
        """About `num_shards` parts, each a picklable callable that reads its rows: ranges of
        documents of an indexed dataset or of a dataset's rows (read by the worker, so the
        files must be visible to every worker), or slices of rows in memory."""
        if self.rows is not None:
            edges = np.linspace(0, len(self.rows), max(1, num_shards) + 1).round().astype(int)
            return [partial(_given, self.rows[a:b]) for a, b in itertools.pairwise(edges) if b > a]
        if self.kind == "indexed":
            from scansnap_lens.inputs.indexed import IndexedTokens

            out = []
            for prefix in self.paths:
                n = IndexedTokens(prefix).num_documents
                edges = np.linspace(0, n, max(1, num_shards) + 1).round().astype(int)
                out += [
                    partial(_read_indexed, str(prefix), int(a), int(b))
                    for a, b in itertools.pairwise(edges)
                    if b > a
                ]
            return out
        data = open_dataset(self.dataset, self.split)  # fail here, not in every worker
        if num_shards > len(data):
            raise ValueError(f"{self.dataset} has {len(data)} rows: fewer than {num_shards} shards")
        return [
            partial(
                _read_dataset,
                self.dataset,
                self.split,
                self.column,
                self.text_column,
                self.tokenizer_name,
                num_shards,
                i,
            )
            for i in range(num_shards)
        ]


def _given(rows: list) -> list:
    return rows


def _read_indexed(prefix: str, start: int, stop: int):
    from scansnap_lens.inputs.indexed import IndexedTokens

    return IndexedTokens(prefix).batches(start, stop)


def _named_tokenizer(tokenizer, vocab_size: int | None, ids: int) -> tuple[int, str | None]:
    """Token ids need no tokenizer to be counted; one given names the statistics' tokenizer
    (for decoding in reports) and sets the vocabulary size where none was given: (the size,
    at least `ids`, and the tokenizer's name or None)."""
    if tokenizer is None:
        return vocab_size or ids, None
    size = codec(load_tokenizer(tokenizer)).vocab_size  # a bad file is named here
    return vocab_size or max(size, ids), str(tokenizer)


def _read_dataset(
    spec: str, split: str, column: str, text_column, tokenizer, num_shards: int, index: int
):
    data = open_dataset(spec, split).shard(num_shards=num_shards, index=index, contiguous=True)
    tokenizer = None if tokenizer is None else load_tokenizer(tokenizer)
    return dataset_batches(data, column, text_column, tokenizer)[0]


def open_dataset(spec: str | Path, split: str = "train", streaming: bool = False):
    """A ``datasets`` dataset: a folder written by ``save_to_disk`` (memory-mapped), or a hub
    name loaded with ``load_dataset`` (``streaming=True``: read as it is iterated)."""
    import datasets

    path = Path(spec)
    if path.exists():
        data = datasets.load_from_disk(str(path))
    else:
        data = datasets.load_dataset(str(spec), split=split, streaming=streaming)
    if isinstance(data, datasets.DatasetDict | datasets.IterableDatasetDict):
        if split not in data:
            raise ValueError(f"{spec} has no split {split!r}: {list(data)}")
        data = data[split]
    return data


def dataset_batches(
    dataset,
    column: str = "input_ids",
    text_column: str | None = None,
    tokenizer: TokenizerLike | None = None,
    batch_size: int = 1000,
    num_proc: int | None = None,
):
    """(batches of rows, vocabulary size of the tokenizer or None, tokenizer name) of a
    ``datasets`` dataset: its token column, or its text column encoded with `tokenizer`."""
    name, vocab_size = None, None
    if text_column is not None:
        if tokenizer is None:
            raise ValueError("a text column needs a tokenizer")
        tok = codec(tokenizer)
        encode, vocab_size, name = (
            (lambda texts: tok.encode(texts, False)),
            tok.vocab_size,
            tok.name,
        )
        if text_column not in (dataset.column_names or [text_column]):
            raise ValueError(f"dataset has no column {text_column!r}: {dataset.column_names}")
        column = "_scansnap_ids"
        map_kwargs = {
            "batched": True,
            "batch_size": batch_size,
            "remove_columns": dataset.column_names,
        }
        if num_proc and hasattr(dataset, "num_rows"):
            map_kwargs["num_proc"] = num_proc
        dataset = dataset.map(lambda b: {column: encode(list(b[text_column]))}, **map_kwargs)
    elif dataset.column_names is not None and column not in dataset.column_names:
        raise ValueError(f"dataset has no token column {column!r}: {dataset.column_names}")

    def batches():
        for batch in dataset.iter(batch_size=batch_size):
            yield [np.asarray(row, dtype=np.int64) for row in batch[column] if len(row)]

    return batches(), vocab_size, name
