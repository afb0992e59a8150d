"""Inputs: text, token files, tokenizers and corpora.

- `corpus`: `Corpus`, a training corpus as users name it (text, token files, indexed data, a
  ``datasets`` dataset), read in one place, whole or in shards;
- `text`: WikiText documents, a word-level tokenizer, evaluation rows of a text file;
- `tokens`: token files (safetensors, npy, pt), the one tokenizer adapter (`codec`), text cut
  into evaluation rows;
- `indexed`: Pythia's pre-tokenized ``.bin`` / ``.idx`` datasets, memory-mapped.
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "corpus indexed text tokens")
