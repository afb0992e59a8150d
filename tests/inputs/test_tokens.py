"""Token files: each format read back, and everything else refused with a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from scansnap_lens.inputs.tokens import codec, encode, read_tokens, rows_of, save_tokens


def test_formats_round_trip(tmp_path):
    tokens = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(read_tokens(save_tokens(tmp_path / "a.safetensors", tokens)), tokens)
    np.save(tmp_path / "a.npy", tokens.numpy().astype(np.int32))
    assert torch.equal(read_tokens(tmp_path / "a.npy"), tokens)
    torch.save(tokens, tmp_path / "a.pt")
    assert torch.equal(read_tokens(tmp_path / "a.pt"), tokens)
    torch.save(tokens[0], tmp_path / "row.pt")
    assert read_tokens(tmp_path / "row.pt").shape == (1, 7)  # one row


class Payload:
    """Any class outside torch's allow-list: loading it would run arbitrary code."""


def test_bad_token_files_are_refused(tmp_path):
    # a pickled object is never unpickled (weights_only=True)
    torch.save(Payload(), tmp_path / "object.pt")
    with pytest.raises(ValueError, match=r"pickled Python objects.*not loaded") as refused:
        read_tokens(tmp_path / "object.pt")
    assert "weights_only" not in str(refused.value)  # what was refused, no advice to allow it
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a readable token file"):
        read_tokens(tmp_path / "objects.npy")
    with pytest.raises(ValueError, match="integer ids"):  # not cast in silence
        save_tokens(tmp_path / "f.safetensors", torch.zeros(2, 3))
    torch.save(torch.zeros(2, 3), tmp_path / "float.pt")
    with pytest.raises(ValueError, match="not integer token ids"):
        read_tokens(tmp_path / "float.pt")
    torch.save(torch.tensor([[1, -2]]), tmp_path / "neg.pt")
    with pytest.raises(ValueError, match="negative"):
        read_tokens(tmp_path / "neg.pt")
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00")
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        read_tokens(tmp_path / "cut.safetensors")
    with pytest.raises(FileNotFoundError):
        read_tokens(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="token files end in"):
        read_tokens(
            save_tokens(tmp_path / "x.safetensors", torch.ones(1, 3, dtype=torch.long)).rename(
                tmp_path / "x.txt"
            )
        )


def test_rows_of_an_empty_text():
    with pytest.raises(ValueError, match="empty or too short"):
        rows_of([np.arange(3)], seq_len=8)


def test_unsigned_token_files_read_as_int64_and_huge_ids_are_refused(tmp_path):
    ids = np.array([[1, 2, 65535], [0, 7, 9]], dtype=np.uint16)  # nanoGPT writes uint16
    np.save(tmp_path / "u16.npy", ids)
    got = read_tokens(tmp_path / "u16.npy")
    assert got.dtype == torch.int64 and got.tolist() == ids.astype(np.int64).tolist()
    save_file({"tokens": torch.from_numpy(ids)}, str(tmp_path / "u16.safetensors"))
    assert read_tokens(tmp_path / "u16.safetensors").tolist() == got.tolist()
    np.save(tmp_path / "u64.npy", np.array([[1, 2**40]], dtype=np.uint64))
    with pytest.raises(ValueError, match="beyond"):
        read_tokens(tmp_path / "u64.npy")
    torch.save(torch.tensor([[1, 2**40]]), tmp_path / "big.pt")
    with pytest.raises(ValueError, match=r"token id 1099511627776, beyond"):
        read_tokens(tmp_path / "big.pt")


def test_one_codec_for_every_kind_of_tokenizer():
    """A tokenizers.Tokenizer, the Hugging Face tokenizer around it and a TransformerLens-like
    model holding that tokenizer encode and decode the same, and report one vocabulary size
    (the model's own for the model); anything else is refused by name."""
    from types import SimpleNamespace

    import transformers

    from scansnap_lens.inputs.text import word_level_tokenizer
    from scansnap_lens.statistics.kinds import _decoder

    raw = word_level_tokenizer(["the cat sat on the mat", "the dog"])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    model = SimpleNamespace(to_tokens=None, tokenizer=hf, cfg=SimpleNamespace(d_vocab=50))
    texts = ["the cat ran", "dog on the mat"]
    codecs = [codec(t) for t in (raw, hf, model)]
    assert all(c.encode(texts, False) == [[1, 2, 0], [3, 5, 1, 4]] for c in codecs)
    assert all(c.decode(2) == "cat" for c in codecs)
    assert [c.vocab_size for c in codecs] == [7, 7, 50]
    assert [a.tolist() for a in encode(hf, texts)] == [[1, 2, 0], [3, 5, 1, 4]]
    assert _decoder(hf)(5) == "on" and codec(codecs[0]) is codecs[0]
    with pytest.raises(TypeError, match=r"tokenizer must be .* got dict"):
        codec({})
