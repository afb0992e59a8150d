"""Word-level text helpers: WikiText documents and a ``tokenizers`` WordLevel tokenizer.

>>> tok = word_level_tokenizer(["the cat sat on the mat", "the dog"], max_vocab=4)
>>> tok.get_vocab_size(), tok.encode("the cat ran").ids  # <unk> = 0, then by frequency
(4, [1, 2, 0])
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

__all__ = ["encode_documents", "wikitext_documents", "word_level_tokenizer"]

_ARTICLE = re.compile(r"^ = [^=].* = $")


def wikitext_documents(path: str | Path) -> list[str]:
    """Split a WikiText file into articles (a line `` = Title = `` starts one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no WikiText file at {path}")
    docs: list[list[str]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    for line in text.splitlines():
        if _ARTICLE.match(line) or not docs:
            docs.append([])
        if line.strip():
            docs[-1].append(line.strip())
    texts = [" ".join(lines) for lines in docs if lines]
    if not texts:
        raise ValueError(f"{path} holds no text")
    return texts


def word_level_tokenizer(
    texts: Iterable[str],
    max_vocab: int | None = None,
    min_frequency: int = 1,
    unk: str = "<unk>",
    specials: tuple[str, ...] = (),
) -> Tokenizer:
    """A whitespace WordLevel tokenizer: ``unk`` = 0, then ``specials``, then words by
    decreasing frequency (ties alphabetical), at most ``max_vocab`` entries in all."""
    counts = Counter(word for text in texts for word in text.split())
    for reserved in (unk, *specials):
        counts.pop(reserved, None)
    words = sorted(
        (w for w, c in counts.items() if c >= min_frequency), key=lambda w: (-counts[w], w)
    )
    vocab_list = [unk, *specials, *words]
    if max_vocab is not None:
        if max_vocab < 1 + len(specials):
            raise ValueError(f"max_vocab={max_vocab} leaves no room for {unk} and the specials")
        vocab_list = vocab_list[:max_vocab]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab_list)}, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def encode_documents(
    tokenizer: Tokenizer, texts: list[str], bos: str | None = None
) -> list[np.ndarray]:
    """Token ids of each document (int64), with the ``bos`` token first if given."""
    prefix = [] if bos is None else [tokenizer.token_to_id(bos)]
    if bos is not None and prefix[0] is None:
        raise ValueError(f"BOS token {bos!r} is not in the vocabulary")
    return [np.asarray(prefix + e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)]
