"""Inputs: text, token files and tokenizers.

- `text`: WikiText documents and a word-level tokenizer;
- `tokens`: token files (safetensors, npy, pt), the one tokenizer adapter (`codec`), text cut
  into evaluation rows;
- `indexed`: Pythia's pre-tokenized ``.bin`` / ``.idx`` datasets, memory-mapped.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "Codec": "tokens",
    "DOCUMENT_SPLITS": "text",
    "IndexedTokens": "indexed",
    "TokenizerLike": "tokens",
    "codec": "tokens",
    "encode": "tokens",
    "encode_documents": "text",
    "load_tokenizer": "tokens",
    "read_documents": "text",
    "read_tokens": "tokens",
    "rows_of": "tokens",
    "save_tokens": "tokens",
    "wikitext_documents": "text",
    "word_level_tokenizer": "text",
}
_MODULES = {"indexed", "text", "tokens"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
