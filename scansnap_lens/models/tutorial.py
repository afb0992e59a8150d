"""The authors' WikiText model: the PyTorch transformer tutorial's language model, hooked.

Scan and Snap's real-text figures (Figs. 7, 10) train the model of PyTorch's "language
modeling with nn.Transformer" tutorial: embeddings scaled by sqrt(d_model) plus sinusoidal
positions, post-LN encoder layers (attention, then a ReLU feed-forward) under a causal mask,
dropout, and an untied linear decoder.  TransformerLens's own models are pre-LN with learned
positions, so `tutorial_model` builds it as a TransformerBridge over Hugging Face's GPT-1
(``OpenAIGPTLMHeadModel``), the one post-LN causal architecture both TransformerLens majors
bridge, reshaped into the tutorial's model:

- the feed-forward width is `d_mlp` (GPT-1 fixes 4 d_model);
- the token embedding is multiplied by sqrt(d_model) in its forward pass;
- positions are the tutorial's sinusoids, frozen;
- the decoder is a separate linear layer with a bias;
- every weight is drawn as the tutorial draws it: embedding and decoder uniform in
  [-0.1, 0.1], decoder bias 0, and each layer as ``nn.TransformerEncoderLayer`` initialises
  itself (Xavier-uniform attention projections, PyTorch's default linear layers).

Two differences remain, both in where dropout acts: GPT-1 has no dropout between the
feed-forward's two linear layers (the tutorial's layer has one), and the tutorial's
positional dropout and GPT-1's embedding dropout sit at the same place.

>>> model = tutorial_model(vocab_size=50, n_ctx=8, d_model=16, d_mlp=16)
>>> model.cfg.n_heads, model.cfg.d_head, model.cfg.d_mlp
(1, 16, 16)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["FIRST_FEED_FORWARD", "sinusoidal_positions", "tutorial_model"]

# The tutorial trains the first feed-forward layer at twice the rate of the rest (lr 10 for
# lr 5); this pattern names its parameters in the bridge's state dict (`train(lr_by_name=)`).
FIRST_FEED_FORWARD = r"mlp\.(in|c_fc)(\._original_component)?\.(weight|bias)$"


def sinusoidal_positions(n_ctx: int, d_model: int) -> Tensor:
    """[T, D] the tutorial's (and "Attention is all you need"'s) positional encoding:
    sin on even dimensions, cos on odd ones, wavelengths from 2 pi to 10000 * 2 pi.

    >>> pe = sinusoidal_positions(4, 6)
    >>> pe[0].tolist()
    [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    """
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(1e4) / d_model))
    pe = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * rate)
    pe[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
    return pe.float()


class ScaledEmbedding(nn.Embedding):
    """An embedding whose output is multiplied by `scale` (the tutorial's sqrt(d_model))."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, input: Tensor) -> Tensor:
        return super().forward(input) * self.scale


def tutorial_model(
    vocab_size: int,
    n_layers: int = 1,
    d_model: int = 200,
    n_heads: int = 1,
    d_mlp: int = 200,
    n_ctx: int = 35,
    dropout: float = 0.3,
    seed: int = 0,
):
    """The tutorial's language model as a TransformerBridge (see the module docstring).

    Defaults are the authors' Fig. 7 model: embedding 200, 1 head, feed-forward 200, bptt 35,
    dropout 0.3 (0.2 for their 3-layer model).  Dropout is on in training mode only.
    """
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel
    from transformers.pytorch_utils import Conv1D

    from scansnap_lens.models.backend import hf_bridge

    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    config = OpenAIGPTConfig(
        vocab_size=vocab_size,
        n_positions=n_ctx,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        afn="relu",
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        layer_norm_epsilon=1e-5,  # nn.LayerNorm's, as in nn.TransformerEncoderLayer
        tie_word_embeddings=False,
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = OpenAIGPTLMHeadModel(config)
        body = hf.transformer
        body.tokens_embed = ScaledEmbedding(vocab_size, d_model, math.sqrt(d_model))
        hf.lm_head = nn.Linear(d_model, vocab_size, bias=True)
        with torch.no_grad():
            body.tokens_embed.weight.uniform_(-0.1, 0.1, generator=generator)
            hf.lm_head.weight.uniform_(-0.1, 0.1, generator=generator)
            hf.lm_head.bias.zero_()
            body.positions_embed.weight.copy_(sinusoidal_positions(n_ctx, d_model))
        body.positions_embed.weight.requires_grad_(False)
        for block in body.h:
            reference = nn.TransformerEncoderLayer(d_model, n_heads, d_mlp, dropout)
            block.mlp.c_fc, block.mlp.c_proj = Conv1D(d_mlp, d_model), Conv1D(d_model, d_mlp)
            _copy_layer(reference, block)
    model = hf_bridge(hf, name="pytorch-tutorial-transformer")
    model.cfg.d_mlp = d_mlp  # the bridge reads GPT-1's fixed 4 d_model from the config
    return model


def _copy_layer(layer: nn.TransformerEncoderLayer, block) -> None:
    """Copy an encoder layer's weights into a GPT-1 block (Conv1D weights are [in, out])."""
    attn = layer.self_attn
    pairs = [
        (block.attn.c_attn.weight, attn.in_proj_weight.T),  # columns q | k | v, as GPT-1 splits
        (block.attn.c_attn.bias, attn.in_proj_bias),
        (block.attn.c_proj.weight, attn.out_proj.weight.T),
        (block.attn.c_proj.bias, attn.out_proj.bias),
        (block.mlp.c_fc.weight, layer.linear1.weight.T),
        (block.mlp.c_fc.bias, layer.linear1.bias),
        (block.mlp.c_proj.weight, layer.linear2.weight.T),
        (block.mlp.c_proj.bias, layer.linear2.bias),
        (block.ln_1.weight, layer.norm1.weight),
        (block.ln_1.bias, layer.norm1.bias),
        (block.ln_2.weight, layer.norm2.weight),
        (block.ln_2.bias, layer.norm2.bias),
    ]
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)
