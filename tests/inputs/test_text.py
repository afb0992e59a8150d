"""Text into documents (paragraphs, WikiText articles, lines, the whole file) and the
word-level tokenizer."""

from __future__ import annotations

import pytest

from scansnap_lens.inputs.text import (
    DOCUMENT_SPLITS,
    read_documents,
    wikitext_documents,
    word_level_tokenizer,
)


def test_wikitext_documents_and_vocabulary(shared_dir):
    docs = wikitext_documents(shared_dir / "data/wikitext-2/valid.txt")
    assert len(docs) > 50 and docs[0].startswith("= Homarus gammarus =")
    assert sum(len(d.split()) for d in docs) == 213886  # every word kept
    tok = word_level_tokenizer(docs, max_vocab=1000)
    assert tok.get_vocab_size() == 1000 and tok.token_to_id("<unk>") == 0
    assert tok.token_to_id("the") == 1  # the most frequent word


TEXT = " = A = \n\n one two three \n four five \n\n = B = \n\n six seven eight nine \n"


@pytest.mark.parametrize(
    ("split", "documents"),
    [
        ("paragraph", ["= A =", "one two three four five", "= B =", "six seven eight nine"]),
        ("wikitext", ["= A = one two three four five", "= B = six seven eight nine"]),
        ("line", ["= A =", "one two three", "four five", "= B =", "six seven eight nine"]),
        ("document", ["= A = one two three four five = B = six seven eight nine"]),
    ],
)
def test_documents_split_as_chosen(split, documents, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    assert read_documents(path, split) == documents


def test_every_split_keeps_every_word_of_wikitext(shared_dir):
    path = shared_dir / "data/wikitext-2/valid.txt"
    counts = {s: read_documents(path, s) for s in DOCUMENT_SPLITS}
    words = {s: sum(len(d.split()) for d in docs) for s, docs in counts.items()}
    assert set(words.values()) == {213886}
    sizes = [len(counts[s]) for s in ("document", "wikitext", "paragraph", "line")]
    assert sizes[0] == 1 and sizes == sorted(sizes) and sizes[1] == len(wikitext_documents(path))


def test_bad_text_is_named(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_documents(tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="holds no text"):
        read_documents(tmp_path / "blank.txt")
    with pytest.raises(FileNotFoundError, match="no text file"):
        read_documents(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="split must be one of paragraph, wikitext"):
        read_documents(tmp_path / "blank.txt", "sentence")
