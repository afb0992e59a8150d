"""Co-occurrence statistics against a brute-force count: merging, batches, datasets, save
and load; files that are not statistics, or were edited by hand, refused by name."""

from __future__ import annotations

import re
from collections import Counter

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scansnap_lens.inputs.corpus import Corpus, dataset_batches
from scansnap_lens.inputs.text import encode_documents, word_level_tokenizer
from scansnap_lens.statistics.context import Context
from scansnap_lens.statistics.corpus import (
    CooccurrenceStats,
    cooccurrence,
    count_corpus,
)


def brute_force(rows, window, exclude_bos, queries=None, next_tokens=None):
    """The definitions of docs/glossary.md written out with dicts: the reference."""
    events, triples = Counter(), Counter()
    for row in rows:
        first = 1 if exclude_bos else 0
        for T in range(first + 1, len(row) - 1):
            m, n = row[T], row[T + 1]
            if (queries is not None and m not in queries) or (
                next_tokens is not None and n not in next_tokens
            ):
                continue
            events[(m, n)] += 1
            lo = first if window is None else max(first, T - window)
            for t in range(lo, T):
                triples[(m, n, row[t])] += 1
    return dict(events), dict(triples)


def as_dicts(stats: CooccurrenceStats):
    events = {
        (m, n): e
        for m, n, e in zip(stats.query.tolist(), stats.next_token.tolist(), stats.events.tolist())
    }
    frame = stats.to_dataframe()
    triples = {(r.query, r.next, r.token): r.count for r in frame.itertuples()}
    return events, triples


@st.composite
def corpora(draw):
    vocab = draw(st.integers(2, 12))
    rows = draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=0, max_size=25), min_size=1, max_size=6
        )
    )
    window = draw(st.one_of(st.none(), st.integers(1, 8)))
    bos = draw(st.booleans())
    subset = st.one_of(st.none(), st.sets(st.integers(0, vocab - 1), min_size=1))
    return vocab, rows, window, bos, draw(subset), draw(subset)


@settings(max_examples=150, deadline=None)
@given(corpora())
def test_counts_equal_the_brute_force_reference(case):
    vocab, rows, window, bos, queries, next_tokens = case
    events, triples = brute_force(rows, window, bos, queries, next_tokens)
    kwargs = dict(vocab_size=vocab, window=window, exclude_bos=bos)
    if not events:
        with pytest.raises(ValueError, match=r"no event|empty corpus"):
            cooccurrence(rows, queries=queries, next_tokens=next_tokens, **kwargs)
        return
    stats = cooccurrence(rows, queries=queries, next_tokens=next_tokens, num_proc=2, **kwargs)
    assert as_dicts(stats) == (events, triples)
    assert int(stats.total_context.sum()) == sum(triples.values())


def _random_rows(seed, n=5, vocab=9):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(vocab, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g)
        for _ in range(n)
    ]


def test_merge_equals_the_concatenation_and_is_associative_and_commutative():
    a, b, c = (_random_rows(s) for s in range(3))
    kw = dict(vocab_size=9, window=4, exclude_bos=True)
    sa, sb, sc = (cooccurrence(x, **kw) for x in (a, b, c))
    whole = cooccurrence(a + b + c, **kw)
    left, right = (sa + sb) + sc, sa + (sb + sc)
    assert as_dicts(left) == as_dicts(right) == as_dicts(whole) == as_dicts(sc + sb + sa)
    assert left.fingerprint == whole.fingerprint == (sc + (sa + sb)).fingerprint
    assert left.num_tokens == whole.num_tokens and left.num_rows == 15
    # merging keeps the order of first occurrence: the tokens come as counting a + b + c
    assert torch.equal(left.token, whole.token) and torch.equal(left.count, whole.count)
    assert torch.equal(left.offsets, whole.offsets) and torch.equal(left.events, whole.events)


def test_iterable_of_batches_in_small_chunks_equals_one_batch():
    rows = torch.randint(20, (64, 16), generator=torch.Generator().manual_seed(1))
    batches = (rows[i : i + 8] for i in range(0, 64, 8))
    chunked = cooccurrence(batches, vocab_size=20, window=5, chunk_tokens=40)
    assert as_dicts(chunked) == as_dicts(cooccurrence(rows, vocab_size=20, window=5))


def test_accessors_and_probabilities():
    rows = torch.tensor([[0, 1, 2, 1, 3], [2, 2, 1, 3, 0]])
    stats = cooccurrence(rows, vocab_size=4, window=2)
    tokens, probs = stats.p_context(1, 3)
    assert dict(zip(tokens.tolist(), probs.tolist())) == {1: 0.25, 2: 0.75}
    dense = stats.p_context(1, 3, dense=True)
    assert dense.shape == (4,) and dense.sum().item() == pytest.approx(1.0)
    nxt, counts = stats.top_next(1, k=5)
    assert dict(zip(nxt.tolist(), counts.tolist())) == {3: 2, 2: 1}
    assert set(stats.classes().columns) >= {"query", "next", "events", "context"}
    with pytest.raises(KeyError, match="does not occur"):
        stats.context_counts(0, 0)
    pruned = stats.prune(2)
    assert (pruned.count >= 2).all() and torch.equal(pruned.events, stats.events)


def test_save_load_round_trip_is_exact(tmp_path):
    stats = cooccurrence(_random_rows(4), vocab_size=9, window=3, queries=[1, 2, 3])
    stats.tokenizer = "test-tokenizer"
    back = CooccurrenceStats.load(stats.save(tmp_path / "s.safetensors"))
    for name in ("query", "next_token", "events", "offsets", "token", "count", "tracked_queries"):
        assert torch.equal(getattr(back, name), getattr(stats, name))
    assert back.tracked_next is None
    for name in ("vocab_size", "window", "exclude_bos", "fingerprint", "tokenizer", "num_tokens"):
        assert getattr(back, name) == getattr(stats, name)


def test_datasets_token_column_and_text_column_with_tokenizer(tmp_path):
    docs = ["the cat sat on the mat", "a dog sat on a log", "the cat and the dog"]
    tok = word_level_tokenizer(docs)
    ids = encode_documents(tok, docs)
    expected = as_dicts(cooccurrence(ids, vocab_size=tok.get_vocab_size(), window=3))
    token_ds = datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in ids]})
    token_ds.save_to_disk(tmp_path / "tokens")
    corpus = Corpus.of(dataset=tmp_path / "tokens", vocab_size=tok.get_vocab_size())
    assert as_dicts(count_corpus(corpus, Context(window=3))) == expected
    text_ds = datasets.Dataset.from_dict({"text": docs})
    text_ds.save_to_disk(tmp_path / "text")
    tok.save(str(tmp_path / "tok.json"))
    corpus = Corpus.of(
        dataset=tmp_path / "text", text_column="text", tokenizer=tmp_path / "tok.json"
    )
    stats = count_corpus(corpus, Context(window=3))
    assert as_dicts(stats) == expected and stats.tokenizer == str(tmp_path / "tok.json")
    batches, _, name = dataset_batches(text_ds.to_iterable_dataset(), text_column="text",
                                       tokenizer=tok)  # fmt: skip
    streamed = cooccurrence(batches, tok.get_vocab_size(), window=3)
    assert as_dicts(streamed) == expected and name == "tokenizers.Tokenizer"


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cooccurrence(torch.empty(0, 5, dtype=torch.long), vocab_size=4), "empty corpus"),
        (lambda: cooccurrence([], vocab_size=4), "empty corpus"),
        (lambda: cooccurrence(torch.tensor([[0, 1, -1, 2]]), vocab_size=4), "token id -1"),
        (lambda: cooccurrence(torch.tensor([[0, 1, 7, 2]]), vocab_size=4), r"token id 7 \(row 0\)"),
        (
            lambda: cooccurrence(torch.tensor([[0, 1, 2]]), vocab_size=4, window=0),
            "window W must be >= 1",
        ),
        (lambda: cooccurrence(torch.tensor([[0, 1]]), vocab_size=4), "too short to hold an event"),
        (
            lambda: cooccurrence(torch.tensor([[0, 1, 2]]), vocab_size=4, exclude_bos=True),
            "too short",
        ),
        (lambda: cooccurrence([[0, 1], [2]], vocab_size=4), "no event"),
        (lambda: cooccurrence(torch.rand(2, 5), vocab_size=4), "must be integers"),
        (
            lambda: cooccurrence(iter([torch.zeros(1, 4, dtype=torch.long)])),
            "vocab_size is required",
        ),
        (
            lambda: cooccurrence(torch.tensor([[0, 1, 2]]), vocab_size=4, queries=[9]),
            "queries must lie",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_merging_incompatible_statistics_is_refused():
    rows = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])  # every co-occurrence counted twice
    base = cooccurrence(rows, vocab_size=4, window=2)
    for other, what in [
        (cooccurrence(rows, vocab_size=5, window=2), "vocab_size"),
        (cooccurrence(rows, vocab_size=4, window=3), "window"),
        (
            cooccurrence(torch.tensor([[0, 1, 2, 3, 1]] * 2), 4, window=2, exclude_bos=True),
            "exclude_bos",
        ),
        (cooccurrence(rows, vocab_size=4, window=2, queries=[1, 2]), "tracked_queries"),
        (base.prune(2), "pruned"),
    ]:
        with pytest.raises(ValueError, match=what):
            base + other


def test_pruning_every_cooccurrence_is_refused():
    stats = cooccurrence(torch.tensor([[0, 1, 2, 3]]), vocab_size=4, window=2)
    with pytest.raises(ValueError, match=r"min_count 5 prunes every co-occurrence .* 1 times"):
        stats.prune(5)


def test_loading_a_file_that_is_not_statistics(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a statistics file"):
        CooccurrenceStats.load(junk)
    from safetensors.torch import save_file

    other = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(other))
    with pytest.raises(ValueError, match="not a statistics file"):
        CooccurrenceStats.load(other)
    with pytest.raises(FileNotFoundError):
        CooccurrenceStats.load(tmp_path / "missing.safetensors")


HAND_EDITS = [  # (edit of the tensors / metadata, what the message names)
    (lambda t, m: t.update(offsets=t["offsets"][:-2]), "offsets must run from 0"),
    (lambda t, m: t.update(token=t["token"] + 1000), "token ids lie outside"),
    (lambda t, m: t.pop("count"), "lacks the tensors ['count']"),
    (lambda t, m: t.update(count=t["count"].float()), "count must be a 1-D int64"),
    (lambda t, m: t.update(events=t["events"][1:]), "differ in length"),
    (lambda t, m: t.update(count=-t["count"]), "negative counts"),
    (lambda t, m: m.update(vocab_size="33"), "vocab_size must be int"),
    (lambda t, m: m.update(colour="blue"), "unknown metadata"),
]


@pytest.mark.parametrize("edit, message", HAND_EDITS)
def test_hand_edited_statistics_are_refused_by_name(edit, message, tmp_path):
    """A statistics file whose tensors disagree is refused on load, before a compiled kernel
    could index past an array (one such file crashed the process before)."""
    import json

    from safetensors.torch import load_file, save_file

    rows = torch.randint(0, 12, (6, 10), generator=torch.Generator().manual_seed(0))
    path = cooccurrence(rows, vocab_size=12).save(tmp_path / "s.safetensors")
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        header = handle.metadata()
    meta = json.loads(header["meta"])
    edit(tensors, meta)
    save_file(tensors, str(path), metadata={**header, "meta": json.dumps(meta)})
    with pytest.raises(ValueError, match=re.escape(message)):
        CooccurrenceStats.load(path)


def test_statistics_pickle_as_arrays_and_come_back_equal():
    """What Ray's object store does with them: numpy buffers out, equal statistics back."""
    import pickle

    rows = torch.randint(20, (16, 12), generator=torch.Generator().manual_seed(3))
    stats = cooccurrence(rows, vocab_size=20, window=5, queries=[1, 2, 3])
    back = pickle.loads(pickle.dumps(stats, protocol=5))
    assert as_dicts(back) == as_dicts(stats) and back.fingerprint == stats.fingerprint
    assert torch.equal(back.tracked_queries, stats.tracked_queries)
    assert as_dicts(back + back) == as_dicts(stats + stats)
