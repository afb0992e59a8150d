"""Offline stand-ins for the Hugging Face hub: tiny models and tokenizers built locally.

`fake_hub_model` writes a randomly initialised GPT-NeoX (or GPT-2) with a word-level tokenizer
into a hub cache folder, one revision per training step, in the layout `huggingface_hub` reads
with ``HF_HUB_OFFLINE=1``.  TransformerLens then loads ``EleutherAI/pythia-14m`` checkpoints
through its own code path, with no network and no mocking.

>>> import os, tempfile
>>> with tempfile.TemporaryDirectory() as cache:
...     _ = fake_hub_model(cache, "EleutherAI/pythia-14m", revisions=["step0", "step1000"])
...     sorted(os.listdir(os.path.join(cache, "models--EleutherAI--pythia-14m", "refs")))
['main', 'step0', 'step1000']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

BOS = "<|endoftext|>"

__all__ = [
    "bridge_from_hf",
    "fake_hub_model",
    "fake_legacy_tl_model",
    "legacy_buffers",
    "tiny_hf_model",
    "word_tokenizer",
]


def word_tokenizer(vocab_size: int):
    """A `PreTrainedTokenizerFast` over the words ``w1 .. w{V-1}`` with BOS = EOS = id 0."""
    import tokenizers
    import transformers
    from tokenizers.models import WordLevel

    vocab = {BOS: 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token=BOS))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=BOS, unk_token=BOS
    )


def tiny_hf_model(
    arch: str = "gpt_neox",
    vocab_size: int = 64,
    n_ctx: int = 32,
    d_model: int = 32,
    n_layers: int = 2,
    n_heads: int = 4,
    seed: int = 0,
):
    """A randomly initialised Hugging Face causal LM (``gpt_neox`` or ``gpt2``), eval mode."""
    import transformers

    torch.manual_seed(seed)
    if arch == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            vocab_size=vocab_size,
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=4 * d_model,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPTNeoXForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=n_ctx,
            n_ctx=n_ctx,  # as the hub's GPT-2 configs (stanford-crfm's included) have it
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"arch must be 'gpt_neox' or 'gpt2', got {arch!r}")
    return model.eval()


def fake_hub_model(
    cache_dir: str | Path,
    repo_id: str = "EleutherAI/pythia-14m",
    revisions: Sequence[str] = ("step0", "step1000", "step2000"),
    arch: str = "gpt_neox",
    tokenizer_size: int | None = None,
    **model_kwargs,
) -> Path:
    """Write one randomly initialised model per revision into a hub cache; return the repo dir.

    Every revision gets its own weights (seed = its position in `revisions`); ``main`` points
    at the last one.  `tokenizer_size`: the tokenizer's vocabulary where it is smaller than
    the model's (Pythia pads d_vocab 50304 beyond its tokenizer's 50277).  Use with
    ``HF_HUB_CACHE=cache_dir`` and ``HF_HUB_OFFLINE=1``.
    """
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    vocab_size = model_kwargs.setdefault("vocab_size", 64)
    tokenizer = word_tokenizer(tokenizer_size or vocab_size)
    for i, revision in enumerate(revisions):
        commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        model = tiny_hf_model(arch, seed=i, **model_kwargs)
        model.config.name_or_path = repo_id
        model.save_pretrained(snapshot, safe_serialization=True)
        tokenizer.save_pretrained(snapshot)
        (repo / "refs" / revision).write_text(commit)
        if i == len(revisions) - 1:
            (repo / "refs" / "main").write_text(commit)
    (repo / "fake_hub.json").write_text(json.dumps({"repo_id": repo_id, "revisions": revisions}))
    return repo


def bridge_from_hf(hf_model, name: str = "gpt2", tokenizer_dir: str | Path | None = None):
    """A TransformerBridge around an in-memory Hugging Face model, with a local tokenizer."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from scansnap_lens.models.backend import _scratch_dir

    folder = Path(tokenizer_dir or _scratch_dir("scansnap_tok_"))
    word_tokenizer(hf_model.config.vocab_size).save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer)


def legacy_buffers(state: dict, fields: dict, ignore: float = -1e5) -> dict:
    """`state` as a TransformerLens 1.x or 2.x ``HookedTransformer.state_dict()`` holds it:
    each attention block's buffers ``mask`` (the causal mask, bool [n_ctx, n_ctx]) and
    ``IGNORE`` (-1e5 up to 1.x, -inf later) after its parameters, in the module's order
    (TransformerLens 1.0 ``components.Attention``; 2.0 ``AbstractAttention``)."""
    out = {}
    mask = torch.tril(torch.ones(fields["n_ctx"], fields["n_ctx"])).bool()
    for key, tensor in state.items():
        out[key] = tensor
        if key.endswith(".attn.b_O"):
            out[key[: -len("b_O")] + "mask"] = mask.clone()
            out[key[: -len("b_O")] + "IGNORE"] = torch.tensor(ignore)
    return out


def fake_legacy_tl_model(
    cache_dir: str | Path,
    repo_id: str = "NeelNanda/attn-only-1l",
    labels: Sequence[int] = (0, 5_000_000, 15_000_000),
    vocab_size: int = 64,
) -> Path:
    """Write a legacy TransformerLens repository (NeelNanda's layout) into a hub cache.

    ``config.json`` holds TransformerLens fields; ``checkpoints/<name>_checkpoint_<label>.pth``
    one HookedTransformer state dict per label (seed = its position in `labels`).  The files
    are written in an order where a label that is a decimal suffix of another comes second,
    which is where a lookup by suffix goes wrong.
    """
    from scansnap_lens.models.training import initial_weights

    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (snapshot / "checkpoints").mkdir(parents=True, exist_ok=True)
    fields = dict(  # the training script's config, as those repositories hold it
        n_layers=1,
        d_model=16,
        d_mlp=64,
        d_head=8,
        n_heads=2,
        lr_hidden=0.002,
        lr_vector=0.001,
        batch_size_per_device=32,
        batches_per_step=1,
        seed=10000,
        save_checkpoints=True,
        debug=False,
        normalization="LN",
        max_tokens=22_000_000_000,
        n_ctx=32,
        d_vocab=vocab_size,
        tokenizer_name="NeelNanda/gpt-neox-tokenizer-digits",
        betas=[0.9, 0.99],
        weight_decay=0.05,
        dataset_name="c4+code",
        grad_norm_clip=1.0,
        act_fn="relu",
        shortformer_pos=False,
        attn_only=True,
        ln_eps=1e-5,
        lr_schedule="cosine_warmup",
        warmup_tokens=300_000_000,
        weight_init_scheme="gpt2",
    )
    (snapshot / "config.json").write_text(json.dumps(fields))
    stem = repo_id.split("/")[-1]
    weight_fields = {**fields, "normalization_type": "LN"}
    for i, label in sorted(enumerate(labels), key=lambda p: -p[1]):
        state = legacy_buffers(initial_weights(weight_fields, seed=i), weight_fields)
        torch.save(state, snapshot / "checkpoints" / f"{stem}_checkpoint_{label}.pth")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo
