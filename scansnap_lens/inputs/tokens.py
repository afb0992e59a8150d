"""Token inputs: token files, tokenizers, and text cut into evaluation rows.

Token files hold int ids: ``.safetensors`` (a tensor named ``tokens``, or the only tensor),
``.npy`` (read without pickle) or ``.pt`` (``torch.load(weights_only=True)``).

>>> import tempfile, torch
>>> with tempfile.TemporaryDirectory() as folder:
...     path = save_tokens(folder + "/eval.safetensors", torch.arange(12).reshape(3, 4))
...     read_tokens(path).shape
torch.Size([3, 4])
>>> rows_of([np.arange(10), np.arange(5)], seq_len=4).tolist()
[[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
>>> rows_of([np.arange(10), np.arange(5)], seq_len=4, join=True).tolist()
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np
import torch
from torch import Tensor

from scansnap_lens._io import make_folder, write_tensors

if TYPE_CHECKING:
    import tokenizers
    import transformers

    from scansnap_lens.models.backend import HookedModel

__all__ = [
    "Codec",
    "TokenizerLike",
    "codec",
    "encode",
    "load_tokenizer",
    "read_tokens",
    "rows_of",
    "save_tokens",
]

# What every ``tokenizer=`` takes: a ``tokenizers.Tokenizer``, a Hugging Face tokenizer, a
# TransformerLens model (its ``tokenizer``), or a tokenizer.json path or hub name (`codec`).
TokenizerLike = Union[
    "tokenizers.Tokenizer", "transformers.PreTrainedTokenizerBase", "HookedModel", str, Path
]

TOKEN_SUFFIXES = (".safetensors", ".npy", ".pt", ".pth")


def save_tokens(path: str | Path, tokens: Tensor) -> Path:
    """Write token ids [N, T] as a safetensors file (tensor ``tokens``)."""
    if not isinstance(path, str | Path):
        raise TypeError(
            f"save_tokens(path, tokens): path must be a file name, got {type(path).__name__}"
            " (the arguments swapped?)"
        )
    tokens = torch.as_tensor(tokens)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be integer ids, got {tokens.dtype} values")
    path = Path(path)
    make_folder(path.parent)
    return write_tensors(path, {"tokens": torch.as_tensor(tokens).long()}, {"format": "tokens"})


MAX_TOKEN_ID = 2**31 - 2  # vocabularies are indexed with int32 here and in TransformerLens
_UNSIGNED = tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))


def read_tokens(path: str | Path) -> Tensor:
    """Token ids [N, T] (int64) from a token file; clear errors for anything else."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {path}")
    suffix = path.suffix.lower()
    if suffix not in TOKEN_SUFFIXES:
        raise ValueError(f"{path}: token files end in {', '.join(TOKEN_SUFFIXES)}")
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        elif suffix == ".npy":
            array = np.load(path, allow_pickle=False)
            if array.dtype.kind == "u":  # uint16 / uint64 files (nanoGPT writes uint16)
                if array.size and int(array.max()) > MAX_TOKEN_ID:
                    raise ValueError(f"token id {int(array.max())} is beyond {MAX_TOKEN_ID}")
                array = array.astype(np.int64)
            tensors = {"tokens": torch.from_numpy(array)}
        else:
            tensors = {"tokens": torch.load(path, map_location="cpu", weights_only=True)}
    except pickle.UnpicklingError:
        raise ValueError(
            f"{path} holds pickled Python objects beyond a tensor of ids, which are not loaded"
            " (unpickling runs the file's code): save the ids with save_tokens (safetensors)"
            " or numpy.save"
        ) from None
    except Exception as err:  # corrupt or truncated
        raise ValueError(f"{path} is not a readable token file ({err})") from None
    if "tokens" in tensors:
        tokens = tensors["tokens"]
    elif len(tensors) == 1:
        tokens = next(iter(tensors.values()))
    else:
        raise ValueError(f"{path} holds {sorted(tensors)}: name the ids 'tokens'")
    if not isinstance(tokens, Tensor):
        raise ValueError(f"{path} holds a {type(tokens).__name__}, not a tensor of token ids")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"{path} holds {tokens.dtype} values, not integer token ids")
    if tokens.dtype in _UNSIGNED:  # torch has few operations on these: go through numpy
        array = tokens.numpy()
        if array.size and int(array.max()) > MAX_TOKEN_ID:
            raise ValueError(f"{path} holds token id {int(array.max())}, beyond {MAX_TOKEN_ID}")
        tokens = torch.from_numpy(array.astype(np.int64))
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.numel() == 0:
        raise ValueError(f"{path}: token ids must be [rows, positions], got {tuple(tokens.shape)}")
    if int(tokens.min()) < 0:
        raise ValueError(f"{path} holds negative token ids")
    if int(tokens.max()) > MAX_TOKEN_ID:
        raise ValueError(
            f"{path} holds token id {int(tokens.max())}, beyond {MAX_TOKEN_ID}: no vocabulary"
            " is that large (a file of something else?)"
        )
    return tokens.long()


def _names_a_file(spec: str) -> bool:
    """Whether `spec` can only be a path: a hub name is "name" or "owner/name", never a .json
    file, an absolute or relative path, or more than two parts.

    >>> [_names_a_file(s) for s in ("gpt2", "EleutherAI/pythia-70m", "tok.json", "./tok", "a/b/c")]
    [False, False, True, True, True]
    """
    return (
        spec.endswith(".json")
        or spec.startswith(("/", "./", "../", "~"))
        or spec.count("/") > 1
        or "\\" in spec
    )


def load_tokenizer(spec: str | Path):
    """A ``tokenizer.json`` file (``tokenizers``) or a Hugging Face tokenizer name or folder."""
    path = Path(spec)
    if path.is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises its own Exception type for any bad file
            hint = (
                "; for a Hugging Face tokenizer folder give the folder"
                if path.name == "tokenizer_config.json"
                else ""
            )
            raise ValueError(
                f"{path} is not a tokenizer.json file of the tokenizers library ({err}){hint}:"
                " give a tokenizer.json (tokenizer.save, scansnap stats writes one), a"
                " tokenizer folder or a Hugging Face tokenizer name (tokenizer=)"
            ) from None
    if not path.is_dir() and _names_a_file(str(spec)):  # asking the hub would only wait
        raise FileNotFoundError(f"tokenizer file {spec} does not exist")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(spec))
    except OSError as err:
        raise ValueError(
            f"no tokenizer {spec!r}: not a file, and not found on the hub ({err})"
        ) from None


@dataclass(frozen=True)
class Codec:
    """The one adapter over the tokenizers users have: what the package needs of them.

    encode: texts -> their ids (``special_tokens``: let the tokenizer add its BOS/EOS);
    decode: one id -> its text (as ``tokenizer.decode([id])`` gives it: what views show);
    vocab_size: ids lie in [0, vocab_size); name: the tokenizer's name or path.
    """

    encode: Callable[[list[str], bool], list[list[int]]]
    decode: Callable[[int], str]
    vocab_size: int
    name: str


def codec(tokenizer: TokenizerLike) -> Codec:
    """The `Codec` of a ``tokenizers.Tokenizer``, a Hugging Face tokenizer, a TransformerLens
    model (its tokenizer, with the model's vocabulary size) or a `Codec`.

    >>> from scansnap_lens.inputs.text import word_level_tokenizer
    >>> c = codec(word_level_tokenizer(["a b b"]))
    >>> c.encode(["b a c"], False), c.decode(1), c.vocab_size
    ([[1, 2, 0]], 'b', 3)
    """
    if isinstance(tokenizer, Codec):
        return tokenizer
    if hasattr(tokenizer, "to_tokens") and hasattr(tokenizer, "tokenizer"):  # a TL model
        inner = codec(tokenizer.tokenizer)
        return Codec(inner.encode, inner.decode, int(tokenizer.cfg.d_vocab), inner.name)
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size"):  # tokenizers

        def encode(texts, special_tokens=False):
            batch = tokenizer.encode_batch(list(texts), add_special_tokens=special_tokens)
            return [e.ids for e in batch]

        return Codec(
            encode,
            lambda i: tokenizer.decode([int(i)]),
            tokenizer.get_vocab_size(),
            "tokenizers.Tokenizer",
        )
    if callable(tokenizer) and hasattr(tokenizer, "convert_ids_to_tokens"):  # transformers

        def encode(texts, special_tokens=False):
            return tokenizer(list(texts), add_special_tokens=special_tokens)["input_ids"]

        return Codec(
            encode,
            lambda i: tokenizer.decode([int(i)]),
            len(tokenizer),
            getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
        )
    raise TypeError(
        "tokenizer must be a Hugging Face tokenizer, a tokenizers.Tokenizer or a TransformerLens"
        f" model, got {type(tokenizer).__name__}"
    )


def encode(
    tokenizer: TokenizerLike, texts: Sequence[str], special_tokens: bool = True
) -> list[np.ndarray]:
    """Ids (int64) of each text with any tokenizer `codec` takes; ``special_tokens``: the
    tokenizer adds its BOS/EOS where it has them, as a model's own tokenizer would."""
    ids = codec(tokenizer).encode(list(texts), special_tokens)
    return [np.asarray(i, dtype=np.int64) for i in ids]


def rows_of(
    documents: Sequence[np.ndarray], seq_len: int, max_rows: int | None = None, join: bool = False
) -> Tensor:
    """Cut documents into consecutive rows [N, seq_len] (a document's tail shorter than seq_len
    is dropped; with ``join`` the documents are concatenated first); the first `max_rows` rows."""
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 (context, query, next token), got {seq_len}")
    if join:
        documents = [np.concatenate([np.asarray(d) for d in documents])] if documents else []
    rows = [
        np.asarray(doc[i : i + seq_len])
        for doc in documents
        for i in range(0, len(doc) - seq_len + 1, seq_len)
    ]
    if max_rows is not None:
        rows = rows[:max_rows]
    if not rows:
        raise ValueError(f"no document holds {seq_len} tokens: the text is empty or too short")
    return torch.from_numpy(np.stack(rows)).long()
