"""Text into documents, and a ``tokenizers`` WordLevel tokenizer.

How a text file splits into documents is a choice (`read_documents`), since statistics never
cross a document's end: paragraphs (blank-line separated, the default), WikiText articles,
lines, or the whole file (the names of ``datasets``' text loader, ``sample_by``, and WikiText).

>>> import tempfile, pathlib
>>> folder = tempfile.TemporaryDirectory()
>>> path = pathlib.Path(folder.name) / "t.txt"
>>> _ = path.write_text(" = A = \\n\\n one two \\n three \\n\\n = B = \\n\\n four \\n")
>>> read_documents(path, "wikitext")
['= A = one two three', '= B = four']
>>> read_documents(path, "paragraph")
['= A =', 'one two three', '= B =', 'four']
>>> folder.cleanup()
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

__all__ = [
    "DOCUMENT_SPLITS",
    "encode_documents",
    "read_documents",
    "text_rows",
    "wikitext_documents",
    "word_level_tokenizer",
]

_ARTICLE = re.compile(r"^ = [^=].* = $")


DOCUMENT_SPLITS = ("paragraph", "wikitext", "line", "document")


def read_documents(path: str | Path, split: str = "paragraph") -> list[str]:
    """The documents of a UTF-8 text file, each with its lines joined by spaces:

    - ``"paragraph"``: separated by blank lines;
    - ``"wikitext"``: WikiText articles (a line `` = Title = `` starts one);
    - ``"line"``: every non-empty line;
    - ``"document"``: the whole file.
    """
    if split not in DOCUMENT_SPLITS:
        raise ValueError(f"split must be one of {', '.join(DOCUMENT_SPLITS)}, got {split!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    docs: list[list[str]] = [[]]
    for line in text.splitlines():
        starts = {
            "paragraph": not line.strip(),
            "wikitext": bool(_ARTICLE.match(line)),
            "line": True,
            "document": False,
        }[split]
        if starts and docs[-1]:
            docs.append([])
        if line.strip():
            docs[-1].append(line.strip())
    texts = [" ".join(lines) for lines in docs if lines]
    if not texts:
        raise ValueError(f"{path} holds no text")
    return texts


def wikitext_documents(path: str | Path) -> list[str]:
    """The articles of a WikiText file (`read_documents` with ``split="wikitext"``)."""
    return read_documents(path, "wikitext")


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


def text_rows(
    path: str | Path,
    tokenizer,
    seq_len: int,
    split: str = "paragraph",
    max_rows: int | None = None,
):
    """Evaluation tokens [N, seq_len] of a text file: its documents (`read_documents`),
    encoded with `tokenizer` (anything `tokens.codec` takes, with its BOS/EOS), cut into
    consecutive rows (`tokens.rows_of`); the first `max_rows` rows."""
    from scansnap_lens.inputs.tokens import encode, rows_of

    rows = rows_of(encode(tokenizer, read_documents(path, split)), seq_len, max_rows)
    if rows.shape[0] == 0:
        raise ValueError(f"{path}: no document has {seq_len} tokens (give a smaller seq_len=)")
    return rows
