"""Inputs: text, token files, tokenizers and corpora.

- `corpus`: `Corpus`, a training corpus as users name it (text, token files, indexed data, a
  ``datasets`` dataset), read in one place, whole or in shards;
- `text`: WikiText documents, a word-level tokenizer, evaluation rows of a text file;
- `tokens`: token files (safetensors, npy, pt), the one tokenizer adapter (`codec`), text cut
  into evaluation rows;
- `indexed`: Pythia's pre-tokenized ``.bin`` / ``.idx`` datasets, memory-mapped.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "Codec": "tokens",
    "Corpus": "corpus",
    "DOCUMENT_SPLITS": "text",
    "IndexedTokens": "indexed",
    "TokenizerLike": "tokens",
    "codec": "tokens",
    "dataset_batches": "corpus",
    "encode": "tokens",
    "encode_documents": "text",
    "load_tokenizer": "tokens",
    "open_dataset": "corpus",
    "read_documents": "text",
    "read_tokens": "tokens",
    "rows_of": "tokens",
    "save_tokens": "tokens",
    "text_rows": "text",
    "wikitext_documents": "text",
    "word_level_tokenizer": "text",
}
_MODULES = {"corpus", "indexed", "text", "tokens"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
