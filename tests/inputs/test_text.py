"""WikiText documents and the word-level tokenizer."""

from __future__ import annotations

from scansnap_lens.inputs.text import wikitext_documents, word_level_tokenizer


def test_wikitext_documents_and_vocabulary(shared_dir):
    docs = wikitext_documents(shared_dir / "data/wikitext-2/valid.txt")
    assert len(docs) > 50 and docs[0].startswith("= Homarus gammarus =")
    assert sum(len(d.split()) for d in docs) == 213886  # every word kept
    tok = word_level_tokenizer(docs, max_vocab=1000)
    assert tok.get_vocab_size() == 1000 and tok.token_to_id("<unk>") == 0
    assert tok.token_to_id("the") == 1  # the most frequent word
